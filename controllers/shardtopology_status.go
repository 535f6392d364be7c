package controllers

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// observation is what one reconcile found, reduced to what status needs.
type observation struct {
	// stall: the spec cannot be acted on until something changes.
	stall *StallError
	// err: a step failed in a way a retry may fix.
	err error
	// pending: the spec is valid, but this work is not done.
	pending string
	// paused: the spec or annotation holds the rollout.
	paused bool
}

// firstSightStatus is the status of an object no reconcile has touched:
// nothing is known, so nothing may read as healthy.
func firstSightStatus(t *topologyv1.ShardTopology, now time.Time) topologyv1.ShardTopologyStatus {
	st := *t.Status.DeepCopy()
	st.Phase = topologyv1.PhasePending
	set := conditionSetter(&st, t.Generation, now)
	set(topologyv1.ConditionReady, metav1.ConditionUnknown, topologyv1.ReasonFirstSeen, "the operator has not reconciled this object yet")
	set(topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonFirstSeen, "the operator has not reconciled this object yet")
	return st
}

// computeStatus derives the whole status from one observation. It is pure:
// the same inputs always give the same status, which the tests rely on.
func computeStatus(t *topologyv1.ShardTopology, o observation, now time.Time) topologyv1.ShardTopologyStatus {
	st := *t.Status.DeepCopy()
	set := conditionSetter(&st, t.Generation, now)

	setPaused(set, o.paused)
	if meta.FindStatusCondition(st.Conditions, topologyv1.ConditionVersionFloorMet) == nil {
		set(topologyv1.ConditionVersionFloorMet, metav1.ConditionUnknown, topologyv1.ReasonCensusPending, "no census of NATS server versions has been taken yet")
	}

	switch {
	case o.stall != nil:
		msg := o.stall.Error()
		st.Phase = topologyv1.PhaseStalled
		set(topologyv1.ConditionStalled, metav1.ConditionTrue, o.stall.Reason, msg)
		set(topologyv1.ConditionReady, metav1.ConditionFalse, o.stall.Reason, msg)
		set(topologyv1.ConditionReconciling, metav1.ConditionFalse, o.stall.Reason, "waiting for the spec or the object it names to change")
		st.ObservedGeneration = t.Generation
	case o.err != nil:
		// A retry may fix it: keep phase and observedGeneration, since
		// this generation's steps did not all run.
		msg := o.err.Error()
		set(topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonReconcileError, "retrying: "+msg)
		set(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonReconcileError, msg)
		set(topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonReconcileError, msg)
	case o.pending != "":
		st.Phase = topologyv1.PhasePending
		set(topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonSpecValid, "every check of the spec against the cluster passed")
		set(topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonNotImplemented, o.pending)
		set(topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonNotImplemented, o.pending)
		st.ObservedGeneration = t.Generation
	}
	return st
}

func setPaused(set setFunc, paused bool) {
	if paused {
		set(topologyv1.ConditionRolloutPaused, metav1.ConditionTrue, topologyv1.ReasonPaused,
			fmt.Sprintf("spec.rollout.paused or annotation %s holds the rollout before its next step", topologyv1.PausedAnnotation))
		return
	}
	set(topologyv1.ConditionRolloutPaused, metav1.ConditionFalse, topologyv1.ReasonNotPaused, "nothing holds the rollout")
}

// setFunc sets one condition on a status being built.
type setFunc func(condType string, status metav1.ConditionStatus, reason, message string)

// conditionSetter returns a setFunc that keeps LastTransitionTime when the
// condition's status does not change, as meta.SetStatusCondition does.
func conditionSetter(st *topologyv1.ShardTopologyStatus, generation int64, now time.Time) setFunc {
	return func(condType string, status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type:               condType,
			Status:             status,
			Reason:             reason,
			Message:            message,
			ObservedGeneration: generation,
			LastTransitionTime: metav1.NewTime(now),
		})
	}
}

// statusEqual reports whether writing b over a would change nothing.
func statusEqual(a, b topologyv1.ShardTopologyStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// transition is one condition change worth an Event.
type transition struct {
	eventType string
	reason    string
	action    string
	note      string
}

// warnWhen says which (condition, status) pairs are bad news.
var warnWhen = map[string]metav1.ConditionStatus{
	topologyv1.ConditionStalled:         metav1.ConditionTrue,
	topologyv1.ConditionVersionFloorMet: metav1.ConditionFalse,
}

// conditionTransitions lists the conditions whose status or reason changed
// between before and after, as Events: Warning for bad news, Normal otherwise.
func conditionTransitions(before, after []metav1.Condition) []transition {
	var out []transition
	for _, c := range after {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		eventType := "Normal"
		if bad, ok := warnWhen[c.Type]; ok && bad == c.Status {
			eventType = "Warning"
		}
		if c.Reason == topologyv1.ReasonReconcileError {
			eventType = "Warning"
		}
		out = append(out, transition{
			eventType: eventType,
			reason:    c.Reason,
			action:    "Set" + c.Type,
			note:      fmt.Sprintf("%s=%s: %s", c.Type, c.Status, c.Message),
		})
	}
	return out
}
