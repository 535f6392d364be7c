package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// scenarioInput is the scenario both strategies run: start at From, move
// through Changes one at a time while rows flow, then roll every pod with a
// template change.
type scenarioInput struct {
	From     ownership.Topology
	Changes  []ownership.Topology
	Replicas int32
	// Rate is rows per second.
	Rate int
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

// scenarioResult is what one strategy's run measured.
type scenarioResult struct {
	Strategy              string
	Published, Delivered  int
	Duplicates            int
	MaxMultiplyOwned      int
	MultiplyOwnedInstants int
	// NotRegistryOwner counts deliveries by a worker the registry did not
	// name as owner (meaningless for independent, which has no claims).
	NotRegistryOwner   int
	UnownedUnitSeconds float64
	// MaxGapUnmoved is the longest delivery gap, during the N and V
	// changes, of a unit that kept one holder throughout them.
	MaxGapUnmoved time.Duration
	UnmovedUnits  int
	Took          time.Duration
	Err           error
}

const sampleEvery = 50 * time.Millisecond

func runScenario(t *testing.T, s strategy, in scenarioInput, ns string) scenarioResult {
	t.Helper()
	start := time.Now()
	w := startWorld(t, ns, fleettest.Options{Partitions: in.From.Partitions, Shards: in.From.Shards,
		Params: fleettest.FastParams(), DrainTimeout: 5 * time.Second, AckWait: 10 * time.Second})
	s.Setup(w, in.From, in.Replicas)
	t.Logf("%s: fleet of %d pods ready at %s after %s", s.Name(), in.Replicas, in.From, time.Since(start).Round(time.Second))

	mon := fleettest.StartMonitor(w.kubelet.Addrs, in.From, sampleEvery)
	mon.CheckRegistry(w.fleet.Registry, w.fleet.Topology)
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
	// Units whose owner did not change over the N and V changes must not
	// have stopped: measured up to the pod roll, which moves every unit.
	changes := mon.Result()
	changesEnd := time.Now()
	began := time.Now()
	s.RollPods(w)
	t.Logf("%s: pod roll done in %s", s.Name(), time.Since(began).Round(time.Millisecond))

	published := pub.Stop()
	d, err := w.fleet.WaitDelivered(published, 90*time.Second)
	m := mon.Stop()
	r := scenarioResult{
		Strategy: s.Name(), Published: d.Published, Delivered: d.Delivered, Duplicates: d.Duplicates,
		MaxMultiplyOwned: m.MaxMultiplyOwned, MultiplyOwnedInstants: m.MultiplyOwnedInstants, NotRegistryOwner: m.NotRegistryOwner,
		UnownedUnitSeconds: m.UnownedUnitSeconds(), Took: time.Since(start), Err: err,
	}
	for u, holders := range changes.Holders {
		if len(holders) == 1 {
			r.UnmovedUnits++
			r.MaxGapUnmoved = max(r.MaxGapUnmoved, d.MaxGapWithin(u, pubStart, changesEnd))
		}
	}
	if len(m.Examples) > 0 {
		t.Logf("%s: multiply-owned sightings, e.g. %v", s.Name(), m.Examples)
	}
	return r
}

// TestRolloutSequencedVersusIndependent runs the scenario of the issue —
// V 8 -> 16 while publishing, then N 4 -> 6, then a pod roll — under the
// operator and under independent workers, and prints both side by side.
//
// checks P1, P2, P3, P7
func TestRolloutSequencedVersusIndependent(t *testing.T) {
	in := scenarioInput{
		From:     ownership.Topology{Partitions: 4, Shards: 8},
		Changes:  []ownership.Topology{{Partitions: 4, Shards: 16}, {Partitions: 6, Shards: 16}},
		Replicas: 3,
		Rate:     200,
	}
	var results []scenarioResult
	for _, s := range []strategy{&sequenced{}, &independent{}} {
		var r scenarioResult
		t.Run(s.Name(), func(t *testing.T) {
			r = runScenario(t, s, in, "e2e-"+s.Name())
		})
		results = append(results, r)
	}
	printSideBySide(t, results)

	seq := results[0]
	if seq.Err != nil {
		t.Errorf("sequenced lost rows (P3): %v", seq.Err)
	}
	if seq.MaxMultiplyOwned != 0 || seq.NotRegistryOwner != 0 {
		t.Errorf("sequenced broke P1: %d multiply-owned units at once, %d deliveries against the registry",
			seq.MaxMultiplyOwned, seq.NotRegistryOwner)
	}
	if seq.Published == 0 {
		t.Errorf("nothing was published; the scenario checked nothing")
	}
}

func printSideBySide(t *testing.T, rs []scenarioResult) {
	row := func(name string, f func(r scenarioResult) string) {
		line := fmt.Sprintf("%-40s", name)
		for _, r := range rs {
			line += fmt.Sprintf(" %14s", f(r))
		}
		t.Log(line)
	}
	row("strategy", func(r scenarioResult) string { return r.Strategy })
	row("rows published", func(r scenarioResult) string { return fmt.Sprint(r.Published) })
	row("rows lost (P3)", func(r scenarioResult) string { return fmt.Sprint(r.Published - r.Delivered) })
	row("duplicates", func(r scenarioResult) string { return fmt.Sprint(r.Duplicates) })
	row("multiply-owned unit-instants (P1)", func(r scenarioResult) string { return fmt.Sprint(r.MultiplyOwnedInstants) })
	row("max multiply-owned at once", func(r scenarioResult) string { return fmt.Sprint(r.MaxMultiplyOwned) })
	row("deliveries against the registry (P1)", func(r scenarioResult) string {
		if r.Strategy == "independent" {
			return "n/a"
		}
		return fmt.Sprint(r.NotRegistryOwner)
	})
	row("unowned unit-seconds", func(r scenarioResult) string { return fmt.Sprintf("%.1f", r.UnownedUnitSeconds) })
	row("max gap of unmoved units (count)", func(r scenarioResult) string {
		return fmt.Sprintf("%s (%d)", r.MaxGapUnmoved.Round(10*time.Millisecond), r.UnmovedUnits)
	})
	row("scenario time", func(r scenarioResult) string { return r.Took.Round(time.Second).String() })
}

// rollPodsByHand restarts pods highest ordinal first, one at a time,
// waiting for each replacement to be Ready: how a fleet without the
// operator rolls.
func rollPodsByHand(w *world, replicas int32) {
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
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
