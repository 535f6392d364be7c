package ownership

import (
	"errors"
	"slices"
	"testing"
)

// TestCheckPlanCatchesBrokenPlans breaks a good plan in the ways a planner
// could, and expects the checker to name the promise each breaks.
// checks P1, checks P2
func TestCheckPlanCatchesBrokenPlans(t *testing.T) {
	members := fleet(3)
	from, to := Topology{2, 4}, Topology{2, 8}
	claims := ClaimsOf(from, members)
	change, err := PlanChange(ChangeInput{Epoch: 1, From: from, To: to, Members: members, Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	if len(change.Steps[2].Moves) == 0 {
		t.Fatal("test needs a change that hands units over")
	}
	roll, err := PlanRoll(RollInput{Epoch: 1, Topology: from, Members: members, Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		plan   Plan
		mutate func(p *Plan)
		want   Promise
	}{
		{"claim before the owner released", change, func(p *Plan) { p.Steps[2], p.Steps[3] = p.Steps[3], p.Steps[2] }, PromiseOneOwner},
		{"activate without a freeze", change, func(p *Plan) { p.Steps = slices.Delete(p.Steps, 0, 1) }, PromiseOneUnitSet},
		{"claim during the freeze", change, func(p *Plan) { p.Steps[1], p.Steps[3] = p.Steps[3], p.Steps[1] }, PromiseOneUnitSet},
		{"claim under the old epoch", change, func(p *Plan) { p.Steps[3].Epoch = 1 }, PromiseOneUnitSet},
		{"skip an epoch", change, func(p *Plan) { p.Steps[1].Epoch = 3 }, PromiseOneUnitSet},
		{"restart a pod that still holds units", roll, func(p *Plan) { p.Steps = slices.Delete(p.Steps, 0, 3) }, PromiseWellFormed},
		{"rejoin on a taken slot", roll, func(p *Plan) { s := Slot(0); p.Steps[4].Slot = &s }, PromiseWellFormed},
		{"stop before the target", change, func(p *Plan) { p.Steps = p.Steps[:3] }, PromiseWellFormed},
		{"unknown step", change, func(p *Plan) { p.Steps[0].Name = "Teleport" }, PromiseWellFormed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := clonePlan(tt.plan)
			tt.mutate(&p)
			start, err := NewState(1, members, claims)
			if err != nil {
				t.Fatal(err)
			}
			err = CheckPlan(start, p)
			var ie *InvariantError
			if !errors.As(err, &ie) || !hasPromise(err, tt.want) {
				t.Fatalf("CheckPlan = %v, want a %s violation", err, tt.want)
			}
		})
	}
}

// TestStateShowsTwoOwners checks that a claim on a held unit is applied, so
// a simulator can count the unit as multiply-owned, and reported as P1.
// checks P1
func TestStateShowsTwoOwners(t *testing.T) {
	s, err := NewState(1, fleet(2), Claims{{Partition: 0, Shard: 0}: "w-0"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Apply(0, Step{Name: StepClaim, Epoch: 1, Moves: []Move{{Unit: Unit{Partition: 0, Shard: 0}, To: "w-1"}}})
	if !hasPromise(err, PromiseOneOwner) {
		t.Fatalf("Apply = %v, want P1", err)
	}
	if h := s.Holders[Unit{Partition: 0, Shard: 0}]; len(h) != 2 {
		t.Fatalf("holders %v, want both", h)
	}
}

func hasPromise(err error, p Promise) bool {
	var found bool
	var walk func(error)
	walk = func(e error) {
		var ie *InvariantError
		if errors.As(e, &ie) && ie.Promise == p {
			found = true
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return found
}

func clonePlan(p Plan) Plan {
	c := p
	c.Steps = slices.Clone(p.Steps)
	return c
}
