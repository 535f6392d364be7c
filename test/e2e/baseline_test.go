package e2e

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// The independent baseline must fail a P1 check in every run, or the
// comparison proves nothing. During its pod-by-pod change a unit that
// exists in both shapes and whose slot moves is pulled by an old pod
// (placing with the old shape) and by a replaced one (the new shape); with
// steady traffic on exactly those units both get rows, and their delivery
// windows overlap. Traffic alone is chance, so after each replaced pod the
// baseline publishes bursts onto the units it shares with an old pod until
// the histories show an overlap, a bounded number of times. The unit
// consumers are pinned, so whichever pod took the pin gets every row;
// while a burst is worked off the baseline lifts the pins every 100ms, as
// a pin timeout or a restart does in a fleet that hashes on its own, so
// both pods get rows while the other's are still being handled.

const (
	// baselineBursts bounds the bursts per replaced pod.
	baselineBursts = 4
	// baselineRowsPerUnit is each burst's rows per moved unit.
	baselineRowsPerUnit = 20
)

// movedUnits are the units of both shapes that the pods replaced so far
// (ordinals >= replacedFrom, placing with to) share with a pod not
// replaced yet (placing with from): pulled by two processes at once.
func movedUnits(from, to ownership.Topology, replicas int32, replacedFrom int) []ownership.Unit {
	slots := make([]ownership.Slot, replicas)
	for i := range slots {
		slots[i] = ownership.Slot(i)
	}
	oldSlot := map[ownership.Unit]int{}
	oldP := ownership.Place(from.Units(), slots)
	for _, s := range slots {
		for _, u := range oldP.UnitsOf(s) {
			oldSlot[u] = int(s)
		}
	}
	newP := ownership.Place(to.Units(), slots)
	var out []ownership.Unit
	for _, s := range slots[replacedFrom:] {
		for _, u := range newP.UnitsOf(s) {
			if o, ok := oldSlot[u]; ok && o < replacedFrom {
				out = append(out, u)
			}
		}
	}
	return out
}

// driveOverlap publishes bursts onto the moved units until the histories
// show two processes' delivery windows overlapping on one of them, at most
// baselineBursts times. It returns the rows it published (the verdict's
// P3 counts them) and whether it saw the overlap.
func (s *independent) driveOverlap(w *world, units []ownership.Unit) (map[string]ownership.Unit, bool) {
	published := map[string]ownership.Unit{}
	if len(units) == 0 {
		return published, false
	}
	js, err := jetstream.New(w.fleet.NATS.Connect(-1))
	if err != nil {
		w.t.Fatal(err)
	}
	for try := range baselineBursts {
		burst := w.fleet.PublishBurstAs(fmt.Sprintf("baseline-%d-%d", s.bursts, try), units, baselineRowsPerUnit*len(units))
		s.bursts++
		maps.Copy(published, burst)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			unpinAll(w, js, units)
			if n := overlapsSoFar(w); n > 0 {
				w.t.Logf("independent: %d overlapping delivery windows after %d burst(s) onto %d moved units", n, try+1, len(units))
				return published, true
			}
			time.Sleep(100 * time.Millisecond) // the pin churn's period, and polling the history files
		}
	}
	return published, false
}

// unpinAll lifts the pin of every unit's consumer; errors are ignored (a
// consumer with no pin, a slow server: the next round tries again).
func unpinAll(w *world, js jetstream.JetStream, units []ownership.Unit) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, u := range units {
		ref := w.fleet.Layout.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard})
		if s, err := js.Stream(ctx, ref.Stream); err == nil {
			_ = s.UnpinConsumer(ctx, ref.Name, natsops.PriorityGroup)
		}
	}
}

// overlapsSoFar is the P1 overlap count of the histories written so far.
func overlapsSoFar(w *world) int64 {
	procs, err := history.ReadDir(w.fleet.HistoryDir)
	if err != nil {
		w.t.Fatal(err)
	}
	return historycheck.Check(historycheck.Input{NoRegistry: true, Processes: procs}).OverlappingWindows
}
