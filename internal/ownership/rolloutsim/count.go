package rolloutsim

import (
	"slices"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// Row is the state after one step.
type Row struct {
	// Event says what the step did.
	Event string
	// Counted is how many units carry rows.
	Counted int
	// Unowned counts units pulled by nobody; Waiting of them are in a
	// planned handover and Stranded are not.
	Unowned, Waiting, Stranded int
	// Multi counts units pulled by two or more members.
	Multi int
	// MultiUnits and UnownedUnits are the units Multi and Unowned count,
	// in canonical order.
	MultiUnits, UnownedUnits []ownership.Unit
	// AllUp says every pod ran at this step, so no restart explains an
	// unowned unit.
	AllUp bool
}

// Run is one strategy's replay of a scenario.
type Run struct {
	Strategy string
	Rows     []Row
	// Violations are the promises a sequenced step broke; empty when all
	// held.
	Violations []error
}

// MaxMulti returns the most multiply-owned units at any step.
func (r Run) MaxMulti() int {
	m := 0
	for _, row := range r.Rows {
		m = max(m, row.Multi)
	}
	return m
}

// UnownedUnitSteps sums unowned units over all steps.
func (r Run) UnownedUnitSteps() int {
	n := 0
	for _, row := range r.Rows {
		n += row.Unowned
	}
	return n
}

// StrandedUnitSteps sums stranded units over all steps.
func (r Run) StrandedUnitSteps() int {
	n := 0
	for _, row := range r.Rows {
		n += row.Stranded
	}
	return n
}

// counter counts one step: which units carry rows, and who pulls them.
type counter struct {
	// publishing is the topology publishers write to.
	publishing ownership.Topology
	from       ownership.Topology
	// retired old units no longer hold rows.
	retired map[ownership.Unit]bool
}

// carries reports whether u carries rows now.
func (c *counter) carries(u ownership.Unit) bool {
	return c.publishing.Contains(u) || (c.from.Contains(u) && !c.retired[u])
}

// row counts pulls (unit to number of members pulling it); waiting are the
// units a plan released and will claim.
func (c *counter) row(event string, pulls map[ownership.Unit]int, waiting map[ownership.Unit]bool) Row {
	r := Row{Event: event}
	visit := func(u ownership.Unit) {
		if !c.carries(u) {
			return
		}
		r.Counted++
		switch n := pulls[u]; {
		case n == 0:
			r.Unowned++
			r.UnownedUnits = append(r.UnownedUnits, u)
			if waiting[u] {
				r.Waiting++
			} else {
				r.Stranded++
			}
		case n > 1:
			r.Multi++
			r.MultiUnits = append(r.MultiUnits, u)
		}
	}
	for _, u := range c.from.Units() {
		visit(u)
	}
	for _, u := range c.publishing.Units() {
		if !c.from.Contains(u) {
			visit(u)
		}
	}
	slices.SortFunc(r.MultiUnits, ownership.CompareUnits)
	slices.SortFunc(r.UnownedUnits, ownership.CompareUnits)
	return r
}
