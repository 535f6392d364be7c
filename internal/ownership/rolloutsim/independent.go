package rolloutsim

import (
	"fmt"
	"slices"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// worker is one independent worker: the topology it started with, whether
// it runs, and the slots it believes live.
type worker struct {
	topology ownership.Topology
	up       bool
	// started marks a pod that started in the current step; it lists the
	// members of that moment instead of lagging.
	started bool
	view    []ownership.Slot
}

// independentSim replays a scenario under the independent strategy.
type independentSim struct {
	membership Membership
	views      Views
	// fixed is the slot set 0..Members-1 that Fixed membership places
	// over.
	fixed   []ownership.Slot
	workers []worker
	counter *counter
	// prev is the live membership after the previous step, which stale
	// views still see.
	prev []ownership.Slot
	run  Run
}

// Independent replays the scenario with every worker placing on its own
// (see the package doc).
func Independent(sc Scenario) (Run, error) {
	if err := sc.Validate(); err != nil {
		return Run{}, err
	}
	membership, views := sc.Model()
	s := &independentSim{
		membership: membership,
		views:      views,
		fixed:      make([]ownership.Slot, sc.Members),
		workers:    make([]worker, sc.Members),
		counter:    &counter{publishing: sc.From, from: sc.From},
		run:        Run{Strategy: "independent"},
	}
	for i := range s.workers {
		s.workers[i] = worker{topology: sc.From, up: true}
		s.fixed[i] = ownership.Slot(i)
	}
	s.prev = s.live()
	s.step("start", func() {})
	for _, k := range sc.RestartOrder() {
		s.step("stop "+PodName(k), func() { s.workers[k].up = false })
		s.step(fmt.Sprintf("start %s on %s", PodName(k), sc.To), func() {
			s.workers[k] = worker{topology: sc.To, up: true, started: true}
		})
	}
	last := "publishers on " + sc.To.String()
	if membership == Live {
		last = "views settled, " + last
	}
	s.step(last, func() { s.counter.publishing = sc.To })
	return s.run, nil
}

// step applies one change to the fleet, updates every view, and counts.
func (s *independentSim) step(event string, change func()) {
	change()
	now := s.live()
	for i := range s.workers {
		w := &s.workers[i]
		switch {
		case !w.up:
			w.view = nil
		case s.membership == Fixed:
			w.view = s.fixed
		case w.started || s.views == Fresh:
			w.view, w.started = now, false
		default:
			w.view = s.prev
		}
	}
	row := s.counter.row(event, s.pulls(), nil)
	row.AllUp = len(now) == len(s.workers)
	s.run.Rows = append(s.run.Rows, row)
	s.prev = now
}

func (s *independentSim) live() []ownership.Slot {
	var out []ownership.Slot
	for i, w := range s.workers {
		if w.up {
			out = append(out, ownership.Slot(i))
		}
	}
	return out
}

// pulls counts, per unit, the workers that pull it: each running worker
// pulls what placement of its own units over its own view (the fixed slots
// under Fixed membership) puts on its slot.
// Workers that share a topology and a view share one placement.
func (s *independentSim) pulls() map[ownership.Unit]int {
	out := map[ownership.Unit]int{}
	type key struct {
		t    ownership.Topology
		view string
	}
	cache := map[key]ownership.Placement{}
	for i, w := range s.workers {
		if !w.up {
			continue
		}
		k := key{w.topology, fmt.Sprint(w.view)}
		pl, ok := cache[k]
		if !ok {
			pl = ownership.Place(w.topology.Units(), slices.Clone(w.view))
			cache[k] = pl
		}
		for _, u := range pl.UnitsOf(ownership.Slot(i)) {
			out[u]++
		}
	}
	return out
}
