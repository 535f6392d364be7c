package ownership

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Promise names what an InvariantError says a plan breaks.
type Promise string

// Promises a plan is checked against.
const (
	// PromiseOneOwner is P1: at no instant do two members hold a claim on
	// one unit.
	PromiseOneOwner Promise = "P1"
	// PromiseOneUnitSet is P2: no claim decision is taken under epoch e by
	// one member while another takes one under e+1.
	PromiseOneUnitSet Promise = "P2"
	// PromiseWellFormed means a step cannot run as written (releasing a
	// unit its From does not hold, restarting a pod that holds units), or
	// the plan does not end at its target.
	PromiseWellFormed Promise = "well-formed"
)

// InvariantError says which step of a plan breaks which promise, and how.
type InvariantError struct {
	Promise Promise
	// Step is the index of the step in the plan; -1 for the plan's end.
	Step   int
	Name   StepName
	Detail string
}

// Error says which promise broke, at which step, and how.
func (e *InvariantError) Error() string {
	if e.Step < 0 {
		return fmt.Sprintf("%s broken at the end of the plan: %s", e.Promise, e.Detail)
	}
	return fmt.Sprintf("%s broken at step %d (%s): %s", e.Promise, e.Step, e.Name, e.Detail)
}

// State is the fleet as plans see it between two steps: the active epoch,
// whether members are frozen, who is live with which slot, and who holds
// each unit. Holders is a list, not one name, so that a broken plan shows
// up as a unit with two holders instead of being hidden.
type State struct {
	ActiveEpoch int64
	Frozen      bool
	// Acked is the epoch each live member acknowledged at the last freeze.
	Acked   map[string]int64
	Live    map[string]Slot
	Holders map[Unit][]string
	// Retired are units whose consumers a Retire step deleted.
	Retired map[Unit]bool
}

// NewState returns the state of a fleet at rest under epoch: members live,
// claims held, nothing frozen.
func NewState(epoch int64, members []Member, claims Claims) (*State, error) {
	if err := validateMembers(members); err != nil {
		return nil, err
	}
	s := &State{
		ActiveEpoch: epoch,
		Acked:       map[string]int64{},
		Live:        make(map[string]Slot, len(members)),
		Holders:     make(map[Unit][]string, len(claims)),
		Retired:     map[Unit]bool{},
	}
	for _, m := range members {
		s.Live[m.Name] = m.Slot
	}
	for u, m := range claims {
		if _, ok := s.Live[m]; !ok {
			return nil, fmt.Errorf("%w: unit %s is claimed by %q, which is not a live member", ErrInvalidPlanInput, u, m)
		}
		s.Holders[u] = []string{m}
	}
	return s, nil
}

// Clone returns a deep copy.
func (s *State) Clone() *State {
	c := &State{
		ActiveEpoch: s.ActiveEpoch,
		Frozen:      s.Frozen,
		Acked:       maps.Clone(s.Acked),
		Live:        maps.Clone(s.Live),
		Holders:     make(map[Unit][]string, len(s.Holders)),
		Retired:     maps.Clone(s.Retired),
	}
	for u, h := range s.Holders {
		c.Holders[u] = slices.Clone(h)
	}
	return c
}

// Claims returns who holds each unit (the first holder, should a broken
// plan have given a unit two).
func (s *State) Claims() Claims {
	c := make(Claims, len(s.Holders))
	for u, h := range s.Holders {
		if len(h) > 0 {
			c[u] = h[0]
		}
	}
	return c
}

// Members returns the live members, by slot. Ordinals are not tracked by
// State and are zero.
func (s *State) Members() []Member {
	out := make([]Member, 0, len(s.Live))
	for name, slot := range s.Live {
		out = append(out, Member{Name: name, Slot: slot})
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(int(a.Slot), int(b.Slot)) })
	return out
}

// Apply runs one step. It always applies what it can, so a simulator sees
// the consequences of a broken plan, and returns an error joining one
// *InvariantError per promise the step breaks.
func (s *State) Apply(index int, st Step) error {
	rule, ok := stepRules[st.Name]
	if !ok {
		return &InvariantError{Promise: PromiseWellFormed, Step: index, Name: st.Name, Detail: "unknown step"}
	}
	var errs []error
	report := func(p Promise, format string, args ...any) {
		errs = append(errs, &InvariantError{Promise: p, Step: index, Name: st.Name, Detail: fmt.Sprintf(format, args...)})
	}
	if rule.decides {
		s.checkDecision(st, report)
	}
	rule.apply(s, st, report)
	s.checkOneOwner(st, report)
	return errors.Join(errs...)
}

// reporter records one broken promise.
type reporter func(p Promise, format string, args ...any)

// checkDecision enforces P2 for a step that takes claim decisions: it must
// be taken under the active epoch, and not while members are frozen.
func (s *State) checkDecision(st Step, report reporter) {
	if st.Epoch != s.ActiveEpoch {
		report(PromiseOneUnitSet, "decides under epoch %d while epoch %d is active", st.Epoch, s.ActiveEpoch)
	}
	if s.Frozen {
		report(PromiseOneUnitSet, "decides while members are frozen for an epoch change")
	}
}

// checkOneOwner enforces P1 after every step, for the units the step moved.
func (s *State) checkOneOwner(st Step, report reporter) {
	for _, mv := range st.Moves {
		if h := s.Holders[mv.Unit]; len(h) > 1 {
			report(PromiseOneOwner, "unit %s is held by %v", mv.Unit, h)
		}
	}
}
