package ownership

import (
	"fmt"
	"slices"
)

// ChangeInput is what a topology change is planned from.
type ChangeInput struct {
	// Epoch is the active epoch e; the plan activates e+1.
	Epoch int64
	// From is the active topology, To the target.
	From, To Topology
	// Members are the live members.
	Members []Member
	// Claims are the current claims, all on units of From and held by
	// live members.
	Claims Claims
}

// PlanChange plans a topology change from epoch e to e+1: Freeze (nobody
// takes claims under e any more), Activate (e+1), HandOver (units whose
// owner under e+1 differs are released), Claim (moved and added units are
// claimed by their owner under e+1), Retire (units that left are drained and
// released).
//
// It keeps P1 because a moved unit is released in HandOver before it is
// claimed in Claim, and P2 because nothing is claimed between Freeze and
// Activate. A unit whose current owner is also its owner under e+1 appears
// in no step: it never stops.
func PlanChange(in ChangeInput) (Plan, error) {
	if err := validateChange(in); err != nil {
		return Plan{}, fmt.Errorf("plan change %s to %s: %w", in.From, in.To, err)
	}
	next := in.Epoch + 1
	owner := ownerFunc(in.To, in.Members)
	d := Diff(in.From, in.To)
	var handover, claim, retire []Move
	for _, u := range d.Kept {
		have, want := in.Claims[u], owner(u)
		if have == want {
			continue
		}
		if have != "" {
			handover = append(handover, Move{Unit: u, From: have, To: want})
		}
		claim = append(claim, Move{Unit: u, From: have, To: want})
	}
	for _, u := range d.Added {
		claim = append(claim, Move{Unit: u, To: owner(u)})
	}
	slices.SortFunc(claim, compareMoves)
	for _, u := range d.Removed {
		retire = append(retire, Move{Unit: u, From: in.Claims[u]})
	}
	steps := []Step{
		{Name: StepFreeze, Epoch: in.Epoch},
		{Name: StepActivate, Epoch: next},
		{Name: StepHandOver, Epoch: next, Moves: handover},
		{Name: StepClaim, Epoch: next, Moves: claim},
		{Name: StepRetire, Epoch: next, Moves: retire},
	}
	return Plan{
		Kind:      KindTopologyChange,
		FromEpoch: in.Epoch,
		ToEpoch:   next,
		From:      in.From,
		To:        in.To,
		Members:   summarize(in.From, in.To, in.Members, in.Claims, steps),
		Steps:     steps,
	}, nil
}

func validateChange(in ChangeInput) error {
	if err := in.From.Validate(); err != nil {
		return fmt.Errorf("from: %w", err)
	}
	if err := in.To.Validate(); err != nil {
		return fmt.Errorf("to: %w", err)
	}
	if err := validateMembers(in.Members); err != nil {
		return err
	}
	return validateClaims(in.Claims, in.From, in.Members)
}

// ownerFunc returns the member that placement over members' slots gives
// each unit of t.
func ownerFunc(t Topology, members []Member) func(Unit) string {
	pl := Place(t.Units(), slotsOf(members))
	bySlot := membersBySlot(members)
	return func(u Unit) string {
		s, ok := pl.Owner(u)
		if !ok {
			return ""
		}
		return bySlot[s]
	}
}

func compareMoves(a, b Move) int {
	return CompareUnits(a.Unit, b.Unit)
}
