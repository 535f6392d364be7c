package controllers

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// registryNow is the registry's clock in the pure tests.
var registryNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// registryWith is a registry view whose active epoch (when n > 0) is n x v,
// with live members w-0..w-(members-1) and the first owned units held,
// each reported pulled just now by its owner (flowing).
func registryWith(n, v, members, owned int, pending *poolctl.Epoch) *registryView {
	snap := poolctl.Snapshot{Now: registryNow, Params: poolctl.DefaultParams(), Pending: pending}
	if n > 0 {
		snap.Active = &poolctl.Epoch{Number: 1, Partitions: n, Shards: v, State: poolctl.EpochActive}
	}
	for i := range members {
		snap.Members = append(snap.Members, poolctl.Member{Name: fmt.Sprintf("w-%d", i), Slot: i, Incarnation: int64(i + 1), Live: true})
	}
	claims := map[string]poolctl.ClaimInfo{}
	var activity []poolctl.ActivityReport
	for i, u := range (ownership.Topology{Partitions: n, Shards: v}).Units() {
		if i < owned {
			m := i % max(members, 1)
			claims[u.String()] = poolctl.ClaimInfo{Unit: u.String(), Owner: fmt.Sprintf("w-%d", m), State: poolctl.StateHeld, Epoch: 1}
			activity = append(activity, poolctl.ActivityReport{Unit: u.String(), Member: fmt.Sprintf("w-%d", m), Incarnation: int64(m + 1), Epoch: 1,
				ReportedAt: registryNow, LastFetch: registryNow, PullingSince: registryNow.Add(-time.Minute)})
		}
	}
	return &registryView{snap: snap, claims: claims, activity: activity}
}

func TestComputeStatus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	stall := &StallError{Reason: topologyv1.ReasonWorkloadNotFound, Field: "spec.workload.statefulSetName", Detail: "StatefulSet \"x\" not found"}
	spec := topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 4}
	pending := &poolctl.Epoch{Number: 2, Partitions: 2, Shards: 8, State: poolctl.EpochPending}
	census := &natsops.Census{TakenAt: now, Floor: "2.14.0", MinVersion: "2.12.15", BelowFloor: []string{"n3"},
		Servers: []natsops.ServerInfo{{Name: "n1", Version: "2.14.9", Counted: true}, {Name: "n3", Version: "2.12.15", Counted: true, BelowFloor: true}}}
	type want struct {
		phase              topologyv1.Phase
		ready, reconciling metav1.ConditionStatus
		stalled            metav1.ConditionStatus
		reason             string // of Ready
		observedGeneration int64
		progress           string // substring
		rolloutKind        string
	}
	tests := []struct {
		name string
		prev topologyv1.ShardTopologyStatus
		obs  observation
		want want
	}{
		{"a stall is reported as Stalled at this generation",
			topologyv1.ShardTopologyStatus{}, observation{stall: stall, spec: spec},
			want{topologyv1.PhaseStalled, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionTrue, topologyv1.ReasonWorkloadNotFound, 3, "", ""}},
		{"a transient error keeps the previous phase and observed generation",
			topologyv1.ShardTopologyStatus{Phase: topologyv1.PhaseRollingOut, ObservedGeneration: 2}, observation{err: errors.New("etcd timeout"), spec: spec},
			want{topologyv1.PhaseRollingOut, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonReconcileError, 2, "", ""}},
		{"the first epoch being provisioned is Provisioning, not ready",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: registryWith(0, 0, 0, 0, nil),
				change: changeReport{state: stateUnprovisioned, inProgress: true, step: topologyv1.StepFreeze, message: "epoch 1 pending"}},
			want{topologyv1.PhaseProvisioning, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonProvisioning, 3, "no active epoch", topologyv1.RolloutKindTopology}},
		{"a change waiting for freeze acks is rolling out and names the target",
			topologyv1.ShardTopologyStatus{}, observation{spec: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 8}, registry: registryWith(2, 4, 2, 8, pending),
				change: changeReport{state: stateFreezing, inProgress: true, step: topologyv1.StepFreeze, message: "1/2 acknowledged"}},
			want{topologyv1.PhaseRollingOut, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonRollingOut, 3,
				"epoch 1 (2x4): units 8/8 owned; -> epoch 2 (2x8): Freeze", topologyv1.RolloutKindTopology}},
		{"pause holding a step is Paused and not ready",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, paused: true, registry: registryWith(2, 4, 2, 8, pending),
				change: changeReport{state: stateFreezing, inProgress: true, held: true, step: topologyv1.StepActivate, message: "paused before Activate"}},
			want{topologyv1.PhasePaused, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonRollingOut, 3, "paused", topologyv1.RolloutKindTopology}},
		{"a pod roll shows pods done out of the total",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: registryWith(2, 4, 3, 8, nil),
				change: changeReport{state: stateSteady},
				roll:   rollReport{active: true, done: 1, total: 3, step: topologyv1.PodStepHandingOver, message: "pod w-1: handing over"}},
			want{topologyv1.PhaseRollingOut, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonRollingOut, 3,
				"epoch 1 (2x4): units 8/8 owned; pods 1/3", topologyv1.RolloutKindPods}},
		{"unowned units with nothing rolling wait for workers",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: registryWith(2, 4, 1, 5, nil), change: changeReport{state: stateSteady}},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonWaitingForWorkers, 3, "units 5/8 owned", ""}},
		{"paused with nothing to hold is still ready when everything is done",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, paused: true, registry: registryWith(2, 4, 2, 8, nil), change: changeReport{state: stateSteady}},
			want{topologyv1.PhaseReady, metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionFalse, topologyv1.ReasonReady, 3, "epoch 1 (2x4): units 8/8 owned", ""}},
		{"done: the spec's epoch is active and every unit owned",
			topologyv1.ShardTopologyStatus{Rollout: &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology}},
			observation{spec: spec, registry: registryWith(2, 4, 2, 8, nil), change: changeReport{state: stateSteady}},
			want{topologyv1.PhaseReady, metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionFalse, topologyv1.ReasonReady, 3, "epoch 1 (2x4): units 8/8 owned", ""}},
		{"an owned unit whose owner stopped reporting is stalled: not ready, and owned counts only flowing units",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: withoutReport(registryWith(2, 4, 2, 8, nil), "1.3"), change: changeReport{state: stateSteady}},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonUnitsStalled, 3,
				"epoch 1 (2x4): units 7/8 owned; 1 stalled", ""}},
		{"a unit two members pull is counted and shown, and is not ready (P1 signal)",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: withSecondPuller(registryWith(2, 4, 2, 8, nil), "0.0", "w-1", 2), change: changeReport{state: stateSteady}},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonUnitsMultiplyOwned, 3,
				"units 8/8 owned; 1 multiply owned", ""}},
		{"a registry that did not answer in time has a reason of its own, and phase and progress say nothing was read",
			topologyv1.ShardTopologyStatus{Phase: topologyv1.PhaseReady, ObservedGeneration: 3, Progress: "epoch 1 (2x4): units 8/8 owned",
				Units: &topologyv1.UnitCounts{Total: 8, Owned: 8}},
			observation{err: fmt.Errorf("ObserveRegistry: read registry: %w", &RegistryTimeoutError{Op: "Snapshot", After: 10 * time.Second, Err: errors.New("timeout")}), spec: spec},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonRegistryUnavailable, 3,
				"RegistryUnavailable: registry not read, units unknown", ""}},
		{"an error after the registry was read keeps the counts it read",
			topologyv1.ShardTopologyStatus{Phase: topologyv1.PhaseReady, ObservedGeneration: 3},
			observation{err: errors.New("Census: publish RESET permission: boom"), spec: spec, registry: registryWith(2, 4, 2, 8, nil), change: changeReport{state: stateSteady}},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonReconcileError, 3,
				"epoch 1 (2x4): units 8/8 owned", ""}},
		{"every NATS server unreachable: not ready, whatever the reports say",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: registryWith(2, 4, 2, 8, nil), change: changeReport{state: stateSteady},
				natsDown: "the operator's connection to NATS is reconnecting"},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonNATSUnavailable, 3,
				"units 8/8 owned; NATS unreachable", ""}},
		{"a census below the floor is not a stall",
			topologyv1.ShardTopologyStatus{}, observation{spec: spec, registry: registryWith(2, 4, 2, 8, nil), change: changeReport{state: stateSteady},
				census: &censusReport{census: census, reason: "below floor", blockedBy: resetBlockedBelowFloor}},
			want{topologyv1.PhaseReady, metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionFalse, topologyv1.ReasonReady, 3, "", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Status: tt.prev}
			topo.Spec.Partitions, topo.Spec.ShardsPerPartition = 2, 4
			st := computeStatus(topo, tt.obs, now)
			get := func(typ string) metav1.Condition {
				c := meta.FindStatusCondition(st.Conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition", typ)
				}
				return *c
			}
			if st.Phase != tt.want.phase {
				t.Errorf("phase %s, want %s", st.Phase, tt.want.phase)
			}
			if c := get(topologyv1.ConditionReady); c.Status != tt.want.ready || c.Reason != tt.want.reason {
				t.Errorf("Ready %s/%s (%s), want %s/%s", c.Status, c.Reason, c.Message, tt.want.ready, tt.want.reason)
			}
			if c := get(topologyv1.ConditionReconciling); c.Status != tt.want.reconciling {
				t.Errorf("Reconciling %s, want %s", c.Status, tt.want.reconciling)
			}
			if c := get(topologyv1.ConditionStalled); c.Status != tt.want.stalled {
				t.Errorf("Stalled %s, want %s", c.Status, tt.want.stalled)
			}
			if tt.obs.err != nil && tt.obs.registry == nil && st.Units != nil {
				t.Errorf("units %+v kept although the registry was not read", st.Units)
			}
			if st.ObservedGeneration != tt.want.observedGeneration {
				t.Errorf("observedGeneration %d, want %d", st.ObservedGeneration, tt.want.observedGeneration)
			}
			if !strings.Contains(st.Progress, tt.want.progress) {
				t.Errorf("progress %q does not contain %q", st.Progress, tt.want.progress)
			}
			switch {
			case tt.want.rolloutKind == "" && st.Rollout != nil:
				t.Errorf("rollout %+v reported with nothing rolling", st.Rollout)
			case tt.want.rolloutKind != "" && (st.Rollout == nil || st.Rollout.Kind != tt.want.rolloutKind):
				t.Errorf("rollout %+v, want kind %s", st.Rollout, tt.want.rolloutKind)
			}
			// kstatus: Ready=True never comes with Reconciling=True or
			// Stalled=True (the Argo CD check relies on it).
			if get(topologyv1.ConditionReady).Status == metav1.ConditionTrue &&
				(get(topologyv1.ConditionReconciling).Status == metav1.ConditionTrue || get(topologyv1.ConditionStalled).Status == metav1.ConditionTrue) {
				t.Errorf("Ready=True together with Reconciling or Stalled: %+v", st.Conditions)
			}
		})
	}
}

// withoutReport drops every activity report of unit.
func withoutReport(v *registryView, unit string) *registryView {
	var kept []poolctl.ActivityReport
	for _, r := range v.activity {
		if r.Unit != unit {
			kept = append(kept, r)
		}
	}
	v.activity = kept
	return v
}

// withSecondPuller adds a fresh report of member pulling unit, under a
// token of its own, for the last 30 seconds.
func withSecondPuller(v *registryView, unit, member string, incarnation int64) *registryView {
	v.activity = append(v.activity, poolctl.ActivityReport{Unit: unit, Member: member, Incarnation: incarnation, Epoch: 1,
		ReportedAt: v.snap.Now, LastFetch: v.snap.Now, PullingSince: v.snap.Now.Add(-30 * time.Second)})
	return v
}

// The units' flow reaches status.units and Ready's message names the
// stalled units.
// checks P7
func TestComputeStatusCountsStalledAndMultiplyOwnedUnits(t *testing.T) {
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	v := withSecondPuller(withoutReport(registryWith(2, 4, 2, 8, nil), "0.1"), "1.0", "w-1", 2)
	st := computeStatus(topo, observation{registry: v, change: changeReport{state: stateSteady}}, registryNow)
	if u := st.Units; u == nil || u.Owned != 8 || u.Stalled != 1 || u.MultiplyOwned != 1 {
		t.Fatalf("units %+v, want 8 owned, 1 stalled, 1 multiply owned", u)
	}
	c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != topologyv1.ReasonUnitsMultiplyOwned ||
		!strings.Contains(c.Message, "pulled under two or more claim tokens at once: 1.0") || !strings.Contains(c.Message, "0.1 (w-1: no activity report)") {
		t.Fatalf("Ready %+v, want False/UnitsMultiplyOwned naming 1.0, and the stalled 0.1", c)
	}
}

func TestComputeStatusReportsTheCensus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	below := &natsops.Census{TakenAt: now, Floor: "2.14.0", MinVersion: "2.12.15", BelowFloor: []string{"n3"},
		Servers: []natsops.ServerInfo{{Name: "n1", Version: "2.14.9", Counted: true}, {Name: "n3", Version: "2.12.15", Counted: true, BelowFloor: true}}}
	met := &natsops.Census{TakenAt: now, Floor: "2.14.0", MinVersion: "2.14.9", BelowFloor: []string{},
		Servers: []natsops.ServerInfo{{Name: "n1", Version: "2.14.9", Counted: true}}}
	tests := []struct {
		name    string
		census  *censusReport
		status  metav1.ConditionStatus
		reason  string
		message string // substring
		minVer  string
	}{
		{"below the floor names the server and its version", &censusReport{census: below}, metav1.ConditionFalse, topologyv1.ReasonBelowFloor, "n3 (2.12.15)", "2.12.15"},
		{"at the floor", &censusReport{census: met, allowed: true}, metav1.ConditionTrue, topologyv1.ReasonFloorMet, "at or above 2.14.0", "2.14.9"},
		{"no system credentials fails closed", &censusReport{noSystemCredentials: true}, metav1.ConditionFalse, topologyv1.ReasonNoSystemCredentials, "fail closed", ""},
		{"a failed census fails closed", &censusReport{failed: "no server answered"}, metav1.ConditionFalse, topologyv1.ReasonCensusFailed, "no server answered", ""},
		{"no census yet", nil, metav1.ConditionUnknown, topologyv1.ReasonCensusPending, "no census", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
			st := computeStatus(topo, observation{census: tt.census, registry: registryWith(1, 1, 1, 1, nil)}, now)
			c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionVersionFloorMet)
			if c == nil || c.Status != tt.status || c.Reason != tt.reason || !strings.Contains(c.Message, tt.message) {
				t.Fatalf("VersionFloorMet %+v, want %s/%s containing %q", c, tt.status, tt.reason, tt.message)
			}
			if tt.minVer != "" && (st.Census == nil || st.Census.MinVersion != tt.minVer) {
				t.Fatalf("census status %+v, want minimum %s", st.Census, tt.minVer)
			}
			if st.Phase == topologyv1.PhaseStalled {
				t.Fatalf("a census verdict stalled the topology")
			}
		})
	}
}

func TestComputeStatusIsStableWhenNothingChanges(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	obs := observation{spec: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 4}, registry: registryWith(2, 4, 2, 8, nil),
		change: changeReport{state: stateClaiming, inProgress: true, step: topologyv1.StepClaim, message: "waiting"}}
	topo.Status = computeStatus(topo, obs, t0)
	again := computeStatus(topo, obs, t0.Add(time.Hour))
	if !statusEqual(topo.Status, again) {
		t.Fatalf("status changed with nothing new (transition and start times must stay):\n%+v\n%+v", topo.Status, again)
	}
}

func TestDeletingStatusSaysWhatItWaitsFor(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	st := deletingStatus(topo, "2 live workers hold 8 units", nil, now)
	c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionReconciling)
	if st.Phase != topologyv1.PhaseDeleting || c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "2 live workers") {
		t.Fatalf("phase %s, Reconciling %+v", st.Phase, c)
	}
	st = deletingStatus(topo, "", errors.New("registry unreachable"), now)
	if c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionReady); c.Reason != topologyv1.ReasonReconcileError || !strings.Contains(c.Message, "unreachable") {
		t.Fatalf("Ready %+v does not carry the error", c)
	}
}

func TestConditionTransitionsBecomeEvents(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason}
	}
	before := []metav1.Condition{
		cond(topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonSpecValid),
		cond(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonRollingOut),
	}
	after := []metav1.Condition{
		cond(topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound),
		cond(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonRollingOut),
		cond(topologyv1.ConditionRolloutPaused, metav1.ConditionFalse, topologyv1.ReasonNotPaused),
		cond(topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonBelowFloor),
	}
	got := conditionTransitions(before, after)
	want := []struct{ typ, reason string }{
		{"Warning", topologyv1.ReasonSecretNotFound}, {"Normal", topologyv1.ReasonNotPaused}, {"Warning", topologyv1.ReasonBelowFloor},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d transitions %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].eventType != w.typ || got[i].reason != w.reason {
			t.Errorf("transition %d = %s %s, want %s %s", i, got[i].eventType, got[i].reason, w.typ, w.reason)
		}
	}
}

// A change decided right after the first epoch became active is a
// rollout of its own, from that epoch: the first epoch's rollout (no from)
// is recorded as finished, not continued with its empty from. checks P7
func TestAChangeRightAfterTheFirstEpochKeepsItsFromEpoch(t *testing.T) {
	now := registryNow
	started := metav1.NewTime(now.Add(-10 * time.Second))
	first := &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepClaim, StartedAt: &started}
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 2},
		Status: topologyv1.ShardTopologyStatus{Rollout: first, ActiveEpoch: &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4}}}
	active := &poolctl.Epoch{Number: 1, Partitions: 2, Shards: 4, State: poolctl.EpochActive}
	obs := observation{spec: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 8}, registry: registryWith(2, 4, 2, 8,
		&poolctl.Epoch{Number: 2, Partitions: 2, Shards: 8, State: poolctl.EpochPending}),
		change: changeReport{state: stateChangeWanted, inProgress: true, step: topologyv1.StepFreeze, from: active}}
	st := computeStatus(topo, obs, now)
	if st.Rollout == nil || st.Rollout.FromEpoch == nil || st.Rollout.FromEpoch.Number != 1 {
		t.Fatalf("rollout %+v, want a topology rollout from epoch 1", st.Rollout)
	}
	if !st.Rollout.StartedAt.Time.Equal(now.Truncate(time.Second)) {
		t.Errorf("rollout started %s, want now (a new rollout), not the first epoch's %s", st.Rollout.StartedAt, started)
	}
	if l := st.LastRollout; l == nil || l.From != "" || l.To != "epoch 1 (2x4)" || l.Result != topologyv1.RolloutSucceeded {
		t.Fatalf("last rollout %+v, want the first epoch's rollout to epoch 1 recorded as succeeded", l)
	}
	// The next reconcile continues the change, from epoch 1, and the
	// state machine sees a change under way (Claiming after activation).
	topo.Status = st
	obs.change = changeReport{state: stateClaiming, inProgress: true, step: topologyv1.StepClaim}
	st2 := computeStatus(topo, obs, now.Add(5*time.Second))
	if st2.Rollout == nil || st2.Rollout.FromEpoch == nil || st2.Rollout.FromEpoch.Number != 1 || !st2.Rollout.StartedAt.Equal(st.Rollout.StartedAt) {
		t.Fatalf("rollout %+v, want the same rollout from epoch 1", st2.Rollout)
	}
	if !wasChangingTopology(&st2) {
		t.Fatal("status does not read as a change under way")
	}
}

// A pod roll that waits behind a topology change is named in the change's
// rollout message, so it never looks like a silent deadlock. checks P7
func TestATopologyChangeNamesThePodRollBehindIt(t *testing.T) {
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	obs := observation{spec: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 4}, registry: registryWith(2, 4, 2, 4, nil),
		change: changeReport{state: stateClaiming, inProgress: true, step: topologyv1.StepClaim, message: "epoch 2 (2x4) active: 4/8 units owned"},
		roll:   rollReport{active: true, message: "pod ingest-1 waits for the topology change to settle"}}
	st := computeStatus(topo, obs, registryNow)
	if st.Rollout == nil || !strings.Contains(st.Rollout.Message, "pod roll: pod ingest-1 waits") {
		t.Fatalf("rollout %+v does not name the pod roll", st.Rollout)
	}
}
