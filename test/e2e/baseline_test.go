package e2e

import (
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// The independent baseline must fail a P1 check in every run, or the
// comparison proves nothing. During its pod-by-pod change a unit that
// exists in both shapes and whose slot moves to a pod replaced earlier is
// pulled by two processes at once: the old pod (placing with the old
// shape) and the replaced one (the new shape). Its unit consumers are plain
// pull consumers, as fleets hashing on their own run them, so NATS hands
// each row to whichever of the two has a pull waiting, and both handle
// rows. A delivery's window runs from the pull that brought the row to its
// ack; while one process works off a pull, the other's next pull is
// already waiting, so with rows arriving steadily on the unit the two
// processes' windows overlap. The main publisher's rate spreads thin over
// every unit (200 rows/s over 192 units is about one a second), so after
// each replaced pod the baseline adds steady traffic on exactly the units
// it shares with an old pod until the histories show an overlap on them,
// at most baselineDrive per replaced pod.

const (
	// baselineRatePerUnit is the added traffic per shared unit, rows a
	// second: several per pull (a pull waits at most a second), so rows go
	// to both processes' pulls in turn.
	baselineRatePerUnit = 20
	// baselineDrive bounds the added traffic after each replaced pod.
	baselineDrive = 30 * time.Second
	// baselinePoll is how often the driver reads the histories.
	baselinePoll = 500 * time.Millisecond
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

// driveOverlap publishes steady traffic onto the shared units until the
// histories show two processes' delivery windows overlapping on one of
// them, for at most baselineDrive. It returns the rows it published (the
// verdict's P3 counts them) and the overlapping windows it saw on the
// units (0: none within the bound).
func (s *independent) driveOverlap(w *world, units []ownership.Unit) (map[string]ownership.Unit, int64) {
	if len(units) == 0 {
		return map[string]ownership.Unit{}, 0
	}
	pub := w.fleet.StartUnitPublisher(fmt.Sprintf("baseline-%d", s.drives), units, baselineRatePerUnit*len(units))
	s.drives++
	began := time.Now()
	var n int64
	for n == 0 && time.Since(began) < baselineDrive {
		time.Sleep(baselinePoll) // the histories' polling period
		n = overlapsOn(w, units)
	}
	published := pub.Stop()
	w.t.Logf("independent: %d overlapping delivery windows on %d shared units after %s of %d rows/s on them (%d rows)",
		n, len(units), time.Since(began).Round(100*time.Millisecond), baselineRatePerUnit*len(units), len(published))
	return published, n
}

// overlapsOn is the P1 overlap count, on units, of the histories written so
// far: the checker's own judgement, over those units' records only (the
// whole history grows by hundreds of records a second).
func overlapsOn(w *world, units []ownership.Unit) int64 {
	procs, err := history.ReadDir(w.fleet.HistoryDir)
	if err != nil {
		w.t.Fatal(err)
	}
	keep := map[string]bool{}
	for _, u := range units {
		keep[u.String()] = true
	}
	for i := range procs {
		var recs []history.Record
		for _, r := range procs[i].Records {
			if r.Kind == history.KindClock || keep[r.Unit] {
				recs = append(recs, r)
			}
		}
		procs[i].Records = recs
	}
	return historycheck.Check(historycheck.Input{NoRegistry: true, Processes: procs}).OverlappingWindows
}
