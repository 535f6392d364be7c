package ownership

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// RollInput is what a pod-by-pod roll is planned from.
type RollInput struct {
	// Epoch is the active epoch; a roll does not change it.
	Epoch int64
	// Topology is the active topology.
	Topology Topology
	// Members are the live members; each is restarted once.
	Members []Member
	// Claims are the current claims.
	Claims Claims
	// Order lists member names in restart order. Empty means highest
	// ordinal first, the order a StatefulSet rolls in.
	Order []string
}

// PlanRoll plans restarting every member's pod one at a time. For each pod:
// HandOver and Claim move its units to where placement over the other live
// slots puts them; VerifyEmpty checks it holds nothing; Restart deletes it;
// Rejoin brings the new pod back with its old slot (AssignSlot); HandOver
// and Claim give it its placement back. Other members' units move only
// where the capped placement moves them (see Placement).
func PlanRoll(in RollInput) (Plan, error) {
	order, err := validateRoll(in)
	if err != nil {
		return Plan{}, fmt.Errorf("plan roll of %s: %w", in.Topology, err)
	}
	units := in.Topology.Units()
	claims := in.Claims.Clone()
	live := make(map[string]Member, len(in.Members))
	for _, m := range in.Members {
		live[m.Name] = m
	}
	var steps []Step
	for _, name := range order {
		m := live[name]
		delete(live, name)
		steps = append(steps, rebalance(claims, units, sortedMembers(live), in.Epoch, name)...)
		slot := AssignSlot(m.Slot, takenSlots(live))
		steps = append(steps,
			Step{Name: StepVerifyEmpty, Epoch: in.Epoch, Member: name},
			Step{Name: StepRestart, Epoch: in.Epoch, Member: name},
			Step{Name: StepRejoin, Epoch: in.Epoch, Member: name, Slot: &slot},
		)
		m.Slot = slot
		live[name] = m
		steps = append(steps, rebalance(claims, units, sortedMembers(live), in.Epoch, name)...)
	}
	return Plan{
		Kind:      KindPodRoll,
		FromEpoch: in.Epoch,
		ToEpoch:   in.Epoch,
		From:      in.Topology,
		To:        in.Topology,
		Members:   summarize(in.Topology, in.Topology, in.Members, in.Claims, steps),
		Steps:     steps,
	}, nil
}

// rebalance returns the HandOver and Claim steps that bring claims to the
// placement over members, and applies them to claims.
func rebalance(claims Claims, units []Unit, members []Member, epoch int64, pod string) []Step {
	owner := ownerOver(units, members)
	var handover, claim []Move
	for _, u := range units {
		have, want := claims[u], owner(u)
		if have == want {
			continue
		}
		if have != "" {
			handover = append(handover, Move{Unit: u, From: have, To: want})
			delete(claims, u)
		}
		// With no other member live (a fleet of one), a restarting pod's
		// units wait unclaimed until it rejoins.
		if want != "" {
			claim = append(claim, Move{Unit: u, From: have, To: want})
			claims[u] = want
		}
	}
	return []Step{
		{Name: StepHandOver, Epoch: epoch, Member: pod, Moves: handover},
		{Name: StepClaim, Epoch: epoch, Member: pod, Moves: claim},
	}
}

func ownerOver(units []Unit, members []Member) func(Unit) string {
	pl := Place(units, slotsOf(members))
	bySlot := membersBySlot(members)
	return func(u Unit) string { s, _ := pl.Owner(u); return bySlot[s] }
}

func validateRoll(in RollInput) ([]string, error) {
	if err := in.Topology.Validate(); err != nil {
		return nil, err
	}
	if err := validateMembers(in.Members); err != nil {
		return nil, err
	}
	if err := validateClaims(in.Claims, in.Topology, in.Members); err != nil {
		return nil, err
	}
	if len(in.Order) == 0 {
		return highestOrdinalFirst(in.Members), nil
	}
	return in.Order, validateOrder(in.Order, in.Members)
}

// validateOrder checks that order names every member exactly once.
func validateOrder(order []string, members []Member) error {
	want := make(map[string]bool, len(members))
	for _, m := range members {
		want[m.Name] = true
	}
	for _, name := range order {
		if !want[name] {
			return fmt.Errorf("%w: restart order names %q, which is not a live member or is named twice", ErrInvalidPlanInput, name)
		}
		delete(want, name)
	}
	if len(want) > 0 {
		return fmt.Errorf("%w: restart order leaves out %v", ErrInvalidPlanInput, slices.Sorted(maps.Keys(want)))
	}
	return nil
}

func highestOrdinalFirst(members []Member) []string {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int {
		return cmp.Or(cmp.Compare(b.Ordinal, a.Ordinal), cmp.Compare(b.Name, a.Name))
	})
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

func sortedMembers(live map[string]Member) []Member {
	ms := slices.Collect(maps.Values(live))
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Slot, b.Slot) })
	return ms
}

func takenSlots(live map[string]Member) map[Slot]bool {
	out := make(map[Slot]bool, len(live))
	for _, m := range live {
		out[m.Slot] = true
	}
	return out
}
