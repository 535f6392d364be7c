// Package natstest starts NATS JetStream servers for tests, each with an
// application account and a system account user, on random loopback ports
// with temporary storage:
//
//   - in-process servers from github.com/nats-io/nats-server/v2 (StartCluster,
//     StartClusterWith), alone or clustered, optionally leafnode hubs or
//     leaves (ServerConfig.LeafPort, LeafRemotes);
//   - separate server processes of any released version (StartProcCluster),
//     so a cluster can mix 2.12 with 2.14 as a rolling upgrade does. Binary
//     builds each version once per machine with hack/nats-servers.sh and
//     caches it outside the clone. A process dies with the test binary
//     (parent-death signal on Linux) and its log survives it, panics
//     included.
//
// It owns server lifecycles and connection helpers; what is provisioned on
// the servers belongs to internal/natsops and its tests.
package natstest

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// Cluster is a set of in-process servers forming one JetStream cluster (or
// a single server when it has one member).
type Cluster struct {
	Name    string
	Servers []*server.Server
	Configs []ServerConfig

	tb  testing.TB
	dir string
}

// StartCluster starts n in-process servers (n = 1 gives a lone server
// without a cluster block), waits until JetStream answers, and shuts them
// down when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	return StartClusterWith(tb, n, nil)
}

// StartClusterWith is StartCluster with a hook that adjusts each server's
// configuration before it starts: leafnode ports and remotes, domains.
func StartClusterWith(tb testing.TB, n int, adjust func(i int, cfg *ServerConfig)) *Cluster {
	tb.Helper()
	c := &Cluster{Name: clusterName(), tb: tb, dir: tb.TempDir()}
	c.Configs = Configs(tb, c.Name, c.dir, n)
	if adjust != nil {
		for i := range c.Configs {
			adjust(i, &c.Configs[i])
		}
	}
	for _, cfg := range c.Configs {
		c.Servers = append(c.Servers, startServer(tb, cfg, c.dir))
	}
	tb.Cleanup(c.Shutdown)
	c.WaitJetStream(30 * time.Second)
	if n > 1 {
		c.waitSystemAccount(30 * time.Second)
	}
	return c
}

var clusterSeq atomic.Int64

// clusterName is unique within the test binary and across quick reruns.
func clusterName() string {
	return "C" + strings.ToUpper(fmt.Sprintf("%x", (time.Now().UnixNano()+clusterSeq.Add(1))&0xffffff))
}

// Configs returns the configurations of an n-server cluster named name,
// with free ports and stores under dir.
func Configs(tb testing.TB, name, dir string, n int) []ServerConfig {
	tb.Helper()
	cfgs, err := buildConfigs(name, dir, n)
	if err != nil {
		tb.Fatal(err)
	}
	return cfgs
}

func buildConfigs(name, dir string, n int) ([]ServerConfig, error) {
	ports := make([]int, 2*n)
	for i := range ports {
		p, err := testbed.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	cfgs := make([]ServerConfig, n)
	for i := range n {
		cfgs[i] = ServerConfig{
			Name:     fmt.Sprintf("%s-n%d", name, i+1),
			Port:     ports[i],
			StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
		}
		if n > 1 {
			cfgs[i].ClusterName = name
			cfgs[i].ClusterPort = ports[n+i]
			for j := range n {
				if j != i {
					cfgs[i].Routes = append(cfgs[i].Routes, ports[n+j])
				}
			}
		}
	}
	return cfgs, nil
}

func freePort(tb testing.TB) int {
	tb.Helper()
	p, err := testbed.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// startServer writes cfg to a file, loads it the way nats-server does and
// starts the server in this process.
func startServer(tb testing.TB, cfg ServerConfig, dir string) *server.Server {
	tb.Helper()
	s, err := runServer(cfg, dir)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func runServer(cfg ServerConfig, dir string) (*server.Server, error) {
	path := filepath.Join(dir, cfg.Name+".conf")
	if err := os.WriteFile(path, []byte(cfg.Render()), 0o600); err != nil {
		return nil, err
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("create server %s: %w", cfg.Name, err)
	}
	go s.Start()
	// A bound for a server that will not start, not a measure of how fast
	// it does: a cold make test beside heavy builds saw one take over 20 s.
	if !s.ReadyForConnections(time.Minute) {
		s.Shutdown()
		return nil, fmt.Errorf("server %s not ready for connections", cfg.Name)
	}
	return s, nil
}

// Start starts an n-server cluster outside a test (the demo), with stores
// under dir. Call Shutdown when done. Connect and the other helpers that
// fail a test are for clusters from StartCluster only.
func Start(dir string, n int) (*Cluster, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{Name: clusterName(), dir: dir}
	cfgs, err := buildConfigs(c.Name, dir, n)
	if err != nil {
		return nil, err
	}
	c.Configs = cfgs
	for _, cfg := range c.Configs {
		s, err := runServer(cfg, dir)
		if err != nil {
			c.Shutdown()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !c.jetStreamReady() {
		if time.Now().After(deadline) {
			c.Shutdown()
			return nil, fmt.Errorf("JetStream of cluster %s not ready within 30s", c.Name)
		}
		time.Sleep(25 * time.Millisecond)
	}
	return c, nil
}

// URLs are the client URLs of every server, without credentials.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.Configs))
	for i, cfg := range c.Configs {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", cfg.Port)
	}
	return urls
}

// URL is every server's client URL joined with commas, as nats.Connect
// takes them.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Connect connects as the application user to server i (all servers when i
// is negative) and closes the connection when the test ends.
func (c *Cluster) Connect(i int, opts ...nats.Option) *nats.Conn {
	return c.connect(i, AppUser, AppPassword, opts)
}

// ConnectSys connects as the system account user.
func (c *Cluster) ConnectSys(i int, opts ...nats.Option) *nats.Conn {
	return c.connect(i, SysUser, SysPassword, opts)
}

func (c *Cluster) connect(i int, user, pass string, opts []nats.Option) *nats.Conn {
	c.tb.Helper()
	u := c.URL()
	if i >= 0 {
		u = c.URLs()[i]
	}
	return connectURL(c.tb, u, user, pass, opts)
}

// ConnectURL connects to u (one URL or several, comma-separated) as user
// and closes the connection when tb ends. Tests whose subtests share a
// cluster connect through it, so a failure is the subtest's.
func ConnectURL(tb testing.TB, u, user, pass string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connectURL(tb, u, user, pass, opts)
}

func connectURL(tb testing.TB, u, user, pass string, opts []nats.Option) *nats.Conn {
	tb.Helper()
	opts = append([]nats.Option{nats.UserInfo(user, pass), nats.Name(tb.Name())}, opts...)
	nc, err := nats.Connect(u, opts...)
	if err != nil {
		tb.Fatalf("connect as %s to %s: %v", user, u, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// UserURL returns server i's URL with user and password embedded, for
// programs that take only a URL.
func UserURL(raw, user, pass string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.User = url.UserPassword(user, pass)
	return u.String()
}

// WaitJetStream waits until every server's JetStream is enabled and, in a
// cluster, a meta leader is elected and known to all.
func (c *Cluster) WaitJetStream(timeout time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c.jetStreamReady() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	c.tb.Fatalf("JetStream of cluster %s not ready within %s", c.Name, timeout)
}

func (c *Cluster) jetStreamReady() bool {
	if len(c.Servers) == 1 {
		return c.Configs[0].NoJetStream || c.Servers[0].JetStreamEnabled()
	}
	leaders, js := 0, 0
	for i, s := range c.Servers {
		if s == nil || !s.Running() || c.Configs[i].NoJetStream {
			continue
		}
		js++
		if !s.JetStreamEnabled() {
			return false
		}
		if s.JetStreamIsLeader() {
			leaders++
		}
		if !s.JetStreamIsCurrent() {
			return false
		}
	}
	return js == 0 || leaders == 1
}

// waitSystemAccount waits until every running server answers a STATSZ
// ping and counts every running server as active. JetStream can be ready
// before the system account has heard from every server; a census then
// (natsops.TakeCensus) stops after the first reply, which counts only the
// server that sent it, and finds the others silent (a CI run failed
// TestCensusOfASingleVersionClusterPasses that way).
func (c *Cluster) waitSystemAccount(timeout time.Duration) {
	c.tb.Helper()
	var running []string
	first := -1
	for i, s := range c.Servers {
		if s != nil && s.Running() {
			running = append(running, c.Configs[i].Name)
			if first < 0 {
				first = i
			}
		}
	}
	nc := c.ConnectSys(first)
	defer nc.Close()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if last = systemAccountMissing(nc, running); last == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("system account of cluster %s not complete within %s: %s", c.Name, timeout, last)
}

// systemAccountMissing pings every server for STATSZ and says what is
// missing: a running server that did not answer within a second, or one
// that counts fewer active servers than run; "" when nothing is.
func systemAccountMissing(nc *nats.Conn, running []string) string {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err.Error()
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.STATSZ", inbox, nil); err != nil {
		return err.Error()
	}
	active := map[string]int{}
	waiting := map[string]bool{}
	for _, name := range running {
		waiting[name] = true
	}
	for len(waiting) > 0 {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			break
		}
		var r statsz
		if json.Unmarshal(m.Data, &r) == nil {
			active[r.Server.Name] = r.Stats.ActiveServers
			delete(waiting, r.Server.Name)
		}
	}
	for _, name := range running {
		n, ok := active[name]
		switch {
		case !ok:
			return name + " did not answer"
		case n < len(running):
			return fmt.Sprintf("%s counts %d active servers of %d", name, n, len(running))
		}
	}
	return ""
}

// Shutdown stops every running server.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		if s != nil {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
}

// Restart stops server i and starts it again with the same configuration
// and store, then waits for JetStream.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.Servers[i].Shutdown()
	c.Servers[i].WaitForShutdown()
	c.Servers[i] = startServer(c.tb, c.Configs[i], c.dir)
	c.WaitJetStream(30 * time.Second)
}

// LeafURLs are the leafnode URLs of every server that listens for leaves
// (StartClusterWith with ServerConfig.LeafPort), logging in as user.
func (c *Cluster) LeafURLs(user, pass string) []string {
	var urls []string
	for _, cfg := range c.Configs {
		if cfg.LeafPort != 0 {
			urls = append(urls, LeafURL(cfg.LeafPort, user, pass))
		}
	}
	return urls
}

// WithLeafPorts is a StartClusterWith hook that makes every server a
// leafnode hub on a free port.
func WithLeafPorts(tb testing.TB) func(int, *ServerConfig) {
	return func(_ int, cfg *ServerConfig) { cfg.LeafPort = freePort(tb) }
}
