package controllers

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// observation is what one reconcile found, reduced to what status needs.
// Status is a pure function of the object and an observation (P7: it says
// what is true now).
type observation struct {
	// durability: the registry's replication settings, judged (nil when
	// not read this reconcile: the condition keeps its last value).
	durability *poolctl.Durability
	// stall: the spec cannot be acted on until something changes.
	stall *StallError
	// err: a step failed in a way a retry may fix.
	err error
	// paused: the spec or annotation holds the rollout.
	paused bool
	// spec is the N x V the spec asks for.
	spec topologyv1.TopologyShape
	// registry is the registry as last read; nil when it was not reached.
	registry *registryView
	// census is the census taken this reconcile; nil when none was due.
	census *censusReport
	change changeReport
	// plan is the plan of a wanted change, computed this reconcile.
	plan *topologyv1.PlanStatus
	roll rollReport
	// provisioned is the envelope of consumers provisioned and not retired.
	provisioned *topologyv1.TopologyShape
	// stranded is this reconcile's count of stranded rows; nil when it
	// did not count (status keeps the last count).
	stranded *topologyv1.StrandedRowsStatus
	// retiring counts units outside the active epoch whose consumers exist.
	retiring int
	// workload names the workload's pods; nil when it was not read.
	workload *workloadPods
	// natsDown says why no NATS server is reachable; "" when one is.
	natsDown string
	// barrier is the active epoch's order barrier; nil without one.
	barrier *topologyv1.OrderBarrierStatus
}

// registryView is a snapshot and what was read with it.
type registryView struct {
	snap   poolctl.Snapshot
	claims map[string]poolctl.ClaimInfo
	// activity is every member's latest activity report.
	activity []poolctl.ActivityReport
	// pending is what the recent censuses counted pending per unit,
	// oldest first.
	pending []pendingRows
	// judged is flow's verdict once made: status asks more than once,
	// and at 4096 units each judgement was a share of a reconcile.
	judged *unitFlow
}

// flow judges the units' flow from the view, once.
func (v *registryView) flow() unitFlow {
	if v.judged == nil {
		f := assessFlow(&v.snap, v.claims, v.activity, v.pending)
		v.judged = &f
	}
	return *v.judged
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
//
// Ready is True only when the active epoch is the spec's, nothing is
// pending, no pod is being rolled, nothing is left to retire and every unit
// is owned and flowing (none stalled). Reconciling is True while work remains, Stalled when a person
// must act, RolloutPaused while pause holds a step; observedGeneration moves
// only when every step ran without error.
func computeStatus(t *topologyv1.ShardTopology, o observation, now time.Time) topologyv1.ShardTopologyStatus {
	st := *t.Status.DeepCopy()
	set := conditionSetter(&st, t.Generation, now)
	st.SubjectPrefix = t.SubjectPrefix()
	if o.stranded != nil {
		st.StrandedRows = o.stranded.DeepCopy()
	}

	if o.change.approvedHash != "" {
		st.ApprovedPlanHash = o.change.approvedHash
	}
	held := o.change.held || o.roll.held
	setPaused(set, o.paused, held, o.change.message, o.roll.message)
	applyCensus(&st, set, o.census, t.Spec.NATS.AckWaitOrDefault())
	if d := o.durability; d != nil {
		status := metav1.ConditionFalse
		if d.Durable {
			status = metav1.ConditionTrue
		}
		set(topologyv1.ConditionRegistryDurable, status, d.Reason, d.Message)
	}
	if o.registry != nil {
		applyWorld(&st, t, o, now)
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
		// A retry may fix it: keep observedGeneration, since this
		// generation's steps did not all run, and a phase that says work
		// is under way; Ready and Stalled are verdicts this reconcile
		// could not reach, so they give way to Pending (after a
		// SecretNotFound, PHASE read Stalled beside Stalled=False).
		msg, reason := scrubConnStrings(o.err.Error()), errorReason(o.err)
		if st.Phase == topologyv1.PhaseReady || st.Phase == topologyv1.PhaseStalled || st.Phase == "" {
			st.Phase = topologyv1.PhasePending
		}
		if o.registry == nil {
			// Not read this time: counts from an earlier reading would
			// say something nobody knows now.
			st.Units = nil
		}
		set(topologyv1.ConditionStalled, metav1.ConditionFalse, reason, "retrying: "+msg)
		set(topologyv1.ConditionReady, metav1.ConditionFalse, reason, msg)
		set(topologyv1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	default:
		phase, reason, msg := assess(&st, o)
		st.Phase = phase
		set(topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonSpecValid, "every check of the spec against the cluster passed")
		if phase == topologyv1.PhaseReady {
			set(topologyv1.ConditionReady, metav1.ConditionTrue, topologyv1.ReasonReady, msg)
			set(topologyv1.ConditionReconciling, metav1.ConditionFalse, topologyv1.ReasonReady, "nothing left to do")
		} else {
			set(topologyv1.ConditionReady, metav1.ConditionFalse, reason, msg)
			set(topologyv1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
		}
		st.ObservedGeneration = t.Generation
	}
	st.Progress = progressText(&st, o)
	if o.err != nil && o.registry == nil {
		st.Progress = fmt.Sprintf("%s: registry not read, units unknown", errorReason(o.err))
	}
	return st
}

// assess says where a topology whose steps all ran stands: its phase, and
// the reason and message of Ready/Reconciling.
func assess(st *topologyv1.ShardTopologyStatus, o observation) (topologyv1.Phase, string, string) {
	firstEpoch := st.ActiveEpoch == nil
	reason := topologyv1.ReasonRollingOut
	if firstEpoch {
		reason = topologyv1.ReasonProvisioning
	}
	u := st.Units
	var stalled, multiply []string
	if o.registry != nil {
		f := o.registry.flow()
		for _, su := range f.stalled {
			stalled = append(stalled, su.String())
		}
		multiply = f.multiplyOwnedUnits
	}
	switch {
	case o.change.held || o.roll.held:
		return topologyv1.PhasePaused, reason, joinNonEmpty(o.change.message, o.roll.message)
	case o.change.refused:
		return topologyv1.PhaseAwaitingApproval, topologyv1.ReasonApprovalRefused, o.change.message
	case o.change.awaiting:
		return topologyv1.PhaseAwaitingApproval, topologyv1.ReasonAwaitingApproval, o.change.message
	case firstEpoch:
		return topologyv1.PhaseProvisioning, topologyv1.ReasonProvisioning, nonEmpty(o.change.message, "provisioning the first epoch")
	case o.change.inProgress:
		return topologyv1.PhaseRollingOut, topologyv1.ReasonRollingOut, joinNonEmpty(o.change.message, barrierMessage(o.barrier))
	case o.roll.active:
		return topologyv1.PhaseRollingOut, topologyv1.ReasonRollingOut, joinNonEmpty(o.roll.message, barrierMessage(o.barrier))
	case barrierMessage(o.barrier) != "":
		// Every unit is owned and unmoved keys flow, but moved keys'
		// rows wait: the change is not over for order-sensitive
		// consumers.
		return topologyv1.PhaseRollingOut, topologyv1.ReasonOrderBarrier, barrierMessage(o.barrier)
	case o.natsDown != "":
		return topologyv1.PhasePending, topologyv1.ReasonNATSUnavailable,
			"whether units flow cannot be judged: " + o.natsDown
	case len(multiply) > 0:
		msg := fmt.Sprintf("%d units pulled under two or more claim tokens at once: %s", len(multiply), firstN(multiply, 4))
		if len(stalled) > 0 {
			msg += fmt.Sprintf("; %d owned units do not flow: %s", len(stalled), firstN(stalled, 4))
		}
		return topologyv1.PhasePending, topologyv1.ReasonUnitsMultiplyOwned, msg
	case u != nil && u.Owned < u.Total:
		workers := 0
		if o.registry != nil {
			workers = len(o.registry.snap.LiveMembers())
		}
		return topologyv1.PhasePending, topologyv1.ReasonWaitingForWorkers,
			fmt.Sprintf("%d/%d units owned, %d unowned; %d live workers", u.Owned, u.Total, u.Unowned, workers)
	case len(stalled) > 0:
		return topologyv1.PhasePending, topologyv1.ReasonUnitsStalled,
			fmt.Sprintf("%d of %d owned units do not flow: %s", len(stalled), u.Owned, firstN(stalled, 4))
	}
	a := st.ActiveEpoch
	total := int32(0)
	if u != nil {
		total = u.Total
	}
	return topologyv1.PhaseReady, topologyv1.ReasonReady,
		fmt.Sprintf("epoch %d (%dx%d) active; all %d units owned", a.Number, a.Partitions, a.ShardsPerPartition, total)
}

// applyWorld records the registry's epochs, the unit counts, the
// provisioned envelope and the rollout's progress.
func applyWorld(st *topologyv1.ShardTopologyStatus, t *topologyv1.ShardTopology, o observation, now time.Time) {
	snap := &o.registry.snap
	st.ActiveEpoch, st.TargetEpoch = epochStatus(snap.Active), epochStatus(snap.Pending)
	st.Units = nil
	if snap.Active != nil {
		total, owned := unitCounts(snap, o.registry.claims)
		f := o.registry.flow()
		st.Units = &topologyv1.UnitCounts{Total: int32(total), Owned: int32(owned), Unowned: int32(total - owned), Retiring: int32(o.retiring),
			MultiplyOwned: int32(f.multiplyOwned), Stalled: int32(len(f.stalled))}
	}
	if o.workload != nil {
		st.Members = memberStatus(snap, o.registry.claims, o.workload)
	}
	if o.provisioned != nil {
		p := *o.provisioned
		st.Provisioned = &p
	}
	st.OrderBarrier = o.barrier.DeepCopy()
	st.Rollout = rolloutStatus(t.Status.Rollout, st, o, now)
	if last := finishedRollout(&t.Status, st, o, now); last != nil {
		st.LastRollout = last
	}
	switch {
	case o.plan != nil:
		st.Plan = o.plan
	case !o.change.inProgress:
		st.Plan = nil
	}
}

// finishedRollout is the record of the rollout status reported until now
// and no longer reports, or nil while it runs. A topology change that
// gives way in status to a pod roll while it waits for one has not
// finished, nor has a pod roll that gives way to a topology change.
func finishedRollout(before, st *topologyv1.ShardTopologyStatus, o observation, now time.Time) *topologyv1.LastRolloutStatus {
	prev, cur := before.Rollout, st.Rollout
	switch {
	case prev == nil:
		return nil
	case cur != nil && cur.Kind == prev.Kind && (cur.Kind == topologyv1.RolloutKindPods || sameEpoch(cur.FromEpoch, prev.FromEpoch)):
		return nil
	case prev.Kind == topologyv1.RolloutKindTopology && o.change.inProgress && (cur == nil || cur.Kind != topologyv1.RolloutKindTopology):
		return nil
	case prev.Kind == topologyv1.RolloutKindPods && o.roll.active:
		return nil
	}
	last := &topologyv1.LastRolloutStatus{Kind: prev.Kind, StartedAt: prev.StartedAt, FinishedAt: ptrTime(now), Result: topologyv1.RolloutSucceeded}
	if prev.StartedAt != nil {
		last.Duration = &metav1.Duration{Duration: now.Sub(prev.StartedAt.Time).Truncate(time.Second)}
	}
	switch prev.Kind {
	case topologyv1.RolloutKindTopology:
		if prev.Step == topologyv1.StepAbort {
			last.Result = topologyv1.RolloutAborted
		}
		last.From, last.To = epochText(prev.FromEpoch), epochText(st.ActiveEpoch)
		if before.Plan != nil && last.Result == topologyv1.RolloutSucceeded {
			last.PlanHash = before.Plan.Hash
		}
	case topologyv1.RolloutKindPods:
		last.To = o.roll.revision
	}
	return last
}

// sameEpoch reports whether a and b name the same epoch (or both none).
func sameEpoch(a, b *topologyv1.TopologyEpoch) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Number == b.Number
}

// epochText renders an epoch as "epoch 2 (4x16)", or "" for none.
func epochText(e *topologyv1.TopologyEpoch) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("epoch %d (%dx%d)", e.Number, e.Partitions, e.ShardsPerPartition)
}

// rolloutStatus is the rollout in progress, or nil. A topology change is
// reported while it runs, except that a pod roll in flight is reported
// instead while the change only waits for it or retires leftovers.
func rolloutStatus(prev *topologyv1.RolloutStatus, st *topologyv1.ShardTopologyStatus, o observation, now time.Time) *topologyv1.RolloutStatus {
	podsFirst := o.roll.active && (o.change.state == stateSteady || o.change.state == stateRetiring || o.change.state == stateChangeWanted)
	switch {
	case o.change.inProgress && !podsFirst && !o.change.awaiting:
		r := &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: o.change.step, Message: o.change.message,
			StartedAt: ptrTime(now), UnitsToMove: o.change.unitsToMove, FromEpoch: epochStatus(o.change.from)}
		if continuesTopologyRollout(prev, o.change.from) {
			r.StartedAt, r.FromEpoch = prev.StartedAt, prev.FromEpoch
			if r.UnitsToMove == 0 {
				r.UnitsToMove = prev.UnitsToMove
			}
		}
		if o.roll.active && o.roll.message != "" {
			// The pod roll waits behind this change, or runs beside it:
			// say so, or a roll nobody sees looks like a deadlock.
			r.Message = joinNonEmpty(r.Message, "pod roll: "+o.roll.message)
		}
		r.UnitsMoved = unitsMoved(r, o)
		return r
	case o.roll.active:
		r := &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindPods, Step: o.roll.step, Message: o.roll.message,
			StartedAt: ptrTime(now), PodsDone: o.roll.done, PodsTotal: o.roll.total, Pods: o.roll.pods}
		if prev != nil && prev.Kind == topologyv1.RolloutKindPods {
			r.StartedAt = prev.StartedAt
		}
		return r
	}
	return nil
}

// continuesTopologyRollout reports whether the topology change decided
// from the active epoch from (nil before any epoch, or once activated) is
// the one prev reported. The first epoch's rollout (no from) ends once an
// epoch is active: a change decided after that is a new rollout, from the
// epoch then active, even when no reconcile reported the first one done.
func continuesTopologyRollout(prev *topologyv1.RolloutStatus, from *poolctl.Epoch) bool {
	if prev == nil || prev.Kind != topologyv1.RolloutKindTopology {
		return false
	}
	return prev.FromEpoch != nil || from == nil
}

// unitsMoved counts the moved units already held by their new owner:
// before activation none; after it, the units to move less those not yet
// owned by their placement owner.
func unitsMoved(r *topologyv1.RolloutStatus, o observation) int32 {
	switch r.Step {
	case topologyv1.StepApprove, topologyv1.StepProvision, topologyv1.StepFreeze, topologyv1.StepActivate, topologyv1.StepAbort, "":
		return 0
	}
	snap := &o.registry.snap
	if snap.Active == nil {
		return 0
	}
	owners := ownedBy(snap, o.registry.claims)
	misplaced := int32(0)
	for u, want := range placementOwners(epochTopology(snap.Active), snap.LiveMembers(), nil) {
		if owners[u] != want {
			misplaced++
		}
	}
	return max(0, min(r.UnitsToMove, r.UnitsToMove-misplaced))
}

func epochStatus(e *poolctl.Epoch) *topologyv1.TopologyEpoch {
	if e == nil {
		return nil
	}
	return &topologyv1.TopologyEpoch{Number: e.Number, Partitions: int32(e.Partitions), ShardsPerPartition: int32(e.Shards)}
}

// applyCensus records a census taken this reconcile and sets
// VersionFloorMet from it. Without one, the last census stays.
func applyCensus(st *topologyv1.ShardTopologyStatus, set setFunc, c *censusReport, ackWait time.Duration) {
	if c == nil {
		if meta.FindStatusCondition(st.Conditions, topologyv1.ConditionVersionFloorMet) == nil {
			set(topologyv1.ConditionVersionFloorMet, metav1.ConditionUnknown, topologyv1.ReasonCensusPending, "no census of NATS server versions has been taken yet")
		}
		return
	}
	off := fmt.Sprintf("RESET-based takeover is off; takeover waits for ack_wait (%s)", ackWait)
	switch {
	// Without a census the floor is not known to be met, and the census
	// fails closed: False, as the README promises, so the
	// VersionFloorNotMet alert fires (Unknown matched no alert).
	case c.noSystemCredentials:
		set(topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonNoSystemCredentials,
			"spec.nats.systemCredentialsSecretRef is not set, so no census can be taken (fail closed); "+off)
	case c.failed != "":
		set(topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonCensusFailed,
			"census failed: "+c.failed+"; "+off)
	default:
		cs := c.census
		taken := metav1.NewTime(cs.TakenAt.Truncate(time.Second))
		st.Census = &topologyv1.CensusStatus{ObservedAt: &taken, ServerCount: int32(countedServers(cs)), Servers: censusServers(cs),
			MinVersion: cs.MinVersion, BelowFloor: cs.BelowFloor}
		if len(st.Census.BelowFloor) == 0 {
			st.Census.BelowFloor = nil
		}
		if cs.FloorMet() {
			msg := fmt.Sprintf("%d servers at or above %s (lowest %s)", countedServers(cs), cs.Floor, cs.MinVersion)
			if !c.allowed {
				msg += "; RESET still refused: " + c.reason
			}
			set(topologyv1.ConditionVersionFloorMet, metav1.ConditionTrue, topologyv1.ReasonFloorMet, msg)
			return
		}
		msg := fmt.Sprintf("servers below %s: %s; %s", cs.Floor, serversWithVersions(cs, 6), off)
		if f := censusFindings(cs); f != "" {
			msg += ". " + f
		}
		set(topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonBelowFloor, msg)
	}
}

// progressText is the Progress column: the active epoch and its units,
// then the change, retirement and pod roll in progress, e.g.
// "epoch 2 (4x16): units 64/64 owned; pods 2/3". Owned there means owned
// and flowing: stalled units are counted apart ("units 62/64 owned; 2
// stalled"), and so are multiply-owned ones.
func progressText(st *topologyv1.ShardTopologyStatus, o observation) string {
	var parts []string
	switch a := st.ActiveEpoch; {
	case a != nil && st.Units != nil:
		u := st.Units
		parts = append(parts, fmt.Sprintf("epoch %d (%dx%d): units %d/%d owned", a.Number, a.Partitions, a.ShardsPerPartition, u.Owned-u.Stalled, u.Total))
		if u.Stalled > 0 {
			parts = append(parts, fmt.Sprintf("%d stalled", u.Stalled))
		}
		if u.MultiplyOwned > 0 {
			parts = append(parts, fmt.Sprintf("%d multiply owned", u.MultiplyOwned))
		}
	case o.registry != nil:
		parts = append(parts, "no active epoch")
	default:
		return st.Progress
	}
	afterActivation := func(step string) bool {
		return step == topologyv1.StepHandOver || step == topologyv1.StepClaim || step == topologyv1.StepRetire
	}
	if r := st.Rollout; r != nil && r.Kind == topologyv1.RolloutKindTopology && !afterActivation(r.Step) {
		to := o.spec.String()
		if e := st.TargetEpoch; e != nil {
			to = fmt.Sprintf("epoch %d (%dx%d)", e.Number, e.Partitions, e.ShardsPerPartition)
		}
		parts = append(parts, fmt.Sprintf("-> %s: %s", to, r.Step))
	}
	if r := st.Rollout; r != nil && r.Kind == topologyv1.RolloutKindTopology && afterActivation(r.Step) && r.UnitsToMove > 0 {
		parts = append(parts, fmt.Sprintf("moved %d/%d", r.UnitsMoved, r.UnitsToMove))
	}
	if st.Units != nil && st.Units.Retiring > 0 {
		parts = append(parts, fmt.Sprintf("%d retiring", st.Units.Retiring))
	}
	if r := st.Rollout; r != nil && r.Kind == topologyv1.RolloutKindPods {
		parts = append(parts, fmt.Sprintf("pods %d/%d", r.PodsDone, r.PodsTotal))
	}
	if st.Phase == topologyv1.PhasePaused {
		parts = append(parts, "paused")
	}
	if o.natsDown != "" {
		parts = append(parts, "NATS unreachable")
	}
	if p := st.Plan; p != nil && p.State == topologyv1.PlanProposalReady {
		parts = append(parts, fmt.Sprintf("-> %s: plan %s awaits approval", p.To, p.Hash))
	}
	return strings.Join(parts, "; ")
}

// errorReason is the condition reason of a step's error: a registry that
// did not answer within the bound has a reason of its own.
func errorReason(err error) string {
	var timeout *RegistryTimeoutError
	if errors.As(err, &timeout) {
		return topologyv1.ReasonRegistryUnavailable
	}
	return topologyv1.ReasonReconcileError
}

// deletingStatus is the status while the finalizer waits or fails.
func deletingStatus(t *topologyv1.ShardTopology, waiting string, err error, now time.Time) topologyv1.ShardTopologyStatus {
	st := *t.Status.DeepCopy()
	set := conditionSetter(&st, t.Generation, now)
	st.Phase = topologyv1.PhaseDeleting
	reason := topologyv1.ReasonDeleting
	msg := "deleting: " + waiting
	if err != nil {
		reason, msg = errorReason(err), "deleting, retrying: "+scrubConnStrings(err.Error())
	}
	set(topologyv1.ConditionReady, metav1.ConditionFalse, reason, msg)
	set(topologyv1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
	st.Progress = "deleting: " + waiting
	return st
}

func setPaused(set setFunc, paused, held bool, messages ...string) {
	switch {
	case paused && held:
		set(topologyv1.ConditionRolloutPaused, metav1.ConditionTrue, topologyv1.ReasonPaused, joinNonEmpty(messages...))
	case paused:
		set(topologyv1.ConditionRolloutPaused, metav1.ConditionTrue, topologyv1.ReasonPaused,
			fmt.Sprintf("spec.rollout.paused or annotation %s holds the rollout before its next step; nothing is waiting now", topologyv1.PausedAnnotation))
	default:
		set(topologyv1.ConditionRolloutPaused, metav1.ConditionFalse, topologyv1.ReasonNotPaused, "nothing holds the rollout")
	}
}

func joinNonEmpty(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
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
			Message:            truncate(message, 1024),
			ObservedGeneration: generation,
			LastTransitionTime: metav1.NewTime(now),
		})
	}
}

// truncate keeps messages readable (the API allows 32768 bytes).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
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
		eventType := eventNormal
		if bad, ok := warnWhen[c.Type]; ok && bad == c.Status {
			eventType = eventWarning
		}
		if c.Reason == topologyv1.ReasonReconcileError || c.Reason == topologyv1.ReasonRegistryUnavailable {
			eventType = eventWarning
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

// Event types.
const (
	eventNormal  = "Normal"
	eventWarning = "Warning"
)
