package ownership

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// drawChange draws a topology change of a random fleet from random claims.
func drawChange(t *rapid.T) ChangeInput {
	from, to := genTopology(5, 24).Draw(t, "from"), genTopology(5, 24).Draw(t, "to")
	members := genMembers(10).Draw(t, "members")
	return ChangeInput{
		Epoch:   int64(rapid.IntRange(1, 1000).Draw(t, "epoch")),
		From:    from,
		To:      to,
		Members: members,
		Claims:  drawClaims(t, from, members),
	}
}

// TestPlanChangeKeepsPromises runs every planned topology change through the
// checker: no step gives a unit two owners, nothing is claimed under two
// epochs at once, and the plan ends with every unit of the target held by
// its placement owner and every unit that left retired.
// checks P1, checks P2
func TestPlanChangeKeepsPromises(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := drawChange(t)
		p, err := PlanChange(in)
		if err != nil {
			t.Fatalf("PlanChange: %v", err)
		}
		start, err := NewState(in.Epoch, in.Members, in.Claims)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckPlan(start, p); err != nil {
			t.Fatalf("plan %s -> %s: %v", in.From, in.To, err)
		}
	})
}

// TestPlanChangeNeverStopsUnmovedUnits checks design.md section 8: a unit
// whose owner does not change appears in no step, and HandOver moves only
// units whose owner changes.
func TestPlanChangeNeverStopsUnmovedUnits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := drawChange(t)
		p, err := PlanChange(in)
		if err != nil {
			t.Fatal(err)
		}
		owner := ownerFunc(in.To, in.Members)
		for _, st := range p.Steps {
			for _, mv := range st.Moves {
				if have := in.Claims[mv.Unit]; have != "" && in.To.Contains(mv.Unit) && have == owner(mv.Unit) {
					t.Fatalf("step %s moves unit %s, whose owner %s does not change", st.Name, mv.Unit, have)
				}
				if st.Name == StepHandOver && mv.From == mv.To {
					t.Fatalf("HandOver of %s from %s to itself", mv.Unit, mv.From)
				}
			}
		}
	})
}

// TestPlanChangeSummaryAddsUp checks each member's counts against the
// claims before and after.
func TestPlanChangeSummaryAddsUp(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := drawChange(t)
		p, err := PlanChange(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Members {
			if m.Kept+m.MovedOut+m.Retired != m.Before || m.Kept+m.MovedIn+m.Added != m.After {
				t.Fatalf("member %+v does not add up", m)
			}
		}
		tot := p.Totals()
		if tot.Before != len(in.Claims) || tot.After != in.To.Len() || tot.Added != len(Diff(in.From, in.To).Added) {
			t.Fatalf("totals %+v, claims %d, target %d units", tot, len(in.Claims), in.To.Len())
		}
	})
}

func TestPlanChangeStepsInOrder(t *testing.T) {
	members := fleet(4)
	from, to := Topology{4, 16}, Topology{4, 8}
	p, err := PlanChange(ChangeInput{Epoch: 7, From: from, To: to, Members: members, Claims: ClaimsOf(from, members)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range p.Steps {
		got = append(got, fmt.Sprintf("%s@%d", st.Name, st.Epoch))
	}
	want := []string{"Freeze@7", "Activate@8", "HandOver@8", "Claim@8", "Retire@8"}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if n := len(p.Steps[4].Moves); n != 32 {
		t.Fatalf("Retire moves %d units, want the 32 that left", n)
	}
}

func drawRoll(t *rapid.T) RollInput {
	top := genTopology(4, 24).Draw(t, "topology")
	members := genMembers(8).Draw(t, "members")
	var order []string
	if rapid.Bool().Draw(t, "customOrder") {
		for _, m := range rapid.Permutation(members).Draw(t, "order") {
			order = append(order, m.Name)
		}
	}
	return RollInput{Epoch: 3, Topology: top, Members: members, Claims: drawClaims(t, top, members), Order: order}
}

// TestPlanRollKeepsPromises runs every planned pod roll through the checker:
// each pod holds nothing when it restarts, no unit ever has two owners, and
// the fleet ends at its placement.
// checks P1, checks P2
func TestPlanRollKeepsPromises(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := drawRoll(t)
		p, err := PlanRoll(in)
		if err != nil {
			t.Fatalf("PlanRoll: %v", err)
		}
		start, err := NewState(in.Epoch, in.Members, in.Claims)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckPlan(start, p); err != nil {
			t.Fatalf("roll of %d members: %v", len(in.Members), err)
		}
		for _, st := range p.Steps {
			if st.Name == StepRejoin && *st.Slot != slotOf(in.Members, st.Member) {
				t.Fatalf("%s rejoined with slot %d, had %d", st.Member, *st.Slot, slotOf(in.Members, st.Member))
			}
		}
	})
}

func TestPlanRollGoesHighestOrdinalFirst(t *testing.T) {
	members := fleet(3)
	slices.Reverse(members) // input order must not matter
	p, err := PlanRoll(RollInput{Epoch: 1, Topology: Topology{2, 6}, Members: members, Claims: ClaimsOf(Topology{2, 6}, members)})
	if err != nil {
		t.Fatal(err)
	}
	var restarts []string
	for _, st := range p.Steps {
		if st.Name == StepRestart {
			restarts = append(restarts, st.Member)
		}
	}
	if want := []string{"w-2", "w-1", "w-0"}; !slices.Equal(restarts, want) {
		t.Fatalf("restart order %v, want %v", restarts, want)
	}
	per := []StepName{StepHandOver, StepClaim, StepVerifyEmpty, StepRestart, StepRejoin, StepHandOver, StepClaim}
	for i, st := range p.Steps[:len(per)] {
		if st.Name != per[i] || st.Member != "w-2" {
			t.Fatalf("step %d is %s %s, want %s w-2", i, st.Name, st.Member, per[i])
		}
	}
}

func TestPlannersRejectBadInput(t *testing.T) {
	top := Topology{2, 2}
	ms := fleet(2)
	tests := []struct {
		name string
		plan func() error
	}{
		{"no members", func() error { return changeErr(ChangeInput{From: top, To: top}) }},
		{"invalid target", func() error { return changeErr(ChangeInput{From: top, To: Topology{0, 1}, Members: ms}) }},
		{"duplicate name", func() error {
			return changeErr(ChangeInput{From: top, To: top, Members: []Member{{Name: "a", Slot: 0}, {Name: "a", Slot: 1}}})
		}},
		{"shared slot", func() error {
			return changeErr(ChangeInput{From: top, To: top, Members: []Member{{Name: "a", Slot: 0}, {Name: "b", Slot: 0}}})
		}},
		{"member without slot", func() error {
			return changeErr(ChangeInput{From: top, To: top, Members: []Member{{Name: "a", Slot: NoSlot}}})
		}},
		{"claim outside the topology", func() error {
			return changeErr(ChangeInput{From: top, To: top, Members: ms, Claims: Claims{{Partition: 5, Shard: 0}: "w-0"}})
		}},
		{"claim by a member that is not live", func() error {
			return changeErr(ChangeInput{From: top, To: top, Members: ms, Claims: Claims{{Partition: 0, Shard: 0}: "gone"}})
		}},
		{"roll order with a stranger", func() error {
			_, err := PlanRoll(RollInput{Topology: top, Members: ms, Order: []string{"w-0", "x"}})
			return err
		}},
		{"roll order missing a member", func() error {
			_, err := PlanRoll(RollInput{Topology: top, Members: ms, Order: []string{"w-0"}})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.plan(); !errors.Is(err, ErrInvalidPlanInput) && !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("error %v, want ErrInvalidPlanInput or ErrInvalidTopology", err)
			}
		})
	}
}

func changeErr(in ChangeInput) error {
	_, err := PlanChange(in)
	return err
}

// fleet returns members w-0..w-(n-1) with ordinal and slot i.
func fleet(n int) []Member {
	out := make([]Member, n)
	for i := range out {
		out[i] = Member{Name: fmt.Sprintf("w-%d", i), Ordinal: i, Slot: Slot(i)}
	}
	return out
}

func slotOf(members []Member, name string) Slot {
	for _, m := range members {
		if m.Name == name {
			return m.Slot
		}
	}
	return NoSlot
}
