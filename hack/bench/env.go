package main

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// env holds the parts rows share and stops them at the end. Each part
// starts on first use, so a run of one row starts only what it needs.
// A row's own servers stop when the row ends: row b's nats-server with
// its 4096 consumers, left running, took a tenth of a core through row
// c and made its rounds noisier than the SDK's cost.
type env struct {
	o        options
	dir      string
	profiles string

	pgOnce sync.Once
	pg     *pgtest.Server
	pgErr  error

	stops    []func()
	rowStops []func()
}

func newEnv(o options) (*env, error) {
	dir, err := os.MkdirTemp("", "shardkeeper-bench-")
	if err != nil {
		return nil, fmt.Errorf("create work directory: %w", err)
	}
	e := &env{o: o, dir: dir, profiles: o.profiles}
	if e.profiles == "" {
		e.profiles = filepath.Join(os.TempDir(), fmt.Sprintf("shardkeeper-bench-profiles-%d", time.Now().Unix()))
	}
	if err := os.MkdirAll(e.profiles, 0o755); err != nil {
		return nil, fmt.Errorf("create profile directory: %w", err)
	}
	e.onStop(func() { os.RemoveAll(dir) })
	return e, nil
}

func (e *env) onStop(f func()) { e.stops = append(e.stops, f) }

// onRowEnd runs f when the current row ends.
func (e *env) onRowEnd(f func()) { e.rowStops = append(e.rowStops, f) }

// endRow stops what the row that just ended started.
func (e *env) endRow() {
	for i := len(e.rowStops) - 1; i >= 0; i-- {
		e.rowStops[i]()
	}
	e.rowStops = nil
}

func (e *env) close() {
	e.endRow()
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
}

// say logs progress on stderr, so stdout holds only the results.
func (e *env) say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// debug logs only with -v.
func (e *env) debug(format string, args ...any) {
	if e.o.verbose {
		e.say(format, args...)
	}
}

// database creates a fresh database on the shared PostgreSQL server.
func (e *env) database(ctx context.Context, name string) (dsn string, err error) {
	e.pgOnce.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		e.pg, e.pgErr = pgtest.Start(sctx)
		if e.pgErr == nil {
			e.onStop(e.pg.Stop)
		}
	})
	if e.pgErr != nil {
		return "", fmt.Errorf("start PostgreSQL: %w", e.pgErr)
	}
	return e.pg.NewDatabase(ctx, fmt.Sprintf("%s_%d", name, time.Now().UnixNano()))
}

// latencyProxy starts a proxy to dsn's server adding each way of latency,
// and returns it with the DSN that goes through it. It stops with the row.
func (e *env) latencyProxy(dsn string, each time.Duration) (*faultproxy.Proxy, string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("parse DSN: %w", err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		return nil, "", err
	}
	e.onRowEnd(func() { _ = p.Close() })
	p.SetLatency(each)
	u.Host = p.Addr()
	return p, u.String(), nil
}

// natsServer starts one nats-server process (the version the tests run as
// processes, built once by hack/nats-servers.sh) with JetStream, so its
// CPU is not in the benchmark process's profile. It stops with the row.
func (e *env) natsServer(name string) (*natstest.Proc, error) {
	bin, err := natstest.BinaryPath(natstest.Version214)
	if err != nil {
		return nil, err
	}
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.dir, name)
	cfg := natstest.ServerConfig{Name: name, Port: port, StoreDir: filepath.Join(dir, "store"),
		Extra: "max_payload: 8MB\n"}
	p, err := natstest.NewProc(bin, cfg, dir)
	if err != nil {
		return nil, err
	}
	if err := p.Start(30 * time.Second); err != nil {
		return nil, err
	}
	e.onRowEnd(func() { p.Stop(10 * time.Second) })
	return p, nil
}

// natsCluster starts n nats-server processes clustered under name and
// returns their client URLs and a function that stops them. Callers
// retry their first JetStream request until the meta leader is elected.
func (e *env) natsCluster(name string, n int) ([]string, func(), error) {
	bin, err := natstest.BinaryPath(natstest.Version214)
	if err != nil {
		return nil, nil, err
	}
	ports := make([]int, 2*n)
	for i := range ports {
		if ports[i], err = testbed.FreePort(); err != nil {
			return nil, nil, err
		}
	}
	var procs []*natstest.Proc
	stop := func() {
		for _, p := range procs {
			p.Stop(10 * time.Second)
		}
	}
	var urls []string
	for i := range n {
		cfg := natstest.ServerConfig{Name: fmt.Sprintf("%s-n%d", name, i+1), Port: ports[i], ClusterName: name,
			ClusterPort: ports[n+i], StoreDir: filepath.Join(e.dir, name, fmt.Sprintf("n%d", i+1))}
		for j := range n {
			if j != i {
				cfg.Routes = append(cfg.Routes, ports[n+j])
			}
		}
		p, err := natstest.NewProc(bin, cfg, filepath.Join(e.dir, name))
		if err != nil {
			stop()
			return nil, nil, err
		}
		procs = append(procs, p)
		urls = append(urls, p.URL())
	}
	errs := make(chan error, n)
	for _, p := range procs {
		// All at once: a lone cluster member waits for its routes.
		go func() { errs <- p.Start(30 * time.Second) }()
	}
	for range procs {
		if err := <-errs; err != nil {
			stop()
			return nil, nil, err
		}
	}
	if err := waitJetStream(urls); err != nil {
		stop()
		return nil, nil, err
	}
	return urls, stop, nil
}

// waitJetStream waits until the application account's JetStream answers
// through every server, which in a cluster means a meta leader is elected.
func waitJetStream(urls []string) error {
	for _, u := range urls {
		nc, err := nats.Connect(u, nats.UserInfo(natstest.AppUser, natstest.AppPassword))
		if err != nil {
			return fmt.Errorf("connect to %s: %w", u, err)
		}
		err = waitFor(context.Background(), time.Minute, func() (bool, error) {
			js, err := jetstream.New(nc)
			if err != nil {
				return false, err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err = js.AccountInfo(ctx)
			return err == nil, nil
		})
		nc.Close()
		if err != nil {
			return fmt.Errorf("JetStream through %s: %w", u, err)
		}
	}
	return nil
}

// appURL is a server's client URL with the application user.
func appURL(p *natstest.Proc) string {
	return natstest.UserURL(p.URL(), natstest.AppUser, natstest.AppPassword)
}

// profile is a CPU profile of this process, taken while a row runs.
type profile struct {
	path string
	f    *os.File
}

// startProfile starts profiling this process's CPU into the profile
// directory, under name.
func (e *env) startProfile(name string) (*profile, error) {
	path := filepath.Join(e.profiles, name+".pprof")
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("start CPU profile: %w", err)
	}
	return &profile{path: path, f: f}, nil
}

func (p *profile) stop() {
	pprof.StopCPUProfile()
	p.f.Close()
}

// top is `go tool pprof -top` of the profile, nodes lines, with extra
// pprof flags (such as -focus).
func (p *profile) top(nodes int, flags ...string) []string {
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", nodes)}, flags...)
	out, err := exec.Command("go", append(args, p.path)...).CombinedOutput()
	if err != nil {
		return []string{fmt.Sprintf("go tool pprof failed: %v: %s", err, out)}
	}
	var lines []string
	for l := range strings.SplitSeq(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") {
			continue
		}
		lines = append(lines, l)
	}
	return append([]string{"(" + p.path + ")"}, lines...)
}

// machine names the machine the run measured.
func machine() string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return fmt.Sprintf("%d cores (%s), load average %s", runtime.NumCPU(), model, load)
}
