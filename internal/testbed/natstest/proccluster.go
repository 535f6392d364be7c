package natstest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// ProcCluster is a JetStream cluster of separate server processes, each
// from its own binary, so versions can be mixed (2.12 with 2.14).
type ProcCluster struct {
	Name    string
	Procs   []*Proc
	Configs []ServerConfig

	tb  testing.TB
	dir string
}

// StartProcCluster starts one server process per binary, clustered when
// there is more than one, waits until every server answers the system
// account and agrees on a JetStream meta leader that knows all peers, and
// kills them when the test ends.
func StartProcCluster(tb testing.TB, binaries ...string) *ProcCluster {
	tb.Helper()
	return StartProcClusterWith(tb, nil, binaries...)
}

// StartProcClusterWith is StartProcCluster with a hook that adjusts each
// server's configuration before it starts. Ports are picked free a moment
// before the servers bind them (testbed.FreePort), so another process can
// take one in between: when a server finds its port taken, the cluster
// starts again on other ports (adjust runs again too), up to three times.
func StartProcClusterWith(tb testing.TB, adjust func(i int, cfg *ServerConfig), binaries ...string) *ProcCluster {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		c, err := startProcCluster(tb, adjust, binaries)
		if err == nil {
			c.WaitJetStream(60 * time.Second)
			return c
		}
		c.Shutdown()
		taken := portTaken(err)
		if attempt == 3 || taken == "" {
			tb.Fatal(err)
		}
		tb.Logf("natstest: a port was taken before its server bound it, starting the cluster again on other ports: %s", taken)
	}
}

// startProcCluster configures and starts one attempt's processes.
func startProcCluster(tb testing.TB, adjust func(i int, cfg *ServerConfig), binaries []string) (*ProcCluster, error) {
	c := &ProcCluster{Name: clusterName(), tb: tb, dir: tb.TempDir()}
	c.Configs = Configs(tb, c.Name, c.dir, len(binaries))
	for i := range c.Configs {
		if adjust != nil {
			adjust(i, &c.Configs[i])
		}
	}
	for i, bin := range binaries {
		p, err := NewProc(bin, c.Configs[i], filepath.Join(c.dir, "procs"))
		if err != nil {
			return c, err
		}
		tb.Cleanup(p.Kill)
		c.Procs = append(c.Procs, p)
	}
	// Start all before waiting for any: a lone cluster member waits for
	// its routes.
	errs := make(chan error, len(c.Procs))
	for _, p := range c.Procs {
		go func() { errs <- p.Start(30 * time.Second) }()
	}
	var first error
	for range c.Procs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return c, first
}

// portTaken is the line of a server's start error that says its port was
// taken, or "" when the error is something else.
func portTaken(err error) string {
	for line := range strings.Lines(err.Error()) {
		if strings.Contains(line, "address already in use") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// URLs are the client URLs of every server, without credentials.
func (c *ProcCluster) URLs() []string {
	urls := make([]string, len(c.Procs))
	for i, p := range c.Procs {
		urls[i] = p.URL()
	}
	return urls
}

// URL is every server's client URL joined with commas.
func (c *ProcCluster) URL() string { return strings.Join(c.URLs(), ",") }

// Connect connects as the application user to server i (all servers when i
// is negative) and closes the connection when the test ends.
func (c *ProcCluster) Connect(i int, opts ...nats.Option) *nats.Conn {
	c.tb.Helper()
	return connectURL(c.tb, c.url(i), AppUser, AppPassword, opts)
}

// ConnectSys connects as the system account user.
func (c *ProcCluster) ConnectSys(i int, opts ...nats.Option) *nats.Conn {
	c.tb.Helper()
	return connectURL(c.tb, c.url(i), SysUser, SysPassword, opts)
}

func (c *ProcCluster) url(i int) string {
	if i < 0 {
		return c.URL()
	}
	return c.URLs()[i]
}

// Restart stops server i (SIGTERM, then SIGKILL), starts it again with the
// same configuration and store, and waits for JetStream.
func (c *ProcCluster) Restart(i int) {
	c.tb.Helper()
	c.Procs[i].Stop(10 * time.Second)
	if err := c.Procs[i].Start(30 * time.Second); err != nil {
		c.tb.Fatal(err)
	}
	c.WaitJetStream(60 * time.Second)
}

// Shutdown kills every server.
func (c *ProcCluster) Shutdown() {
	for _, p := range c.Procs {
		p.Kill()
	}
}

// WaitJetStream waits until every running server answers a system-account
// ping naming the same meta leader, and the leader reports every other
// running server as a current peer it places assets on.
func (c *ProcCluster) WaitJetStream(timeout time.Duration) {
	c.tb.Helper()
	if err := c.Ready(timeout); err != nil {
		c.tb.Fatal(err)
	}
}

// Ready is WaitJetStream returning an error instead of failing the test
// that started the cluster, for callers in other goroutines or subtests
// (a test that kills and restarts a server while others watch).
func (c *ProcCluster) Ready(timeout time.Duration) error {
	var running []string
	for i, p := range c.Procs {
		if p.Running() && !c.Configs[i].NoJetStream {
			running = append(running, c.Configs[i].Name)
		}
	}
	if len(running) == 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, why := c.jetStreamReady(running)
		if ok {
			return nil
		}
		last = why
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("JetStream of process cluster %s not ready within %s: %s", c.Name, timeout, last)
}

// statsz is the part of a $SYS.REQ.SERVER.PING.STATSZ reply readiness
// needs.
type statsz struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Stats struct {
		ActiveServers int `json:"active_servers"`
		JetStream     *struct {
			Meta *struct {
				Leader   string `json:"leader"`
				Replicas []struct {
					Name    string `json:"name"`
					Current bool   `json:"current"`
					Offline bool   `json:"offline"`
				} `json:"replicas"`
			} `json:"meta"`
		} `json:"jetstream"`
	} `json:"statsz"`
}

func (c *ProcCluster) jetStreamReady(running []string) (bool, string) {
	var url string
	for i, p := range c.Procs {
		if p.Running() {
			url = c.URLs()[i]
			break
		}
	}
	nc, err := nats.Connect(url, nats.UserInfo(SysUser, SysPassword), nats.Timeout(time.Second))
	if err != nil {
		return false, err.Error()
	}
	defer nc.Close()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return false, err.Error()
	}
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.STATSZ", inbox, nil); err != nil {
		return false, err.Error()
	}
	replies := map[string]statsz{}
	for len(replies) < len(running) {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			return false, fmt.Sprintf("%d of %d servers answered", len(replies), len(running))
		}
		var r statsz
		if json.Unmarshal(m.Data, &r) == nil {
			replies[r.Server.Name] = r
		}
	}
	leader := ""
	for _, name := range running {
		r, ok := replies[name]
		if !ok {
			return false, name + " did not answer"
		}
		js := r.Stats.JetStream
		if js == nil || js.Meta == nil || js.Meta.Leader == "" {
			if len(running) == 1 && len(c.Procs) == 1 && js != nil {
				return true, ""
			}
			return false, name + " knows no meta leader"
		}
		if leader != "" && js.Meta.Leader != leader {
			return false, "servers disagree on the meta leader"
		}
		leader = js.Meta.Leader
	}
	lr, ok := replies[leader]
	if !ok {
		return false, "meta leader " + leader + " did not answer"
	}
	current := map[string]bool{leader: true}
	for _, p := range lr.Stats.JetStream.Meta.Replicas {
		// Offline is the leader's placement view: a current raft peer
		// it still thinks offline refuses stream placement ("no
		// suitable peers").
		if p.Current && !p.Offline {
			current[p.Name] = true
		}
	}
	for _, name := range running {
		if !current[name] {
			return false, name + " is not a current meta peer"
		}
	}
	return true, ""
}

// LeafURLs are the leafnode URLs of every server that listens for leaves,
// logging in as user.
func (c *ProcCluster) LeafURLs(user, pass string) []string {
	var urls []string
	for _, cfg := range c.Configs {
		if cfg.LeafPort != 0 {
			urls = append(urls, LeafURL(cfg.LeafPort, user, pass))
		}
	}
	return urls
}
