package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// held maps unit -> holders over every running, unfenced worker.
func held(t *testing.T, f *fleettest.Fleet) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out := map[string][]string{}
	for _, w := range f.Workers() {
		s, err := w.Status(ctx)
		if err != nil || s.Fenced {
			continue
		}
		for u := range s.Held {
			out[u] = append(out[u], w.Name)
		}
	}
	return out
}

// waitSettled waits until every unit of topo is held by exactly one worker
// and each worker holds no more than the placement cap.
func waitSettled(t *testing.T, f *fleettest.Fleet, topo ownership.Topology, workers int) map[string][]string {
	t.Helper()
	var h map[string][]string
	cap := (topo.Len() + workers - 1) / workers
	fleettest.Eventually(t, 60*time.Second, func() error {
		h = held(t, f)
		per := map[string]int{}
		for _, u := range topo.Units() {
			hs := h[u.String()]
			if len(hs) != 1 {
				return fmt.Errorf("unit %s held by %v", u, hs)
			}
			per[hs[0]]++
		}
		if len(per) != workers {
			return fmt.Errorf("units spread over %d workers, want %d: %v", len(per), workers, per)
		}
		for w, n := range per {
			if n > cap {
				return fmt.Errorf("%s holds %d units, above the cap %d", w, n, cap)
			}
		}
		return nil
	})
	return h
}

// checkEvidence stops the publisher, waits for every row to reach the sink
// and judges the fleet's delivery history with the history checker: no
// overlapping windows, no delivery, ack or write outside a valid claim,
// nothing lost, every sink write on record, every duplicate explained
// (P1, P2, P3). It logs the verdict table and returns it.
func checkEvidence(t *testing.T, f *fleettest.Fleet, pub *fleettest.Publisher) (historycheck.Verdict, fleettest.Delivery) {
	t.Helper()
	published := pub.Stop()
	return judge(t, f, published)
}

// judge is checkEvidence for rows already published.
func judge(t *testing.T, f *fleettest.Fleet, published map[string]ownership.Unit) (historycheck.Verdict, fleettest.Delivery) {
	t.Helper()
	v, d, err := f.Verdict(published, 60*time.Second, false)
	t.Logf("P3: %d rows published, %d in the sink, %d duplicates\n%s", d.Published, d.Delivered, d.Duplicates, v.Table())
	if err != nil {
		t.Fatal(err)
	}
	if !v.Clean() {
		t.Fatalf("the delivery history breaks a promise: %s", v.FirstViolation)
	}
	return v, d
}

// checks P1, P3
func TestWorkersShareUnitsEvenly(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 6}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	pub := f.StartPublisher(topo, 100)

	f.StartWorker("w-0")
	f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)
	f.StartWorker("w-2")
	waitSettled(t, f, topo, 3)

	checkEvidence(t, f, pub)
}

// checks P1, P3
func TestGracefulStopMovesUnitsWithoutLoss(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	pub := f.StartPublisher(topo, 100)
	f.StartWorker("w-0")
	w1 := f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)
	fleettest.Eventually(t, 10*time.Second, func() error {
		if pub.Published() < 200 {
			return fmt.Errorf("%d rows published", pub.Published())
		}
		return nil
	})

	start := time.Now()
	if err := w1.Stop(30 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, w1.Log())
	}
	t.Logf("w-1 handed over and left in %s", time.Since(start).Round(time.Millisecond))
	waitSettled(t, f, topo, 1)

	v, _ := checkEvidence(t, f, pub)
	// A graceful handover settles every row it delivered before the next
	// owner pulls: nothing comes twice.
	if v.Duplicates != 0 {
		t.Fatalf("%d duplicates after a graceful stop: a handover settles every delivered row", v.Duplicates)
	}
}

// A drain request (the operator's first step of a pod restart) moves every
// unit off the member without a restart, and clearing it brings its share
// back.
//
// checks P1, P3
func TestDrainRequestMovesUnitsAwayAndBack(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	pub := f.StartPublisher(topo, 100)
	f.StartWorker("w-0")
	f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)

	ctx := context.Background()
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-1", true); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		s, err := f.Registry.Snapshot(ctx, f.Topology)
		if err != nil {
			return err
		}
		if m := s.Member("w-1"); m == nil || m.Holds != 0 {
			return fmt.Errorf("w-1 still holds units: %+v", m)
		}
		return nil
	})
	waitSettled(t, f, topo, 1)
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-1", false); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, f, topo, 2)
	checkEvidence(t, f, pub)
}

// A V decrease leaves rows in the removed units' consumers: their holders
// keep delivering until those are drained, then release them.
//
// checks P3
func TestShrinkDrainsRemovedUnitsBeforeReleasing(t *testing.T) {
	from, to := ownership.Topology{Partitions: 1, Shards: 4}, ownership.Topology{Partitions: 1, Shards: 2}
	// Without the drain, the removed units' rows would be stranded.
	f := fleettest.Start(t, fleettest.Options{Partitions: from.Partitions, Shards: from.Shards})
	f.StartWorker("w-0")
	f.StartWorker("w-1")
	waitSettled(t, f, from, 2)

	// A backlog on the units about to be removed, far longer to work off
	// than the change takes.
	backlog := f.PublishBurst([]ownership.Unit{{Partition: 0, Shard: 2}, {Partition: 0, Shard: 3}}, 20000)
	f.ChangeTopology(to.Partitions, to.Shards)
	d, err := f.WaitDelivered(backlog, 90*time.Second)
	if err != nil {
		t.Fatalf("P3 broken by a shrink: %v", err)
	}
	t.Logf("P3: %d backlog rows delivered across the shrink, %d duplicates", d.Delivered, d.Duplicates)
	fleettest.Eventually(t, 30*time.Second, func() error {
		for u, hs := range held(t, f) {
			if unit, _ := ownership.ParseUnit(u); !to.Contains(unit) {
				return fmt.Errorf("removed unit %s still held by %v after draining", u, hs)
			}
		}
		return nil
	})
}
