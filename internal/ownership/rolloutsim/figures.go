package rolloutsim

import (
	"slices"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// Figures are a run's counts over the whole roll, the way a field report
// counts them: distinct units, each counted once however many steps it
// spent that way. A report that says "3 units were pulled by two
// processes during the roll" names units, not unit-steps or one instant.
type Figures struct {
	// DoublePulled are the units two or more members pulled at some step.
	DoublePulled []ownership.Unit
	// PulledByNobody are the units nobody pulled at some step where every
	// pod ran: no restart explains the gap, only the fleet's disagreement
	// about who owns them (or a plan's handover).
	PulledByNobody []ownership.Unit
	// PulledByNobodyAny counts the units nobody pulled at some step,
	// restart windows included: every unit of a pod that is down is in it.
	PulledByNobodyAny int
	// MaxMulti and MaxUnowned are the most units at one step.
	MaxMulti, MaxUnowned int
}

// Figures returns the run's counts over the whole roll.
func (r Run) Figures() Figures {
	var f Figures
	multi, nobody, gap := map[ownership.Unit]bool{}, map[ownership.Unit]bool{}, map[ownership.Unit]bool{}
	for _, row := range r.Rows {
		f.MaxMulti, f.MaxUnowned = max(f.MaxMulti, row.Multi), max(f.MaxUnowned, row.Unowned)
		addAll(multi, row.MultiUnits)
		addAll(gap, row.UnownedUnits)
		if row.AllUp {
			addAll(nobody, row.UnownedUnits)
		}
	}
	f.DoublePulled, f.PulledByNobody, f.PulledByNobodyAny = sortedKeys(multi), sortedKeys(nobody), len(gap)
	return f
}

func addAll(set map[ownership.Unit]bool, units []ownership.Unit) {
	for _, u := range units {
		set[u] = true
	}
}

func sortedKeys(set map[ownership.Unit]bool) []ownership.Unit {
	out := make([]ownership.Unit, 0, len(set))
	for u := range set {
		out = append(out, u)
	}
	slices.SortFunc(out, ownership.CompareUnits)
	return out
}
