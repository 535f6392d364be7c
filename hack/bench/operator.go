package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
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

// Rows e and e2: the operator's steady state. Topologies of a shape
// (opShape), every unit claimed in a real PostgreSQL registry by members
// that renew and report activity (simMember), every unit consumer real on
// one nats-server process (R1, provisioned by the operator itself), and
// unrelated Secrets in another namespace. The operator runs as its own
// process built from this tree, against an envtest API server; once every
// topology it watches is Ready with all units owned, its RSS
// (/proc/<pid>/status VmRSS, every second), its reconcile latency
// (controller_runtime_reconcile_time_seconds over the window; the row's
// p99 is of a variant's runs' reconciles together) and the bytes NATS
// sent its connections (CONNZ, before and after the window) are read. Each row's baseline variant is run alternately against the
// same objects: for e, the Secret cache the operator had before; for e2,
// the operator watching 10 of the 100 topologies.

const (
	opRounds  = 2
	opWindow  = 90 * time.Second
	p99Goal   = 200 * time.Millisecond
	opReadyBy = 20 * time.Minute
)

// opVariant is one way of running the operator.
type opVariant struct {
	name string
	args []string
	// watchesOnly is the one namespace this variant's operator watches;
	// empty: every namespace.
	watchesOnly string
}

// opRun is what one run of a variant measured.
type opRun struct {
	variant    string
	ready      time.Duration
	rss        []int64
	p99        time.Duration
	p99Over    bool // p99 beyond the histogram's last finite bucket
	mean       time.Duration
	reconciles int
	// latency is the window's reconcile times, as the histogram counted.
	latency histogram
	// steps are the reconcile's steps over the window, slowest p99 first.
	steps []stepTime
	// traffic is what NATS sent the operator's connections over the
	// window, by connection role.
	traffic  map[string]int64
	heapTop  []string
	allocTop []string
	cpuTop   []string
}

func runOperator(ctx context.Context, e *env) ([]result, error) {
	return runSteady(ctx, e, shapeE)
}

func runOperatorMany(ctx context.Context, e *env) ([]result, error) {
	return runSteady(ctx, e, shapeE2)
}

func runSteady(ctx context.Context, e *env, sh opShape) ([]result, error) {
	w, err := newOpWorld(ctx, e, sh)
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
		for _, v := range roundOrder(sh, i) {
			r, err := w.measure(ctx, bin, v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			e.say("%s: %s: ready in %s, RSS max %s, reconcile p99 %s over %d reconciles, NATS sent %v",
				sh.row, v.name, ms(r.ready), mib(maxOf(r.rss)), ms(r.p99), r.reconciles, r.traffic)
			runs = append(runs, r)
		}
	}
	probe, err := w.probeCensus(ctx)
	if err != nil {
		return nil, err
	}
	return operatorResults(w, runs, probe), nil
}

// roundOrder is the order the variants run in round i: alternating, the
// first round starting with the variant that provisions every topology.
func roundOrder(sh opShape, i int) []opVariant {
	first := sh.variants[sh.provisionFirst]
	var rest []opVariant
	for j, v := range sh.variants {
		if j != sh.provisionFirst {
			rest = append(rest, v)
		}
	}
	order := append([]opVariant{first}, rest...)
	if i%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// censusProbe is one census as the operator takes it for one topology,
// timed on its own, what it read, and for comparison the JSZ of every
// consumer of every account that the census read before issue 23.
type censusProbe struct {
	took time.Duration
	read natsops.CensusRead
	jsz  jszProbe
}

// probeCensus takes topology 0's census the way the operator does (its
// streams' consumer listings through the application connection, the
// system pings through the system user) once the operator is stopped.
func (w *opWorld) probeCensus(ctx context.Context) (censusProbe, error) {
	var p censusProbe
	sys, err := nats.Connect(w.natsURL, nats.UserInfo(natstest.SysUser, natstest.SysPassword))
	if err != nil {
		return p, fmt.Errorf("connect as the system user: %w", err)
	}
	defer sys.Close()
	app, err := nats.Connect(w.natsURL, nats.UserInfo(natstest.AppUser, natstest.AppPassword))
	if err != nil {
		return p, fmt.Errorf("connect as the application user: %w", err)
	}
	defer app.Close()
	l := natsops.Layout{SubjectPrefix: "t0", ConsumerName: "ingest", Partitions: w.sh.partitions, Shards: w.sh.shards}
	took, c, err := timeCensus(ctx, sys, natsops.CensusOptions{JetStream: app, Consumers: l.Consumers()})
	if err != nil {
		return p, err
	}
	p.took, p.read = took, c.Read
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
	if err := waitFor(ctx, opReadyBy, func() (bool, error) { return w.allReady(ctx, start, v) }); err != nil {
		return r, fmt.Errorf("wait for every topology to be Ready (log %s): %w", p.logPath, err)
	}
	r.ready = time.Since(start)
	before, err := p.reconcileHistogram()
	if err != nil {
		return r, err
	}
	stepsBefore, err := p.stepHistograms()
	if err != nil {
		return r, err
	}
	sentBefore, err := w.operatorTraffic(ctx)
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
	stepsAfter, err := p.stepHistograms()
	if err != nil {
		return r, err
	}
	r.steps = stepTimes(stepsBefore, stepsAfter)
	sentAfter, err := w.operatorTraffic(ctx)
	if err != nil {
		return r, err
	}
	r.traffic = map[string]int64{}
	for role, n := range sentAfter {
		r.traffic[role] = n - sentBefore[role]
	}
	delta := after.minus(before)
	r.latency = delta
	r.p99, r.p99Over = delta.quantile(0.99)
	r.reconciles = int(delta.count)
	r.mean = delta.mean()
	r.cpuTop = topOf(<-cpu, 20)
	r.allocTop = topOf(<-allocs, 12, "-sample_index=alloc_space")
	r.heapTop = topOf(p.profile("heap", "/debug/pprof/heap"), 20, "-sample_index=inuse_space")
	return r, nil
}

// allReady reports whether every topology v watches is Ready with all
// units owned, in a status written by an operator started at start or
// later: its census is younger, and each operator takes one on its first
// reconcile.
func (w *opWorld) allReady(ctx context.Context, start time.Time, v opVariant) (bool, error) {
	var list topologyv1.ShardTopologyList
	var opts []client.ListOption
	want := w.sh.topologies
	if v.watchesOnly != "" {
		opts, want = append(opts, client.InNamespace(v.watchesOnly)), w.sh.watched
	}
	if err := w.k.List(ctx, &list, opts...); err != nil {
		return false, err
	}
	ready := 0
	for _, t := range list.Items {
		c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionReady)
		census := t.Status.Census
		if c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == t.Generation &&
			t.Status.Units != nil && int(t.Status.Units.Owned) == w.sh.partitions*w.sh.shards &&
			census != nil && census.ObservedAt != nil && !census.ObservedAt.Time.Before(start.Truncate(time.Second)) {
			ready++
		}
	}
	return ready == want, nil
}

// operatorTraffic is how many bytes the NATS server has sent the
// operator's connections so far, by the role in their names ("streams",
// "system"), from the server's CONNZ asked through the system account.
func (w *opWorld) operatorTraffic(ctx context.Context) (map[string]int64, error) {
	sys, err := nats.Connect(w.natsURL, nats.UserInfo(natstest.SysUser, natstest.SysPassword))
	if err != nil {
		return nil, fmt.Errorf("connect as the system user: %w", err)
	}
	defer sys.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := sys.RequestWithContext(rctx, "$SYS.REQ.SERVER.PING.CONNZ", []byte(`{"limit":100000}`))
	if err != nil {
		return nil, fmt.Errorf("CONNZ: %w", err)
	}
	var reply struct {
		Data struct {
			Conns []struct {
				Name     string `json:"name"`
				OutBytes int64  `json:"out_bytes"`
			} `json:"connections"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("decode CONNZ: %w", err)
	}
	if reply.Error != nil {
		return nil, fmt.Errorf("CONNZ: %s", reply.Error.Description)
	}
	out := map[string]int64{}
	for _, c := range reply.Data.Conns {
		name, ok := strings.CutPrefix(c.Name, "shardkeeper-operator ")
		if !ok {
			continue
		}
		role := "other"
		if i := strings.LastIndex(name, "("); i >= 0 {
			role = strings.TrimSuffix(name[i+1:], ")")
		}
		out[role] += c.OutBytes
	}
	return out, nil
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

func operatorResults(w *opWorld, runs []opRun, probe censusProbe) []result {
	sh := w.sh
	byVariant := map[string][]opRun{}
	for _, r := range runs {
		byVariant[r.variant] = append(byVariant[r.variant], r)
	}
	vs := sh.variants
	base, cur := byVariant[vs[0].name], byVariant[vs[len(vs)-1].name]
	rssOf := func(rs []opRun) int64 {
		var m []float64
		for _, r := range rs {
			m = append(m, float64(maxOf(r.rss)))
		}
		return int64(medianFloat(m))
	}
	// p99Of is the p99 of every reconcile of the runs, pooled: one run's
	// 60 reconciles make its "p99" the slowest or next to it, so the
	// worse of two such maxima said more about one stall than about the
	// 99th percentile. Each run's own p99 is in the notes.
	p99Of := func(rs []opRun) (time.Duration, bool) {
		var h histogram
		for _, r := range rs {
			h = h.plus(r.latency)
		}
		return h.quantile(0.99)
	}
	// trafficPer30s is the median bytes NATS sent the operator's
	// connections (the census's system pings and its streams' listings,
	// and the stream connections' provisioning reads) per 30 s of a window.
	trafficPer30s := func(rs []opRun) int64 {
		var m []float64
		for _, r := range rs {
			var n int64
			for _, b := range r.traffic {
				n += b
			}
			m = append(m, float64(n)*float64(30*time.Second)/float64(opWindow))
		}
		return int64(medianFloat(m))
	}
	notes := []string{fmt.Sprintf("%d ShardTopologies of %d x %d units (R1 consumers on one nats-server, provisioned by the operator), every unit claimed in PostgreSQL by %d registry-level members per topology that renew and report activity (no pulling); %d unrelated Secrets of %d bytes in namespace %q; setup took %s",
		sh.topologies, sh.partitions, sh.shards, sh.members, sh.secrets, sh.secretBytes, opUnrelated, ms(w.setup)),
		fmt.Sprintf("each run: the operator process starts, every topology it watches becomes Ready with all units owned, then %s of steady state: VmRSS every second (max reported), reconcile p99 from controller_runtime_reconcile_time_seconds over the window (the row's p99 pools a variant's runs), bytes NATS sent its connections (CONNZ out_bytes, by the role in the connection's name); runs alternate", opWindow)}
	for _, r := range runs {
		notes = append(notes, fmt.Sprintf("%s: ready after %s; RSS max %s, median %s; reconcile p99 %s (mean %s) over %d reconciles (steps by p99: %s); NATS sent %s to its census connections and %s to its stream connections over the window",
			r.variant, ms(r.ready), mib(maxOf(r.rss)), mib(medianRSS(r.rss)), p99String(r), ms(r.mean), r.reconciles, stepsString(r.steps, 4), mib(r.traffic["system"]), mib(r.traffic["streams"])))
	}
	rss := result{row: sh.row, what: "operator RSS, steady state, " + sh.what,
		measured: mib(rssOf(cur)), baseline: mib(rssOf(base)) + " (" + vs[0].name + ")",
		ratio: fmt.Sprintf("%.2fx", float64(rssOf(cur))/float64(rssOf(base))), goal: "< " + mib(sh.rssGoal),
		verdict: judge(rssOf(cur) < sh.rssGoal), notes: notes}
	censusWhy := fmt.Sprintf("one topology's census, as the operator takes it, took %s on its own beside %d consumers in all and read %d replies, %.1f KB, %d consumer entries; a JSZ of every consumer of every account (the census before issue 23) returns %.1f MB after %s",
		ms(probe.took), sh.topologies*sh.partitions*sh.shards, probe.read.Replies, float64(probe.read.Bytes)/1e3, probe.read.Consumers, float64(probe.jsz.bytes)/1e6, ms(probe.jsz.slowest))
	if rss.verdict == missed && len(cur) > 0 {
		last := cur[len(cur)-1]
		rss.why = []string{censusWhy, "the heap in use at the end of the window is far below the RSS; what the window allocated shows why (go tool pprof -top -sample_index=alloc_space over half the window), then the heap in use:"}
		rss.profile = append(append(last.allocTop, "--- in use (-sample_index=inuse_space):"), last.heapTop...)
	}
	curP99, curOver := p99Of(cur)
	baseP99, baseOver := p99Of(base)
	lat := result{row: sh.row, what: "operator reconcile p99, same runs (their reconciles pooled)",
		measured: overString(curP99, curOver), baseline: overString(baseP99, baseOver) + " (" + vs[0].name + ")",
		ratio: fmt.Sprintf("%.2fx", float64(curP99)/float64(baseP99)), goal: "< 200ms",
		verdict: judge(curP99 < p99Goal && !curOver)}
	if lat.verdict == missed && len(cur) > 0 {
		lat.why = []string{censusWhy, "the operator's CPU over half the window (go tool pprof -top):"}
		lat.profile = cur[len(cur)-1].cpuTop
	}
	traffic := result{row: sh.row, what: "NATS to operator traffic per 30 s (census and streams), same runs",
		measured: mib(trafficPer30s(cur)), baseline: mib(trafficPer30s(base)) + " (" + vs[0].name + ")",
		ratio: fmt.Sprintf("%.2fx", float64(trafficPer30s(cur))/float64(max(trafficPer30s(base), 1))), goal: "reported", verdict: noGoal,
		notes: []string{censusWhy}}
	return []result{rss, lat, traffic}
}

func medianRSS(xs []int64) int64 {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return int64(medianFloat(f))
}

func p99String(r opRun) string { return overString(r.p99, r.p99Over) }

// overString is a quantile, "> d" when it lies beyond the last finite
// bucket d.
func overString(d time.Duration, over bool) string {
	if over {
		return "> " + ms(d)
	}
	return ms(d)
}

// stepTime is one reconcile step's time over a window.
type stepTime struct {
	step  string
	p99   time.Duration
	over  bool
	mean  time.Duration
	count int
}

// stepTimes are the steps' p99 over the window between two scrapes,
// slowest first.
func stepTimes(before, after map[string]histogram) []stepTime {
	var ts []stepTime
	for step, h := range after {
		d := h.minus(before[step])
		if d.count == 0 {
			continue
		}
		p99, over := d.quantile(0.99)
		ts = append(ts, stepTime{step: step, p99: p99, over: over, mean: d.mean(), count: int(d.count)})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].p99 > ts[j].p99 })
	return ts
}

// stepsString names the first n steps of ts with their p99 and count.
func stepsString(ts []stepTime, n int) string {
	var parts []string
	for _, t := range ts[:min(n, len(ts))] {
		p := ms(t.p99)
		if t.over {
			p = "> " + p
		}
		parts = append(parts, fmt.Sprintf("%s %s (mean %s) over %d", t.step, p, ms(t.mean), t.count))
	}
	if len(parts) == 0 {
		return "none scraped"
	}
	return strings.Join(parts, ", ")
}
