package controllers

import (
	"slices"
	"testing"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// TestEveryChangeStateEndsWithAnUnguardedRule keeps the table total: in
// every state some row applies, whatever the guards say.
func TestEveryChangeStateEndsWithAnUnguardedRule(t *testing.T) {
	states := []changeState{stateUnprovisioned, stateProposed, stateChangeWanted, stateFreezing, stateStalePending, stateClaiming, stateRetiring, stateSteady}
	for _, st := range states {
		var last *changeRule
		for i := range changeRules {
			if changeRules[i].state == st {
				last = &changeRules[i]
			}
		}
		if last == nil || last.guard != "" {
			t.Errorf("state %s has no unguarded last rule", st)
		}
	}
}

func TestDecideTopologyChange(t *testing.T) {
	epoch := func(n int64, p, s int, state poolctl.EpochState, acked ...string) *poolctl.Epoch {
		return &poolctl.Epoch{Number: n, Partitions: p, Shards: s, State: state, Acked: acked}
	}
	live := []poolctl.Member{{Name: "a", Live: true, Slot: 0}, {Name: "b", Live: true, Slot: 1}}
	to := ownership.Topology{Partitions: 2, Shards: 8}
	active := epoch(1, 2, 4, poolctl.EpochActive)
	removed := []ownership.Unit{{Partition: 0, Shard: 7}}
	tests := []struct {
		name   string
		w      changeWorld
		state  changeState
		action string
	}{
		{"nothing yet: provision and write the first epoch", changeWorld{target: to}, stateUnprovisioned, "StartEpoch"},
		{"nothing yet, paused: hold", changeWorld{target: to, paused: true}, stateUnprovisioned, "Hold"},
		{"nothing yet, abort: nothing to go back to", changeWorld{target: to, abort: true}, stateUnprovisioned, "HoldAborted"},
		// checks P2: activation waits for every live member's ack.
		{"pending, one member has not acknowledged: wait", changeWorld{target: to, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending, "a"), live: live},
			stateFreezing, "WaitForAcks"},
		{"pending, every live member acknowledged: activate", changeWorld{target: to, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending, "a", "b"), live: live},
			stateFreezing, "Activate"},
		// Pause does not hold a freeze: claims are frozen while it lasts.
		{"pending and acknowledged while paused: the freeze is finished, not held", changeWorld{target: to, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending, "a", "b"), live: live, paused: true},
			stateFreezing, "Activate"},
		{"pending while paused, one member has not acknowledged: wait for it", changeWorld{target: to, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending, "a"), live: live, paused: true},
			stateFreezing, "WaitForAcks"},
		// An ordered change's pending epoch without its barrier (written
		// before ordering was PerKey): members may have acknowledged the
		// freeze without the barrier, so it is written again with one.
		{"ordered change pending without its order barrier: retire it, before any activation", changeWorld{target: to, active: active,
			pending: epoch(2, 2, 8, poolctl.EpochPending, "a", "b"), live: live, unbarriered: true}, stateFreezing, "RetirePending"},
		{"the first epoch pending with no member: activate", changeWorld{target: to, pending: epoch(1, 2, 8, poolctl.EpochPending)}, stateFreezing, "Activate"},
		{"pending epoch the spec no longer wants: retire it", changeWorld{target: ownership.Topology{Partitions: 2, Shards: 4}, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending), live: live},
			stateStalePending, "RetirePending"},
		{"abort annotation while pending: retire it, even paused", changeWorld{target: to, active: active, pending: epoch(2, 2, 8, poolctl.EpochPending), abort: true, paused: true},
			stateStalePending, "RetirePending"},
		{"spec differs from the active epoch: start a change", changeWorld{target: to, active: active, live: live}, stateChangeWanted, "StartEpoch"},
		{"spec differs while a pod is in flight: wait for it", changeWorld{target: to, active: active, podsInFlight: []string{"w-2"}}, stateChangeWanted, "WaitForPods"},
		{"spec differs while the last change's order barrier holds moved keys: wait for it", changeWorld{target: to, active: active, live: live, barrier: true},
			stateChangeWanted, "WaitForBarrier"},
		{"spec differs and abort is set: hold the active epoch", changeWorld{target: to, active: active, abort: true}, stateChangeWanted, "HoldAborted"},
		{"spec differs and paused: hold", changeWorld{target: to, active: active, paused: true}, stateChangeWanted, "Hold"},
		{"manual approval, no annotation: publish the plan and wait", changeWorld{target: to, active: active, live: live, manual: true}, stateProposed, "Propose"},
		{"manual approval naming another plan: refuse and wait", changeWorld{target: to, active: active, live: live, manual: true, approval: approvalStale},
			stateProposed, "RefuseApproval"},
		{"manual approval, abort set: hold the active epoch", changeWorld{target: to, active: active, manual: true, approval: approvalStale, abort: true},
			stateProposed, "HoldAborted"},
		{"manual approval of the current plan: start the change", changeWorld{target: to, active: active, live: live, manual: true, approval: approvalGranted},
			stateChangeWanted, "StartEpoch"},
		{"manual approval while paused: the plan is proposed anyway, nothing moves", changeWorld{target: to, active: active, manual: true, paused: true},
			stateProposed, "Propose"},
		{"new epoch active, units left to retire, not all owned: wait for claims", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive), retire: removed},
			stateClaiming, "WaitForClaims"},
		{"every unit owned and units left: retire them", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive), retire: removed, allOwned: true},
			stateRetiring, "RetireUnits"},
		{"retiring but paused: hold", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive), retire: removed, allOwned: true, paused: true},
			stateRetiring, "Hold"},
		{"after a change, units not all owned: the rollout waits for claims", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive), wasRolling: true},
			stateClaiming, "WaitForClaims"},
		{"steady: keep provisioned", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive), allOwned: true}, stateSteady, "KeepProvisioned"},
		{"steady with no workers: nothing to roll", changeWorld{target: to, active: epoch(2, 2, 8, poolctl.EpochActive)}, stateSteady, "KeepProvisioned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rule := decide(&tt.w)
			if rule.state != tt.state || rule.action.name != tt.action {
				t.Fatalf("decided %s/%s (guard %q), want %s/%s", rule.state, rule.action.name, rule.guard, tt.state, tt.action)
			}
		})
	}
}

// A plan's steps are the API's: ownership spells them out (the worker SDK
// imports it and must not import Kubernetes), so they are checked here.
func TestPlanStepsAreTheAPIs(t *testing.T) {
	for plan, api := range map[ownership.StepName]string{
		ownership.StepFreeze: topologyv1.StepFreeze, ownership.StepActivate: topologyv1.StepActivate,
		ownership.StepHandOver: topologyv1.StepHandOver, ownership.StepClaim: topologyv1.StepClaim, ownership.StepRetire: topologyv1.StepRetire,
	} {
		if string(plan) != api {
			t.Errorf("ownership step %q, API step %q", plan, api)
		}
	}
	p, err := ownership.PlanChange(ownership.ChangeInput{Epoch: 1, From: ownership.Topology{Partitions: 1, Shards: 2}, To: ownership.Topology{Partitions: 1, Shards: 4},
		Members: []ownership.Member{{Name: "a", Slot: 0}}, Claims: ownership.Claims{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range p.Steps {
		if !slices.Contains(topologyv1.TopologySteps, string(st.Name)) {
			t.Errorf("plan step %s is not one of the API's %v", st.Name, topologyv1.TopologySteps)
		}
	}
}

// The hash names everything that decides a plan: the same world gives the
// same hash, and a member's claim moving gives another.
func TestPlanHashChangesWithThePlan(t *testing.T) {
	live := []poolctl.Member{{Name: "a", Live: true, Slot: 0}, {Name: "b", Live: true, Slot: 1}}
	from := ownership.Topology{Partitions: 1, Shards: 4}
	claims := map[string]poolctl.ClaimInfo{}
	for u, owner := range placementOwners(from, live, nil) {
		claims[u] = poolctl.ClaimInfo{Unit: u, Owner: owner, State: poolctl.StateHeld}
	}
	w := &changeWorld{target: ownership.Topology{Partitions: 1, Shards: 8}, active: &poolctl.Epoch{Number: 1, Partitions: 1, Shards: 4}, live: live}
	h1, h2 := planHash(changePlan(w, claims)), planHash(changePlan(w, claims))
	if h1 != h2 || len(h1) != planHashLen {
		t.Fatalf("hashes %q and %q of one world", h1, h2)
	}
	w3 := *w
	w3.live = live[:1]
	if h3 := planHash(changePlan(&w3, claims)); h3 == h1 {
		t.Fatalf("a member leaving kept the hash %s", h1)
	}
	w4 := *w
	w4.target.Shards = 16
	if h4 := planHash(changePlan(&w4, claims)); h4 == h1 {
		t.Fatalf("another target kept the hash %s", h1)
	}
	// After an abort (or a change and revert that reached pending) the
	// registry's next epoch is not active+1: an approval of the earlier
	// plan, to the abandoned epoch, must not approve this one.
	w5, w6 := *w, *w
	w5.nextEpoch, w6.nextEpoch = 2, 3
	if h5, h6 := planHash(changePlan(&w5, claims)), planHash(changePlan(&w6, claims)); h5 == h6 || h5 != h1 {
		t.Fatalf("hash to epoch 2 %s, to epoch 3 %s (active+1 gives %s): want the next epoch's number in the hash", h5, h6, h1)
	}
	if p := changePlan(&w6, claims); p.ToEpoch != 3 {
		t.Fatalf("plan to epoch %d, want the registry's next epoch 3", p.ToEpoch)
	}
	ps := planStatus(changePlan(w, claims), w.active, &topologyv1.RolloutSpec{})
	if ps.UnitsAdded != 4 || ps.UnitsRemoved != 0 || ps.UnitsMoved+ps.UnitsKept != 4 || len(ps.Pods) != 2 || ps.EstimatedDuration == nil {
		t.Fatalf("plan status %+v", ps)
	}
	if want := 2*topologyv1.DefaultRenewInterval + pollFast; ps.UnitsMoved == 0 && ps.EstimatedDuration.Duration != want {
		t.Fatalf("estimate %s without moves, want %s", ps.EstimatedDuration.Duration, want)
	}
}

func TestUnitsToMoveCountsMovedAndAddedUnits(t *testing.T) {
	live := []poolctl.Member{{Name: "a", Live: true, Slot: 0}, {Name: "b", Live: true, Slot: 1}}
	from := ownership.Topology{Partitions: 1, Shards: 4}
	claims := map[string]poolctl.ClaimInfo{}
	for u, owner := range placementOwners(from, live, nil) {
		claims[u] = poolctl.ClaimInfo{Unit: u, Owner: owner, State: poolctl.StateHeld}
	}
	w := &changeWorld{target: ownership.Topology{Partitions: 1, Shards: 8}, active: &poolctl.Epoch{Number: 1, Partitions: 1, Shards: 4}, live: live}
	n := unitsToMove(w, claims)
	if n < 4 || n > 8 {
		t.Fatalf("units to move %d: want the 4 added units plus those that change owner", n)
	}
	if n := unitsToMove(&changeWorld{target: w.target}, nil); n != 8 {
		t.Fatalf("first epoch moves %d units, want all 8", n)
	}
}
