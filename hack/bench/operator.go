package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// Row e: the operator's steady state. 10 ShardTopologies of 16 x 256
// units each, every unit claimed in a real PostgreSQL registry by members
// that renew and report activity (simMember), every unit consumer real
// on one nats-server process (R1, provisioned by the operator itself),
// and 10,000 unrelated Secrets in another namespace. The operator runs as
// its own process built from this tree, against an envtest API server;
// once every topology is Ready with all units owned, its RSS
// (/proc/<pid>/status VmRSS, every second) and its reconcile latency
// (controller_runtime_reconcile_time_seconds over the window) are read.
// The baseline is the same binary with the Secret cache it had before
// (every Secret of the cluster in a full informer), run alternately
// against the same objects.

const (
	opRounds  = 2
	opWindow  = 90 * time.Second
	rssGoal   = 128 << 20
	p99Goal   = 200 * time.Millisecond
	opReadyBy = 20 * time.Minute
)

// opVariant is one way of running the operator.
type opVariant struct {
	name string
	args []string
}

// opRun is what one run of a variant measured.
type opRun struct {
	variant    string
	ready      time.Duration
	rss        []int64
	p99        time.Duration
	p99Over    bool // p99 beyond the histogram's last finite bucket
	reconciles int
	heapTop    []string
	allocTop   []string
	cpuTop     []string
}

func runOperator(ctx context.Context, e *env) ([]result, error) {
	w, err := newOpWorld(ctx, e)
	if err != nil {
		return nil, err
	}
	defer w.close()
	bin, err := buildOperator(e)
	if err != nil {
		return nil, err
	}
	var runs []opRun
	for i := range opRounds {
		for j, v := range operatorVariants() {
			if i%2 == 1 {
				v = operatorVariants()[len(operatorVariants())-1-j]
			}
			r, err := w.measure(ctx, bin, v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			e.say("e: %s: ready in %s, RSS max %s, reconcile p99 %s over %d reconciles",
				v.name, ms(r.ready), mib(maxOf(r.rss)), ms(r.p99), r.reconciles)
			runs = append(runs, r)
		}
	}
	probe, err := w.probeCensus(ctx)
	if err != nil {
		return nil, err
	}
	return operatorResults(w, runs, probe), nil
}

// censusProbe is one census as the operator takes it for one topology,
// timed on its own, and the JSZ request inside it.
type censusProbe struct {
	took time.Duration
	jsz  jszProbe
}

// probeCensus takes topology 0's census the way the operator does (no
// account filter: the operator does not know the account its
// credentials belong to) once the operator is stopped.
func (w *opWorld) probeCensus(ctx context.Context) (censusProbe, error) {
	var p censusProbe
	sys, err := nats.Connect(w.natsURL, nats.UserInfo(natstest.SysUser, natstest.SysPassword))
	if err != nil {
		return p, fmt.Errorf("connect as the system user: %w", err)
	}
	defer sys.Close()
	l := natsops.Layout{SubjectPrefix: "t0", ConsumerName: "ingest", Partitions: opPartitions, Shards: opShards}
	if p.took, _, err = timeCensus(ctx, sys, natsops.CensusOptions{Consumers: l.Consumers()}); err != nil {
		return p, err
	}
	p.jsz, err = probeJSZ(ctx, sys, 1, `{"accounts":true,"streams":true,"consumer":true}`)
	return p, err
}

// buildOperator builds the operator from this tree.
func buildOperator(e *env) (string, error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(e.dir, "shardkeeper-operator")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the operator: %w: %s", err, out)
	}
	return bin, nil
}

// measure starts the operator, waits until every topology is Ready and
// owned, and reads its RSS and reconcile latency over the window.
func (w *opWorld) measure(ctx context.Context, bin string, v opVariant) (opRun, error) {
	r := opRun{variant: v.name}
	p, err := w.startOperator(bin, v)
	if err != nil {
		return r, err
	}
	defer p.stop()
	start := time.Now()
	if err := waitFor(ctx, opReadyBy, func() (bool, error) { return w.allReady(ctx, start) }); err != nil {
		return r, fmt.Errorf("wait for every topology to be Ready (log %s): %w", p.logPath, err)
	}
	r.ready = time.Since(start)
	before, err := p.reconcileHistogram()
	if err != nil {
		return r, err
	}
	half := int(opWindow.Seconds() / 2)
	cpu := p.profileAsync("cpu", fmt.Sprintf("/debug/pprof/profile?seconds=%d", half))
	allocs := p.profileAsync("allocs", fmt.Sprintf("/debug/pprof/allocs?seconds=%d", half))
	end := time.Now().Add(opWindow)
	for time.Now().Before(end) {
		rss, err := vmRSS(p.cmd.Process.Pid)
		if err != nil {
			return r, err
		}
		r.rss = append(r.rss, rss)
		if err := pause(ctx, time.Second); err != nil {
			return r, err
		}
	}
	after, err := p.reconcileHistogram()
	if err != nil {
		return r, err
	}
	delta := after.minus(before)
	r.p99, r.p99Over = delta.quantile(0.99)
	r.reconciles = int(delta.count)
	r.cpuTop = topOf(<-cpu, 20)
	r.allocTop = topOf(<-allocs, 12, "-sample_index=alloc_space")
	r.heapTop = topOf(p.profile("heap", "/debug/pprof/heap"), 20, "-sample_index=inuse_space")
	return r, nil
}

// allReady reports whether every topology is Ready with all units owned,
// in a status written by an operator started at start or later: its
// census is younger, and each operator takes one on its first reconcile.
func (w *opWorld) allReady(ctx context.Context, start time.Time) (bool, error) {
	var list topologyv1.ShardTopologyList
	if err := w.k.List(ctx, &list, client.InNamespace(opNamespace)); err != nil {
		return false, err
	}
	ready := 0
	for _, t := range list.Items {
		c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionReady)
		census := t.Status.Census
		if c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == t.Generation &&
			t.Status.Units != nil && t.Status.Units.Owned == opPartitions*opShards &&
			census != nil && census.ObservedAt != nil && !census.ObservedAt.Time.Before(start.Truncate(time.Second)) {
			ready++
		}
	}
	return ready == opTopologies, nil
}

// operatorProc is one running operator process.
type operatorProc struct {
	cmd         *exec.Cmd
	logPath     string
	metricsAddr string
	pprofAddr   string
	dir         string
}

func (w *opWorld) startOperator(bin string, v opVariant) (*operatorProc, error) {
	metrics, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	pprofPort, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	p := &operatorProc{metricsAddr: fmt.Sprintf("127.0.0.1:%d", metrics), pprofAddr: fmt.Sprintf("127.0.0.1:%d", pprofPort),
		dir: w.e.profiles, logPath: filepath.Join(w.e.dir, fmt.Sprintf("operator-%d.log", time.Now().UnixNano()))}
	logf, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--metrics-bind-address=" + p.metricsAddr, "--metrics-secure=false", "--health-probe-bind-address=0",
		"--pprof-bind-address=" + p.pprofAddr}, v.args...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+w.kubeconfig)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start the operator: %w", err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close() }()
	return p, nil
}

// stop ends the operator as Kubernetes would: SIGTERM, then SIGKILL.
func (p *operatorProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.cmd.Process.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = p.cmd.Process.Kill()
}

// profile saves one of the operator's pprof endpoints and returns the
// file ("" on failure).
func (p *operatorProc) profile(name, path string) string {
	c := http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Get("http://" + p.pprofAddr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	file := filepath.Join(p.dir, fmt.Sprintf("e-operator-%s-%d.pprof", name, time.Now().UnixNano()))
	f, err := os.Create(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.ReadFrom(resp.Body); err != nil {
		return ""
	}
	return file
}

func (p *operatorProc) profileAsync(name, path string) <-chan string {
	out := make(chan string, 1)
	go func() { out <- p.profile(name, path) }()
	return out
}

// topOf is `go tool pprof -top` of a saved profile.
func topOf(file string, nodes int, flags ...string) []string {
	if file == "" {
		return []string{"(no profile: the operator's pprof endpoint did not answer)"}
	}
	return (&profile{path: file}).top(nodes, flags...)
}

// vmRSS reads a process's resident set size.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read the operator's status: %w", err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

func maxOf(xs []int64) int64 {
	var m int64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// operatorVariants are the ways the operator is run, baseline first:
// every Secret in a full informer, as before the metadata-only watch, and
// the operator as it is.
func operatorVariants() []opVariant {
	return []opVariant{
		{name: "full Secret informer (before)", args: []string{"--full-secret-cache"}},
		{name: "metadata-only Secret watch (now)"},
	}
}

func operatorResults(w *opWorld, runs []opRun, probe censusProbe) []result {
	byVariant := map[string][]opRun{}
	for _, r := range runs {
		byVariant[r.variant] = append(byVariant[r.variant], r)
	}
	vs := operatorVariants()
	base, cur := byVariant[vs[0].name], byVariant[vs[len(vs)-1].name]
	rssOf := func(rs []opRun) int64 {
		var m []float64
		for _, r := range rs {
			m = append(m, float64(maxOf(r.rss)))
		}
		return int64(medianFloat(m))
	}
	p99Of := func(rs []opRun) time.Duration {
		var ds []time.Duration
		for _, r := range rs {
			ds = append(ds, r.p99)
		}
		return median(ds)
	}
	notes := []string{fmt.Sprintf("%d ShardTopologies of %d x %d units (R1 consumers on one nats-server, provisioned by the operator), every unit claimed in PostgreSQL by %d registry-level members per topology that renew and report activity (no pulling); %d unrelated Secrets of %d bytes in namespace %q; setup took %s",
		opTopologies, opPartitions, opShards, opMembers, opSecrets, opSecretBytes, opUnrelated, ms(w.setup)),
		fmt.Sprintf("each run: the operator process starts, every topology becomes Ready with all units owned, then %s of steady state: VmRSS every second (max reported), reconcile p99 from controller_runtime_reconcile_time_seconds over the window; runs alternate", opWindow)}
	for _, r := range runs {
		notes = append(notes, fmt.Sprintf("%s: ready after %s; RSS max %s, median %s; reconcile p99 %s over %d reconciles",
			r.variant, ms(r.ready), mib(maxOf(r.rss)), mib(medianRSS(r.rss)), p99String(r), r.reconciles))
	}
	rss := result{row: "e", what: "operator RSS, steady state, 10 x 4096 units + 10,000 Secrets",
		measured: mib(rssOf(cur)), baseline: mib(rssOf(base)) + " (" + vs[0].name + ")",
		ratio: fmt.Sprintf("%.2fx", float64(rssOf(cur))/float64(rssOf(base))), goal: "< 128 MiB",
		verdict: judge(rssOf(cur) < rssGoal), notes: notes}
	censusWhy := fmt.Sprintf("one topology's census, as the operator takes it, took %s on its own; its JSZ request returned %.1f MB after %s: every consumer of every account (%d), for each of the %d topologies, every census interval",
		ms(probe.took), float64(probe.jsz.bytes)/1e6, ms(probe.jsz.slowest), opTopologies*opPartitions*opShards, opTopologies)
	if rss.verdict == missed && len(cur) > 0 {
		last := cur[len(cur)-1]
		rss.why = []string{censusWhy, "the heap in use at the end of the window is far below the RSS; what the window allocated shows why (go tool pprof -top -sample_index=alloc_space over half the window), then the heap in use:"}
		rss.profile = append(append(last.allocTop, "--- in use (-sample_index=inuse_space):"), last.heapTop...)
	}
	lat := result{row: "e", what: "operator reconcile p99, same runs",
		measured: ms(p99Of(cur)), baseline: ms(p99Of(base)) + " (" + vs[0].name + ")",
		ratio: fmt.Sprintf("%.2fx", float64(p99Of(cur))/float64(p99Of(base))), goal: "< 200ms",
		verdict: judge(p99Of(cur) < p99Goal && !anyOver(cur))}
	if lat.verdict == missed && len(cur) > 0 {
		lat.why = []string{censusWhy, "the operator's CPU over half the window (go tool pprof -top):"}
		lat.profile = cur[len(cur)-1].cpuTop
	}
	return []result{rss, lat}
}

func medianRSS(xs []int64) int64 {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return int64(medianFloat(f))
}

func anyOver(rs []opRun) bool {
	for _, r := range rs {
		if r.p99Over {
			return true
		}
	}
	return false
}

func p99String(r opRun) string {
	if r.p99Over {
		return "> " + ms(r.p99)
	}
	return ms(r.p99)
}
