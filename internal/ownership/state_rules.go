package ownership

import "slices"

// stepRule is one row of the rollout state machine.
type stepRule struct {
	// decides marks steps that take claim decisions, which P2 ties to the
	// active epoch and forbids while frozen.
	decides bool
	// apply changes the state and reports what the step breaks.
	apply func(s *State, st Step, report reporter)
}

// stepRules is the rollout state machine as data: each step's effect on the
// state, and the conditions it needs. The controller and the simulator run
// plans through it; CheckPlan uses it to judge them.
var stepRules = map[StepName]stepRule{
	StepFreeze:      {apply: applyFreeze},
	StepActivate:    {apply: applyActivate},
	StepHandOver:    {decides: true, apply: applyRelease},
	StepClaim:       {decides: true, apply: applyClaim},
	StepRetire:      {decides: true, apply: applyRetire},
	StepVerifyEmpty: {apply: applyVerifyEmpty},
	StepRestart:     {apply: applyRestart},
	StepRejoin:      {apply: applyRejoin},
}

func applyFreeze(s *State, st Step, report reporter) {
	if st.Epoch != s.ActiveEpoch {
		report(PromiseOneUnitSet, "acknowledges epoch %d while epoch %d is active", st.Epoch, s.ActiveEpoch)
	}
	s.Frozen = true
	for m := range s.Live {
		s.Acked[m] = s.ActiveEpoch
	}
}

// applyActivate needs every live member frozen under the active epoch:
// that is what keeps anyone from deciding under e while others decide
// under e+1.
func applyActivate(s *State, st Step, report reporter) {
	if !s.Frozen {
		report(PromiseOneUnitSet, "activates epoch %d without a freeze", st.Epoch)
	}
	if st.Epoch != s.ActiveEpoch+1 {
		report(PromiseOneUnitSet, "activates epoch %d after epoch %d", st.Epoch, s.ActiveEpoch)
	}
	for m := range s.Live {
		if a, ok := s.Acked[m]; !ok || a != s.ActiveEpoch {
			report(PromiseOneUnitSet, "member %s has not acknowledged epoch %d", m, s.ActiveEpoch)
		}
	}
	s.ActiveEpoch = st.Epoch
	s.Frozen = false
	clear(s.Acked)
}

func applyRelease(s *State, st Step, report reporter) {
	for _, mv := range st.Moves {
		if !s.release(mv.Unit, mv.From) {
			report(PromiseWellFormed, "%s releases unit %s, which it does not hold", mv.From, mv.Unit)
		}
	}
}

// applyClaim reports P1 when the unit is still held: the new owner would
// claim before the old one released.
func applyClaim(s *State, st Step, report reporter) {
	for _, mv := range st.Moves {
		if _, ok := s.Live[mv.To]; !ok {
			report(PromiseWellFormed, "unit %s is claimed by %q, which is not live", mv.Unit, mv.To)
		}
		if s.Retired[mv.Unit] {
			report(PromiseWellFormed, "unit %s is claimed after it was retired", mv.Unit)
		}
		if h := s.Holders[mv.Unit]; len(h) > 0 {
			report(PromiseOneOwner, "%s claims unit %s while %v still holds it", mv.To, mv.Unit, h)
		}
		s.Holders[mv.Unit] = append(s.Holders[mv.Unit], mv.To)
	}
}

func applyRetire(s *State, st Step, report reporter) {
	for _, mv := range st.Moves {
		if mv.From != "" && !s.release(mv.Unit, mv.From) {
			report(PromiseWellFormed, "%s retires unit %s, which it does not hold", mv.From, mv.Unit)
		}
		if h := s.Holders[mv.Unit]; len(h) > 0 {
			report(PromiseWellFormed, "unit %s is retired while %v holds it", mv.Unit, h)
		}
		s.Retired[mv.Unit] = true
	}
}

func applyVerifyEmpty(s *State, st Step, report reporter) {
	if n := s.heldCount(st.Member); n > 0 {
		report(PromiseWellFormed, "%s still holds %d units", st.Member, n)
	}
}

// applyRestart reports a pod deleted while it holds units: its units would
// stay claimed by a process that no longer runs.
func applyRestart(s *State, st Step, report reporter) {
	if _, ok := s.Live[st.Member]; !ok {
		report(PromiseWellFormed, "%s restarts but is not live", st.Member)
	}
	if n := s.heldCount(st.Member); n > 0 {
		report(PromiseWellFormed, "%s restarts while it holds %d units", st.Member, n)
	}
	delete(s.Live, st.Member)
	delete(s.Acked, st.Member)
}

func applyRejoin(s *State, st Step, report reporter) {
	if _, ok := s.Live[st.Member]; ok {
		report(PromiseWellFormed, "%s rejoins but is already live", st.Member)
	}
	if st.Slot == nil || *st.Slot < 0 {
		report(PromiseWellFormed, "%s rejoins without a slot", st.Member)
		return
	}
	for m, slot := range s.Live {
		if slot == *st.Slot {
			report(PromiseWellFormed, "%s rejoins with slot %d, which %s holds", st.Member, slot, m)
		}
	}
	s.Live[st.Member] = *st.Slot
	if s.Frozen {
		// A member that joins during a freeze reads the active epoch and
		// is frozen like the rest.
		s.Acked[st.Member] = s.ActiveEpoch
	}
}

// release removes member from u's holders and reports whether it held u.
func (s *State) release(u Unit, member string) bool {
	h := s.Holders[u]
	i := slices.Index(h, member)
	if i < 0 {
		return false
	}
	h = slices.Delete(h, i, i+1)
	if len(h) == 0 {
		delete(s.Holders, u)
	} else {
		s.Holders[u] = h
	}
	return true
}

func (s *State) heldCount(member string) int {
	n := 0
	for _, h := range s.Holders {
		if slices.Contains(h, member) {
			n++
		}
	}
	return n
}
