package worker_test

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
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

// checkDelivered checks P3 and prints the duplicate count.
func checkDelivered(t *testing.T, f *fleettest.Fleet, pub *fleettest.Publisher) fleettest.Delivery {
	t.Helper()
	published := pub.Stop()
	d, err := f.WaitDelivered(published, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("P3: %d rows published, %d in the sink, %d duplicates", d.Published, d.Delivered, d.Duplicates)
	return d
}

// checks P1, P3
func TestWorkersShareUnitsEvenly(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 6}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	mon := f.StartMonitor(topo, 50*time.Millisecond)
	pub := f.StartPublisher(topo, 100)

	f.StartWorker("w-0")
	f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)
	f.StartWorker("w-2")
	waitSettled(t, f, topo, 3)

	checkDelivered(t, f, pub)
	checkP1(t, mon.Stop())
}

// checks P1, P3
func TestGracefulStopMovesUnitsWithoutLoss(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	mon := f.StartMonitor(topo, 50*time.Millisecond)
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

	d := checkDelivered(t, f, pub)
	// Only rows in flight at the handover may come twice: at most one
	// fetch batch per moved unit.
	if limit := topo.Len() * 64; d.Duplicates > limit {
		t.Fatalf("%d duplicates after a graceful stop, more than the rows in flight could explain (%d)", d.Duplicates, limit)
	}
	checkP1(t, mon.Stop())
}

// checks P1, P3, P4, P5
func TestSigkillTakeoverWithinLeasePlusGrace(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards, AckWait: 30 * time.Second})
	ctx := context.Background()
	// The census verdict the operator would publish for an all-2.15 cluster.
	if err := f.Registry.PublishResetPermission(ctx, f.Topology, poolctl.ResetPermission{Allowed: true, Reason: "test: every server at 2.15"}); err != nil {
		t.Fatal(err)
	}
	mon := f.StartMonitor(topo, 50*time.Millisecond)
	pub := f.StartPublisher(topo, 100)
	f.StartWorker("w-0")
	w1 := f.StartWorker("w-1")
	h := waitSettled(t, f, topo, 2)
	var victims []string
	for u, hs := range h {
		if hs[0] == "w-1" {
			victims = append(victims, u)
		}
	}
	sort.Strings(victims)

	killed := time.Now()
	if err := w1.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Redelivering: a row of every victim unit written by w-0 after the kill.
	var took time.Duration
	fleettest.Eventually(t, 60*time.Second, func() error {
		sink, err := f.Sink(ctx)
		if err != nil {
			return err
		}
		latest := map[string]time.Time{}
		for _, r := range sink {
			if r.Member == "w-0" && r.WrittenAt.After(killed) && r.WrittenAt.After(latest[r.Unit]) {
				latest[r.Unit] = r.WrittenAt
			}
		}
		for _, u := range victims {
			if latest[u].IsZero() {
				return fmt.Errorf("unit %s not redelivering yet", u)
			}
		}
		took = time.Since(killed)
		return nil
	})
	p := fleettest.FastParams()
	bound := p.LeaseTTL + p.Grace + time.Second
	t.Logf("takeover after SIGKILL: %d units redelivering within %s (bound lease TTL + grace + 1s = %s)", len(victims), took.Round(time.Millisecond), bound)
	// Measured to the sink poll, which adds up to a poll interval and a
	// tick; the gross bound catches a takeover that waited for ack_wait (30s).
	if took > bound+2*p.RenewInterval+time.Second {
		t.Fatalf("takeover took %s, want within %s", took, bound)
	}
	checkDelivered(t, f, pub)
	checkP1(t, mon.Stop())
}

// A drain request (the operator's first step of a pod restart) moves every
// unit off the member without a restart, and clearing it brings its share
// back.
//
// checks P1, P3
func TestDrainRequestMovesUnitsAwayAndBack(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	mon := f.StartMonitor(topo, 50*time.Millisecond)
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
	checkDelivered(t, f, pub)
	checkP1(t, mon.Stop())
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

// checkP1 fails on any unit two unfenced workers delivered at once, or a
// worker delivered while the registry named another owner.
func checkP1(t *testing.T, r fleettest.MonitorResult) {
	t.Helper()
	t.Logf("P1: %d samples, max multiply-owned %d, deliveries against the registry %d", r.Samples, r.MaxMultiplyOwned, r.NotRegistryOwner)
	if r.MaxMultiplyOwned != 0 || r.NotRegistryOwner != 0 {
		t.Fatalf("P1 broken: %v", r.Examples)
	}
}
