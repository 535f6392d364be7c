package ownership

import (
	"fmt"
	"slices"
)

// CheckPlan replays p from start, a state the caller keeps (it is cloned),
// and returns the first step that breaks P1 or P2 or cannot run, as an
// *InvariantError (possibly several joined). It also checks that the plan
// ends where it says: its ToEpoch active, every unit of To held by the one
// member placement names, and no unit outside To held.
func CheckPlan(start *State, p Plan) error {
	s := start.Clone()
	if s.ActiveEpoch != p.FromEpoch {
		return &InvariantError{Promise: PromiseWellFormed, Step: -1, Detail: fmt.Sprintf("plan starts at epoch %d but epoch %d is active", p.FromEpoch, s.ActiveEpoch)}
	}
	for i, st := range p.Steps {
		if err := s.Apply(i, st); err != nil {
			return err
		}
	}
	return checkEnd(s, p)
}

func checkEnd(s *State, p Plan) error {
	fail := func(format string, args ...any) error {
		return &InvariantError{Promise: PromiseWellFormed, Step: -1, Detail: fmt.Sprintf(format, args...)}
	}
	if s.ActiveEpoch != p.ToEpoch || s.Frozen {
		return fail("epoch %d active (frozen %t), want %d", s.ActiveEpoch, s.Frozen, p.ToEpoch)
	}
	owner := ownerFunc(p.To, s.Members())
	for _, u := range p.To.Units() {
		if h := s.Holders[u]; len(h) != 1 || h[0] != owner(u) {
			return fail("unit %s is held by %v, placement names %s", u, h, owner(u))
		}
	}
	for u, h := range s.Holders {
		if !p.To.Contains(u) && len(h) > 0 {
			return fail("unit %s is outside %s but held by %v", u, p.To, h)
		}
	}
	if missing := unretired(s, p); len(missing) > 0 {
		return fail("units %v left the topology but were not retired", missing)
	}
	return nil
}

func unretired(s *State, p Plan) []Unit {
	var out []Unit
	for _, u := range Diff(p.From, p.To).Removed {
		if !s.Retired[u] {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, CompareUnits)
	return out
}
