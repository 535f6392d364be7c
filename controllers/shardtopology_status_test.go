package controllers

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

func TestComputeStatus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	stall := &StallError{Reason: topologyv1.ReasonWorkloadNotFound, Field: "spec.workload.statefulSetName", Detail: "StatefulSet \"x\" not found"}
	type want struct {
		phase              topologyv1.Phase
		ready, reconciling metav1.ConditionStatus
		stalled            metav1.ConditionStatus
		reason             string // of Ready
		observedGeneration int64
	}
	tests := []struct {
		name string
		prev topologyv1.ShardTopologyStatus
		obs  observation
		want want
	}{
		{"a stall is reported as Stalled at this generation",
			topologyv1.ShardTopologyStatus{}, observation{stall: stall},
			want{topologyv1.PhaseStalled, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionTrue, topologyv1.ReasonWorkloadNotFound, 3}},
		{"a transient error keeps the previous phase and observed generation",
			topologyv1.ShardTopologyStatus{Phase: topologyv1.PhasePending, ObservedGeneration: 2}, observation{err: errors.New("etcd timeout")},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonReconcileError, 2}},
		{"valid spec with work pending is reconciling, not ready",
			topologyv1.ShardTopologyStatus{}, observation{pending: "not done"},
			want{topologyv1.PhasePending, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, topologyv1.ReasonNotImplemented, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Status: tt.prev}
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
				t.Errorf("Ready %s/%s, want %s/%s", c.Status, c.Reason, tt.want.ready, tt.want.reason)
			}
			if c := get(topologyv1.ConditionReconciling); c.Status != tt.want.reconciling {
				t.Errorf("Reconciling %s, want %s", c.Status, tt.want.reconciling)
			}
			if c := get(topologyv1.ConditionStalled); c.Status != tt.want.stalled {
				t.Errorf("Stalled %s, want %s", c.Status, tt.want.stalled)
			}
			if st.ObservedGeneration != tt.want.observedGeneration {
				t.Errorf("observedGeneration %d, want %d", st.ObservedGeneration, tt.want.observedGeneration)
			}
		})
	}
}

func TestComputeStatusIsStableWhenNothingChanges(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	obs := observation{pending: "not done"}
	topo.Status = computeStatus(topo, obs, t0)
	again := computeStatus(topo, obs, t0.Add(time.Hour))
	if !statusEqual(topo.Status, again) {
		t.Fatalf("status changed with nothing new (transition times must stay):\n%+v\n%+v", topo.Status, again)
	}
}

func TestConditionTransitionsBecomeEvents(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason}
	}
	before := []metav1.Condition{
		cond(topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonSpecValid),
		cond(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonNotImplemented),
	}
	after := []metav1.Condition{
		cond(topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound),
		cond(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonNotImplemented),
		cond(topologyv1.ConditionRolloutPaused, metav1.ConditionFalse, topologyv1.ReasonNotPaused),
	}
	got := conditionTransitions(before, after)
	want := []struct{ typ, reason string }{{"Warning", topologyv1.ReasonSecretNotFound}, {"Normal", topologyv1.ReasonNotPaused}}
	if len(got) != len(want) {
		t.Fatalf("got %d transitions %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].eventType != w.typ || got[i].reason != w.reason {
			t.Errorf("transition %d = %s %s, want %s %s", i, got[i].eventType, got[i].reason, w.typ, w.reason)
		}
	}
}
