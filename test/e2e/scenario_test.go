package e2e

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// scenarioInput is a scenario both strategies run: start at From, move
// through Changes one at a time while rows flow, then, when RollPods is
// set, roll every pod with a template change.
type scenarioInput struct {
	Name     string
	From     ownership.Topology
	Changes  []ownership.Topology
	RollPods bool
	Replicas int32
	// Rate is rows per second.
	Rate int
	// ContainerPods run as containers of WorkerContainerImage (see
	// worldOptions).
	ContainerPods        []string
	WorkerContainerImage string
	// Image and Binaries choose the worker the pods run (see
	// worldOptions); the default is the reference worker.
	Image    string
	Binaries map[string]string
}

// strategy is how a fleet goes through the scenario.
type strategy interface {
	Name() string
	// Setup starts the fleet at topo and returns once every pod is ready
	// and every unit has an owner.
	Setup(w *world, topo ownership.Topology, replicas int32)
	// Change moves the fleet to topo and returns once it is done.
	Change(w *world, topo ownership.Topology)
	// RollPods restarts every pod with a template change.
	RollPods(w *world)
}

// scenarioResult is what one strategy's run of one scenario measured. The
// verdict is the history checker's, from what the workers did; the
// monitor's live view (what they said) only adds the unowned estimate.
type scenarioResult struct {
	Strategy, Scenario string
	Verdict            historycheck.Verdict
	Delivery           fleettest.Delivery
	Monitor            fleettest.MonitorResult
	// MaxGapUnmoved is the longest delivery gap, during the N and V
	// changes, of a unit one process delivered throughout them.
	MaxGapUnmoved time.Duration
	UnmovedUnits  int
	Took          time.Duration
	Err           error
}

// Column names the result in the side-by-side table.
func (r scenarioResult) Column() string { return r.Strategy + " " + r.Scenario }

const sampleEvery = 50 * time.Millisecond

func runScenario(t *testing.T, s strategy, in scenarioInput, ns string) scenarioResult {
	t.Helper()
	start := time.Now()
	w := startWorld(t, ns, worldOptions{
		Options: fleettest.Options{Partitions: in.From.Partitions, Shards: in.From.Shards,
			Params: fleettest.FastParams(), DrainTimeout: 5 * time.Second, AckWait: 10 * time.Second},
		ContainerPods: in.ContainerPods, WorkerContainerImage: in.WorkerContainerImage,
		Image: in.Image, Binaries: in.Binaries,
	})
	s.Setup(w, in.From, in.Replicas)
	t.Logf("%s %s: fleet of %d pods ready at %s after %s", s.Name(), in.Name, in.Replicas, in.From, time.Since(start).Round(time.Second))

	mon := fleettest.StartMonitor(w.kubelet.Addrs, in.From, sampleEvery)
	pub := w.fleet.StartPublisher(in.From, in.Rate)
	pubStart := time.Now()
	for _, to := range in.Changes {
		began := time.Now()
		s.Change(w, to)
		// Publishers move to the new units once the change is done.
		pub.SetTopology(to)
		mon.SetTopology(to)
		t.Logf("%s: change to %s done in %s", s.Name(), to, time.Since(began).Round(time.Millisecond))
	}
	changesEnd := time.Now()
	if in.RollPods {
		began := time.Now()
		s.RollPods(w)
		t.Logf("%s: pod roll done in %s", s.Name(), time.Since(began).Round(time.Millisecond))
	}

	published := pub.Stop()
	if x, ok := s.(extraRows); ok {
		maps.Copy(published, x.Extra())
	}
	v, d, err := w.fleet.Verdict(published, 90*time.Second, s.Name() == "independent")
	r := scenarioResult{Strategy: s.Name(), Scenario: in.Name, Verdict: v, Delivery: d, Monitor: mon.Stop(),
		Took: time.Since(start), Err: err}
	r.UnmovedUnits, r.MaxGapUnmoved = unmovedGaps(t, w.fleet, d, pubStart, changesEnd)
	if !v.Clean() {
		t.Logf("%s %s: first violation: %s", s.Name(), in.Name, v.FirstViolation)
	}
	return r
}

// unmovedGaps finds, from the delivery history, the units exactly one
// member (pod) delivered between from and to, and the longest gap between
// consecutive first writes of their rows in that window (a pod restart
// shows up as a gap).
func unmovedGaps(t *testing.T, f *fleettest.Fleet, d fleettest.Delivery, from, to time.Time) (int, time.Duration) {
	procs, err := history.ReadDir(f.HistoryDir)
	if err != nil {
		t.Fatal(err)
	}
	who := map[string]map[string]bool{}
	for _, p := range procs {
		for _, rec := range p.Records {
			at := p.WallTime(rec.Start)
			if rec.Kind != history.KindDeliver || at.Before(from) || at.After(to) {
				continue
			}
			if who[rec.Unit] == nil {
				who[rec.Unit] = map[string]bool{}
			}
			who[rec.Unit][rec.Member] = true
		}
	}
	n, gap := 0, time.Duration(0)
	for u, ps := range who {
		if len(ps) == 1 {
			n++
			gap = max(gap, d.MaxGapWithin(u, from, to))
		}
	}
	return n, gap
}

// TestRolloutSequencedVersusIndependent runs, on 4 pods, V 8 -> 16 (then a
// pod roll) and V 32 -> 48 while publishing, under the operator and under
// independent workers that hash on their own, and prints the history
// checker's verdicts side by side. Sequenced must be clean. The baseline
// must fail a P1 check (overlapping delivery windows) in every change
// whose placement has units pulled by an old and a replaced pod at once
// (V 32 -> 48: its replaced pods take units from pods not replaced yet;
// V 8 -> 16 moves units only to pods replaced later, so nobody pulls them
// twice), driven by steady traffic on those units (driveOverlap), and so
// in every run, or the comparison proves nothing.
//
// checks P1, P2, P3, P7
func TestRolloutSequencedVersusIndependent(t *testing.T) {
	scenarios := []scenarioInput{
		{Name: "V8->16", From: ownership.Topology{Partitions: 4, Shards: 8},
			Changes: []ownership.Topology{{Partitions: 4, Shards: 16}}, RollPods: true, Replicas: 4, Rate: 200},
		{Name: "V32->48", From: ownership.Topology{Partitions: 4, Shards: 32},
			Changes: []ownership.Topology{{Partitions: 4, Shards: 48}}, Replicas: 4, Rate: 200},
	}
	var results []scenarioResult
	baselineFailed := 0
	for i, in := range scenarios {
		for _, s := range []strategy{&sequenced{}, &independent{}} {
			var r scenarioResult
			t.Run(s.Name()+"/"+in.Name, func(t *testing.T) {
				r = runScenario(t, s, in, fmt.Sprintf("e2e-%s-%d", s.Name(), i))
			})
			results = append(results, r)
			ind, ok := s.(*independent)
			if !ok {
				continue
			}
			p1 := r.Verdict.Row(historycheck.CheckOverlaps)
			t.Logf("independent %s: %d units pulled by an old and a replaced pod at once, %d drive(s), %d overlapping windows seen while driving; P1 overlap %s; %d deliveries",
				in.Name, ind.moved, ind.drives, ind.overlaps, p1[0], r.Verdict.Deliveries)
			// A baseline whose workers pull nothing fails no check: their
			// consumers must be the fleet's.
			if r.Verdict.Deliveries == 0 {
				t.Errorf("independent %s: the baseline's workers delivered no row: they pull no consumer the publishers fill", in.Name)
			}
			failed := p1[1] == string(historycheck.Fail)
			if failed {
				baselineFailed++
			}
			if ind.moved > 0 && !failed {
				t.Errorf("independent %s: %d units on an old and a replaced pod at once and %s of steady traffic on them per replaced pod, yet no overlapping delivery windows (P1 passed)",
					in.Name, ind.moved, baselineDrive)
			}
		}
	}
	printSideBySide(t, results)
	if baselineFailed == 0 {
		t.Errorf("the independent baseline failed no P1 check in any change: a comparison whose baseline cannot fail compares nothing")
	}

	for _, r := range results {
		switch r.Strategy {
		case "sequenced":
			if r.Err != nil {
				t.Errorf("sequenced %s lost rows (P3): %v", r.Scenario, r.Err)
			}
			if !r.Verdict.Clean() {
				t.Errorf("sequenced %s: the delivery history breaks a promise: %s", r.Scenario, r.Verdict.FirstViolation)
			}
			if r.Verdict.Published == 0 {
				t.Errorf("sequenced %s: nothing was published; the scenario checked nothing", r.Scenario)
			}
		}
	}
}

func printSideBySide(t *testing.T, rs []scenarioResult) {
	titles := make([]string, len(rs))
	verdicts := make([]historycheck.Verdict, len(rs))
	for i, r := range rs {
		titles[i], verdicts[i] = r.Column(), r.Verdict
	}
	t.Log("\n" + historycheck.SideBySide(titles, verdicts...))
	row := func(name string, f func(r scenarioResult) string) {
		line := fmt.Sprintf("%-36s", name)
		for _, r := range rs {
			line += fmt.Sprintf(" %24s", f(r))
		}
		t.Log(line)
	}
	row("live view: unowned unit-seconds", func(r scenarioResult) string {
		return fmt.Sprintf("%.1f", r.Monitor.UnownedUnitSeconds())
	})
	row("live view: samples (skipped)", func(r scenarioResult) string {
		return fmt.Sprintf("%d (%d)", r.Monitor.Samples, r.Monitor.Skipped)
	})
	row("max gap of unmoved units (count)", func(r scenarioResult) string {
		return fmt.Sprintf("%s (%d)", r.MaxGapUnmoved.Round(10*time.Millisecond), r.UnmovedUnits)
	})
	row("scenario time", func(r scenarioResult) string { return r.Took.Round(time.Second).String() })
}

// rollPodsByHand restarts pods highest ordinal first, one at a time,
// waiting for each replacement to be Ready: how a fleet without the
// operator rolls. replaced, when set, runs after each replacement is
// Ready, with its ordinal.
func rollPodsByHand(w *world, replicas int32, replaced func(ordinal int)) {
	ctx := context.Background()
	for i := replicas - 1; i >= 0; i-- {
		name := fmt.Sprintf("ingest-%d", i)
		old, err := w.cs.CoreV1().Pods(w.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			w.t.Fatal(err)
		}
		if err := w.cs.CoreV1().Pods(w.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			w.t.Fatal(err)
		}
		fleettest.Eventually(w.t, 2*time.Minute, func() error {
			p, err := w.cs.CoreV1().Pods(w.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.UID == old.UID || !podReady(p) {
				return fmt.Errorf("pod %s not replaced and ready yet", name)
			}
			return nil
		})
		if replaced != nil {
			replaced(int(i))
		}
	}
}

// extraRows is a strategy that published rows of its own (the baseline's
// traffic on the units two of its pods pull); the verdict counts them too.
type extraRows interface {
	Extra() map[string]ownership.Unit
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
