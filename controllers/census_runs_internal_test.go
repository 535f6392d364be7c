package controllers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// The next census falls on the topology's slot, after the last one and at
// most an interval after it, whatever time the last was taken at.
func TestTheNextCensusFallsOnTheSlotWithinAnInterval(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		interval := time.Duration(1+rng.IntN(60)) * time.Second
		slot := time.Duration(rng.Int64N(int64(interval)))
		taken := time.Unix(1_700_000_000+rng.Int64N(1e6), rng.Int64N(1e9))
		next := nextCensusAt(taken, interval, slot)
		if !next.After(taken) || next.Sub(taken) > interval {
			t.Fatalf("case %d: next %v is %v after taken, want in (0, %v]", i, next, next.Sub(taken), interval)
		}
		if got := next.Sub(next.Truncate(interval)); got != slot {
			t.Fatalf("case %d: next %v is %v into its interval, want the slot %v", i, next, got, slot)
		}
	}
}

// Topologies started together take their censuses at different times:
// ten keys spread over the interval, none sharing a second.
func TestCensusSlotsSpreadTopologiesOverTheInterval(t *testing.T) {
	interval := 30 * time.Second
	seconds := map[time.Duration]string{}
	for i := range 10 {
		key := types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("topology-%d", i)}
		slot := censusSlot(key, interval)
		if slot < 0 || slot >= interval {
			t.Fatalf("slot of %s = %v, want in [0, %v)", key, slot, interval)
		}
		if censusSlot(key, interval) != slot {
			t.Fatalf("slot of %s changes between calls", key)
		}
		s := slot.Truncate(time.Second)
		if other, ok := seconds[s]; ok {
			t.Errorf("%s and %s share the second %v of the interval", key, other, s)
		}
		seconds[s] = key.String()
	}
}

// A census run is published once: asking for a census, or a new run,
// drops the one before and cancels it; a dropped run does not wake the
// topology.
func TestACensusAskedForDropsTheRunningOne(t *testing.T) {
	var c Connections
	key := types.NamespacedName{Namespace: "ns", Name: "t"}
	started, woke := make(chan context.Context, 1), make(chan struct{}, 1)
	c.startCensus(key, censusQuestion{floor: "2.14.0"}, func(ctx context.Context) *censusReport {
		started <- ctx
		<-ctx.Done()
		return &censusReport{failed: "cancelled"}
	}, func() { woke <- struct{}{} })
	ctx := <-started
	run := c.census(key)
	if run == nil || run.finished() != nil {
		t.Fatalf("census run = %+v, want one running", run)
	}
	c.setCensusDue(key, true)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("asking for a census did not cancel the running one")
	}
	if c.census(key) != nil {
		t.Fatal("the run asked before the ask is still the topology's census")
	}
	<-run.done
	select {
	case <-woke:
		t.Fatal("a dropped census woke the topology")
	default:
	}

	c.startCensus(key, censusQuestion{floor: "2.14.0"}, func(context.Context) *censusReport {
		return &censusReport{failed: "done"}
	}, func() { woke <- struct{}{} })
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("a finished census did not wake the topology")
	}
	if rep := c.census(key).finished(); rep == nil || rep.failed != "done" {
		t.Fatalf("finished census = %+v, want its report", rep)
	}
}

// At most maxConcurrentCensuses run at once: the others wait their turn
// and run when one ends.
func TestCensusesWaitTheirTurn(t *testing.T) {
	var c Connections
	running, release, woke := make(chan struct{}, 10), make(chan struct{}), make(chan struct{}, 10)
	n := maxConcurrentCensuses + 2
	for i := range n {
		key := types.NamespacedName{Namespace: "ns", Name: fmt.Sprint(i)}
		c.startCensus(key, censusQuestion{}, func(context.Context) *censusReport {
			running <- struct{}{}
			<-release
			return &censusReport{failed: "done"}
		}, func() { woke <- struct{}{} })
	}
	for range maxConcurrentCensuses {
		select {
		case <-running:
		case <-time.After(10 * time.Second):
			t.Fatal("fewer than maxConcurrentCensuses censuses started")
		}
	}
	select {
	case <-running:
		t.Fatalf("more than %d censuses run at once", maxConcurrentCensuses)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	for range n {
		select {
		case <-woke:
		case <-time.After(10 * time.Second):
			t.Fatal("a census waiting its turn never ran")
		}
	}
}

// Status keeps a census's time in whole seconds: a census taken a fraction
// of a second after its slot is not due again until the next interval.
func TestACensusJustTakenIsNotDueAgainAtItsOwnSlot(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "t"}
	interval := 30 * time.Second
	slot := censusSlot(key, interval)
	for _, after := range []time.Duration{time.Millisecond, 400 * time.Millisecond, 999 * time.Millisecond} {
		taken := nextCensusAt(time.Unix(1_700_000_000, 0), interval, slot).Add(after)
		r := &ShardTopologyReconciler{CensusInterval: interval}
		r.conns().addPendingRows(key, nil, time.Minute) // this process took one
		r.conns().setCensusTakenAt(key, taken)
		topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Generation: 1}}
		topo.Status.ObservedGeneration = 1
		topo.Status.Census = &topologyv1.CensusStatus{ObservedAt: &metav1.Time{Time: taken.Truncate(time.Second)}}
		now := taken.Add(100 * time.Millisecond)
		due, wait := r.censusDue(newScope(topo, now))
		if want := taken.Add(-after).Add(interval); due || !now.Add(wait).Equal(want) {
			t.Errorf("taken %v after its slot: due %v, next in %v, want the next interval's slot", after, due, wait)
		}
		// Another process, which has only status, may take one early
		// but never late.
		other := &ShardTopologyReconciler{CensusInterval: interval}
		other.conns().addPendingRows(key, nil, time.Minute)
		if due, wait := other.censusDue(newScope(topo, now)); !due && now.Add(wait).Sub(taken) > interval {
			t.Errorf("from status alone, the next census comes %v after the last, beyond the interval", now.Add(wait).Sub(taken))
		}
	}
}
