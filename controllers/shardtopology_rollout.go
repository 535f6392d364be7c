package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// A topology change (design.md section 8) is a state machine written as
// data: changeRules maps (state, condition) to an action, first match wins.
// The state is derived afresh every reconcile from the registry (active and
// pending epochs, acknowledgements, claims), the spec and what status
// recorded as provisioned, never from the operator's memory, so a restart
// at any point resumes at the right row. Every action is idempotent:
// Provision creates what is missing, CreatePending returns an existing
// pending epoch of the same shape, Activate of an active epoch and Retire of
// a retired one succeed, RetireConsumers counts a missing consumer as
// retired.

// changeState is where a topology change stands.
type changeState string

const (
	// stateUnprovisioned: the registry has no epoch at all.
	stateUnprovisioned changeState = "Unprovisioned"
	// stateProposed: the active epoch differs from the spec, nothing is
	// pending, approval is Manual and the approve annotation does not
	// carry the plan's hash.
	stateProposed changeState = "Proposed"
	// stateChangeWanted: the active epoch differs from the spec, nothing
	// is pending, and the change may start (approved, or Automatic).
	stateChangeWanted changeState = "ChangeWanted"
	// stateFreezing: the spec's epoch is pending; members acknowledge it.
	stateFreezing changeState = "Freezing"
	// stateStalePending: a pending epoch the spec no longer wants (the
	// spec moved or went back) or that the abort annotation cancels.
	stateStalePending changeState = "StalePending"
	// stateClaiming: the new epoch is active and some of its units have
	// no owner yet.
	stateClaiming changeState = "Claiming"
	// stateRetiring: every unit is owned and units that left still have
	// consumers.
	stateRetiring changeState = "Retiring"
	// stateSteady: the active epoch is the spec's and nothing is left over.
	stateSteady changeState = "Steady"
)

// changeWorld is what the rules decide on.
type changeWorld struct {
	// target is the shape the next change goes to: final, the spec's,
	// or on the way to it (scope.stepTarget).
	target, final ownership.Topology
	active        *poolctl.Epoch
	pending       *poolctl.Epoch
	live          []poolctl.Member
	paused        bool
	abort         bool
	// retire lists units of the provisioned envelope outside the active
	// epoch: their consumers are deleted once drained.
	retire []ownership.Unit
	// allOwned: every unit of the active epoch has a valid claim.
	allOwned bool
	// wasRolling: status says a topology change was under way.
	wasRolling bool
	// podsInFlight names pods a pod roll has started and not finished.
	podsInFlight []string
	// manual: spec.rollout.approval is Manual.
	manual bool
	// plan is the change from the active epoch to the target, computed
	// when one is wanted and nothing is pending; approval is what the
	// approve annotation says about it.
	plan     *ownership.Plan
	approval approval
	// nextEpoch is the number the registry gives the next epoch (after
	// every epoch it wrote); 0 when not read.
	nextEpoch int64
	// barrier: the active epoch's order barrier still holds moved keys.
	barrier bool
	// unbarriered: the pending epoch's change keeps per-key order, but
	// the epoch was written without its barrier (before PerKey was set,
	// or by an operator that wrote barriers at activation): members may
	// have acknowledged its freeze without it, so it is retired and
	// written again with one.
	unbarriered bool
}

// state derives the change state from the world.
func (w *changeWorld) state() changeState {
	switch {
	case w.pending != nil && (w.abort || epochTopology(w.pending) != w.target):
		return stateStalePending
	case w.pending != nil:
		return stateFreezing
	case w.active == nil:
		return stateUnprovisioned
	case epochTopology(w.active) != w.target && w.manualUnapproved():
		return stateProposed
	case epochTopology(w.active) != w.target:
		return stateChangeWanted
	case len(w.retire) > 0 && !w.allOwned:
		return stateClaiming
	case len(w.retire) > 0:
		return stateRetiring
	case !w.allOwned && w.wasRolling:
		return stateClaiming
	default:
		return stateSteady
	}
}

// missingAcks lists live members that have not acknowledged the pending
// epoch with their current incarnation.
func (w *changeWorld) missingAcks() []string {
	if w.pending == nil {
		return nil
	}
	var missing []string
	for _, m := range w.live {
		if !slices.Contains(w.pending.Acked, m.Name) {
			missing = append(missing, m.Name)
		}
	}
	return missing
}

// changeRule is one row of the table: in state, when guard holds, run
// action.
type changeRule struct {
	state changeState
	// guard names the condition for the table's readers and the logs; ""
	// means always.
	guard  string
	when   func(*changeWorld) bool
	action changeAction
}

// changeAction is what a row does. Its step is what status.rollout.step
// shows while the row applies.
type changeAction struct {
	name string
	step string
	run  func(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error)
}

var (
	always       = func(*changeWorld) bool { return true }
	isPaused     = func(w *changeWorld) bool { return w.paused }
	isAborted    = func(w *changeWorld) bool { return w.abort }
	notAllAcked  = func(w *changeWorld) bool { return len(w.missingAcks()) > 0 }
	podsRolling  = func(w *changeWorld) bool { return len(w.podsInFlight) > 0 }
	barrierUp    = func(w *changeWorld) bool { return w.barrier }
	lacksBarrier = func(w *changeWorld) bool { return w.unbarriered }
	staleOK      = func(w *changeWorld) bool { return w.approval == approvalStale }
)

// changeRules is the topology change as data; the first row whose state
// matches and whose guard holds decides. Pause holds every step that
// changes the world; abort works while paused, since going back is safe.
//
//	state          condition                          action           step
//	Unprovisioned  abort annotation                   hold (stalled)   Abort
//	Unprovisioned  paused                             hold             Provision
//	Unprovisioned  -                                  start epoch      Provision -> Freeze
//	StalePending   -                                  retire pending   Abort
//	Freezing       a live member has not acked        wait (1s)        Freeze
//	Freezing       -                                  activate, move   Activate -> Claim
//	                                                  the transform
//	Proposed       abort annotation                   hold (stalled)   Abort
//	Proposed       approval names another plan        refuse, wait     Approve
//	Proposed       -                                  publish, wait    Approve
//	ChangeWanted   abort annotation                   hold (stalled)   Abort
//	ChangeWanted   a pod roll is in flight            wait (1s)        Provision
//	ChangeWanted   the last change's order barrier    wait (1s)        Provision
//	               holds moved keys
//	ChangeWanted   paused                             hold             Provision
//	ChangeWanted   -                                  start epoch      Provision -> Freeze
//	Claiming       -                                  wait (1s)        Claim
//	Retiring       paused                             hold             Retire
//	Retiring       -                                  retire drained   Retire
//	Steady         -                                  keep provisioned -
//
// Pause does not hold a freeze: a pending epoch stops every member's
// claims, so a member that died while it was held would never have its
// units adopted. A freeze under way is finished (activated once every
// live member acknowledged, which a dead member stops blocking when its
// lease lapses); pause holds the steps before it and after it (Provision,
// Retire, the pod roll).
//
// Proposed exists only under spec.rollout.approval: Manual; its rows
// change nothing in the world (shardtopology_plan.go). Claiming reports
// HandOver while a moved unit is still held by its old owner.
// Claiming, Retiring and Steady keep the active shape provisioned (with
// its subject transform on its own V) before anything else. After the
// table, publishRetiring writes the retiring set when it changed.
var changeRules = []changeRule{
	{stateUnprovisioned, "abort annotation set", isAborted, actHoldAborted},
	{stateUnprovisioned, "paused", isPaused, actHold(topologyv1.StepProvision)},
	{stateUnprovisioned, "", always, actStartEpoch},
	{stateStalePending, "", always, actRetirePending},
	{stateFreezing, "an ordered change's pending epoch has no order barrier", lacksBarrier, actRetirePending},
	{stateFreezing, "a live member has not acknowledged the freeze", notAllAcked, actWaitForAcks},
	{stateFreezing, "", always, actActivate},
	{stateProposed, "abort annotation set", isAborted, actHoldAborted},
	{stateProposed, "the approve annotation names another plan", staleOK, actRefuseApproval},
	{stateProposed, "", always, actPropose},
	{stateChangeWanted, "abort annotation set", isAborted, actHoldAborted},
	{stateChangeWanted, "a pod roll is in flight", podsRolling, actWaitForPods},
	{stateChangeWanted, "the last change's order barrier holds moved keys", barrierUp, actWaitForBarrier},
	{stateChangeWanted, "paused", isPaused, actHold(topologyv1.StepProvision)},
	{stateChangeWanted, "", always, actStartEpoch},
	{stateClaiming, "", always, actWaitForClaims},
	{stateRetiring, "paused", isPaused, actHold(topologyv1.StepRetire)},
	{stateRetiring, "", always, actRetireUnits},
	{stateSteady, "", always, actKeepProvisioned},
}

// decide returns the first rule that applies to w.
func decide(w *changeWorld) changeRule {
	st := w.state()
	for _, rule := range changeRules {
		if rule.state == st && rule.when(w) {
			return rule
		}
	}
	// Unreachable: every state ends with an unguarded row (the table test
	// checks it).
	return changeRule{state: st, when: always, action: actKeepProvisioned}
}

// changeReport is what the topology change step tells status.
type changeReport struct {
	state changeState
	// inProgress: a topology change is under way (status.rollout kind
	// Topology).
	inProgress bool
	step       string
	message    string
	// held: pause holds the next step.
	held bool
	// aborted: the abort annotation holds the spec's change back.
	aborted bool
	// unitsToMove is set when a new epoch was written as pending.
	unitsToMove int32
	// awaiting: the plan waits for approval; refused: the approve
	// annotation names another plan.
	awaiting, refused bool
	// approvedHash is the plan hash an approval started this reconcile.
	approvedHash string
	// from is the epoch the change starts from: the active epoch when a
	// change is decided before activation; nil for the first epoch and
	// once activated (the active epoch is then the change's target).
	from *poolctl.Epoch
}

// rollOutTopology runs the row of changeRules that applies now.
func rollOutTopology(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	if a := s.snap.Active; a != nil && s.snap.Pending == nil && epochTopology(a) != s.stepTarget() {
		next, err := nextEpochNumber(ctx, s.reg, s.registryKey())
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("read the next epoch's number: %w", err)
		}
		s.nextEpoch = next
	}
	w := s.changeWorld()
	rule := decide(w)
	s.change = changeReport{state: rule.state, step: rule.action.step, inProgress: rule.state != stateSteady}
	switch rule.state {
	case stateProposed, stateChangeWanted, stateFreezing, stateStalePending:
		s.change.from = w.active
	}
	s.publishPlan(w)
	log.FromContext(ctx).V(1).Info("Topology change rule", "state", string(rule.state), "guard", rule.guard, "action", rule.action.name)
	return rule.action.run(ctx, r, s, w)
}

// changeWorld gathers the rules' inputs from the scope.
func (s *scope) changeWorld() *changeWorld {
	w := &changeWorld{
		target:     s.stepTarget(),
		final:      s.target(),
		active:     s.snap.Active,
		pending:    s.snap.Pending,
		live:       s.snap.LiveMembers(),
		paused:     s.topo.IsPaused(),
		abort:      s.topo.IsAbortRequested(),
		wasRolling: wasChangingTopology(&s.topo.Status),
	}
	w.podsInFlight = s.roll.inFlightNames()
	w.manual = s.topo.Spec.Rollout.Approval == topologyv1.ApprovalManual
	if w.active != nil {
		total, owned := unitCounts(s.snap, s.claims)
		w.allOwned = total == owned
		w.retire = s.unitsToRetire(epochTopology(w.active))
	}
	w.nextEpoch = s.nextEpoch
	w.barrier = s.barrierUp()
	if ordered, _ := s.orderedChange(w); ordered {
		w.unbarriered = !s.pendingHasBarrier(w)
	}
	if w.active != nil && w.pending == nil && epochTopology(w.active) != w.target {
		p := changePlan(w, s.claims)
		w.plan = &p
		w.approval = approvalOf(s.topo, planHash(p))
	}
	return w
}

// wasChangingTopology reports whether status recorded a change from one
// epoch to another (not the first activation, after which unowned units
// only mean the workers have not come yet).
func wasChangingTopology(st *topologyv1.ShardTopologyStatus) bool {
	return st.Rollout != nil && st.Rollout.Kind == topologyv1.RolloutKindTopology && st.Rollout.FromEpoch != nil
}

// unitsToRetire lists units inside the provisioned envelope but outside
// active. Provision's orphans are inside it (provision widens the envelope
// over them), so status carries them across operator restarts.
func (s *scope) unitsToRetire(active ownership.Topology) []ownership.Unit {
	var out []ownership.Unit
	if p := s.provisioned; p != nil {
		env := ownership.Topology{Partitions: int(p.Partitions), Shards: int(p.ShardsPerPartition)}
		for _, u := range env.Units() {
			if !active.Contains(u) {
				out = append(out, u)
			}
		}
	}
	return out
}

// retiringSet is the units outside the active epoch whose consumers still
// exist: those retireUnits kept when it ran this reconcile, else the
// envelope outside the active epoch, less units of a pending epoch or of
// the spec's target (arriving, not leaving).
func (s *scope) retiringSet() []ownership.Unit {
	if s.retireRan {
		return s.retiringLeft
	}
	if s.snap == nil || s.snap.Active == nil {
		return nil
	}
	target := s.target()
	var out []ownership.Unit
	for _, u := range s.unitsToRetire(epochTopology(s.snap.Active)) {
		if target.Contains(u) || (s.snap.Pending != nil && epochTopology(s.snap.Pending).Contains(u)) {
			continue
		}
		out = append(out, u)
	}
	return out
}

// widen records that shape's consumers were provisioned.
func (s *scope) widen(t ownership.Topology) {
	p := topologyv1.TopologyShape{Partitions: int32(t.Partitions), ShardsPerPartition: int32(t.Shards)}
	if s.provisioned != nil {
		p.Partitions = max(p.Partitions, s.provisioned.Partitions)
		p.ShardsPerPartition = max(p.ShardsPerPartition, s.provisioned.ShardsPerPartition)
	}
	s.provisioned = &p
}

func actHold(step string) changeAction {
	return changeAction{name: "Hold", step: step, run: func(_ context.Context, _ *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
		s.change.held = true
		s.change.message = fmt.Sprintf("paused before %s of %s", step, describeChange(w))
		if acks := w.missingAcks(); w.pending != nil {
			s.change.message += fmt.Sprintf(" (%d/%d live members acknowledged the freeze)", len(w.live)-len(acks), len(w.live))
		}
		return ctrl.Result{RequeueAfter: pollIdle}, nil
	}}
}

// describeChange names the change in progress, e.g. "epoch 1 (2x4) -> 2x8".
func describeChange(w *changeWorld) string {
	to := w.target.String()
	if w.pending != nil {
		to = fmt.Sprintf("epoch %d (%s)", w.pending.Number, epochTopology(w.pending))
	}
	if w.final != w.target {
		to += fmt.Sprintf(", then %s (ordering PerKey changes V and N one at a time)", w.final)
	}
	if w.active == nil {
		return "the first epoch " + to
	}
	return fmt.Sprintf("epoch %d (%s) -> %s", w.active.Number, epochTopology(w.active), to)
}

var actStartEpoch = changeAction{name: "StartEpoch", step: topologyv1.StepProvision, run: startEpoch}

// startEpoch provisions the target's streams and consumers, then writes it
// as the pending epoch, which freezes claims. Provision never deletes: the
// active epoch's consumers keep flowing. Under a subject transform the
// streams keep routing over the active epoch's V (TransformShards): rows
// must not reach units nobody may claim before activation, nor be left in
// them if the change is abandoned. activate moves the transform.
func startEpoch(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	routed := 0
	if w.active != nil {
		routed = w.active.Shards
	}
	if err := s.provision(ctx, r, w.target, routed); err != nil {
		return ctrl.Result{}, err
	}
	if w.manual && s.plan != nil {
		if err := s.persistApproval(ctx, r, s.plan.Hash); err != nil {
			return ctrl.Result{}, err
		}
	}
	epoch, err := s.createPending(ctx, w)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("write epoch %s as pending: %w", w.target, err)
	}
	s.changed = true
	s.change.step = topologyv1.StepFreeze
	s.change.unitsToMove = int32(unitsToMove(w, s.claims))
	if w.manual && s.plan != nil {
		s.change.approvedHash = s.plan.Hash
		r.event(s, eventNormal, "PlanApproved", "Approve", "plan %s approved by annotation %s; epoch %d (%s) written as pending",
			s.plan.Hash, topologyv1.ApproveAnnotation, epoch, w.target)
	}
	s.change.message = fmt.Sprintf("epoch %d (%s) pending: waiting for %d live members to acknowledge the freeze", epoch, w.target, len(w.live))
	log.FromContext(ctx).Info("Epoch pending", "epoch", epoch, "shape", w.target.String(), "liveMembers", len(w.live))
	r.event(s, eventNormal, "EpochPending", "Freeze",
		"epoch %d (%s) written as pending after provisioning its consumers; %d live members must acknowledge the freeze", epoch, w.target, len(w.live))
	return ctrl.Result{RequeueAfter: pollFast}, nil
}

// provision makes sure t's streams and consumers exist, and records them in
// the provisioned envelope. Under a subject transform, rows are routed over
// routed shards (0: t's own V).
func (s *scope) provision(ctx context.Context, r *ShardTopologyReconciler, t ownership.Topology, routed int) error {
	pctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	l := layoutFor(s.topo, t)
	l.TransformShards = routed
	// Widen first, and write the envelope to status before Provision
	// creates anything beyond it: if Provision fails half way, or the
	// operator dies, or this reconcile's final status patch is skipped,
	// what it created is still covered and retired later. Consumers kept
	// for the transform's sake are covered too.
	covered := t
	if l.Assignment == natsops.AssignByTransform {
		covered.Shards = max(t.Shards, l.RoutedShards())
	}
	s.widen(covered)
	if err := s.persistEnvelope(ctx, r); err != nil {
		return err
	}
	rep, err := natsops.ProvisionWith(pctx, s.nc, l, natsops.ProvisionOptions{System: s.sys})
	if rep != nil {
		// Orphans (shards beyond V, every consumer of a stream beyond N)
		// are found in NATS whatever the envelope remembered.
		s.widenOver(rep.Orphans)
	}
	if err != nil {
		r.conns().forgetProvisioned(s.key)
		if refusal := s.natsRefusal(err); refusal != err {
			return refusal
		}
		return fmt.Errorf("provision %s: %w", t, err)
	}
	if err := s.persistEnvelope(ctx, r); err != nil {
		return err
	}
	r.conns().markProvisioned(s.key, provisionedKey(l), s.now)
	var unsafe []string
	for _, f := range rep.Findings {
		if !f.Updated {
			unsafe = append(unsafe, f.String())
		}
	}
	if len(unsafe) > 0 {
		r.event(s, eventWarning, "ProvisionDrift", "Provision",
			"%d differences left as they are (a person must decide): %s", len(unsafe), firstN(unsafe, 3))
	}
	if len(rep.Created) > 0 {
		log.FromContext(ctx).Info("Provisioned", "shape", t.String(), "created", len(rep.Created), "updated", len(rep.Updated))
	}
	return nil
}

// unitsToMove counts the units the change moves or adds: the Claim step of
// ownership.PlanChange over the live members and their claims.
func unitsToMove(w *changeWorld, claims map[string]poolctl.ClaimInfo) int {
	if w.active == nil {
		return w.target.Len()
	}
	in := changeInput(w, claims)
	if len(in.Members) == 0 {
		return w.target.Len()
	}
	plan, err := ownership.PlanChange(in)
	if err != nil {
		return 0
	}
	for _, st := range plan.Steps {
		if st.Name == ownership.StepClaim {
			return len(st.Moves)
		}
	}
	return 0
}

var actWaitForAcks = changeAction{name: "WaitForAcks", step: topologyv1.StepFreeze, run: func(_ context.Context, _ *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	missing := w.missingAcks()
	s.change.message = fmt.Sprintf("%s: %d/%d live members acknowledged the freeze; waiting for %s",
		describeChange(w), len(w.live)-len(missing), len(w.live), firstN(missing, 5))
	return ctrl.Result{RequeueAfter: pollFast}, nil
}}

var actActivate = changeAction{name: "Activate", step: topologyv1.StepActivate, run: activate}

// activate makes the pending epoch active. The registry checks the acks
// again in the same transaction (a member may have joined since the
// snapshot): a FreezeIncompleteError means wait, not fail. This is P2's
// operator half: no member decides under e+1 while another may still
// decide under e.
func activate(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	// An ordered change's barrier came with its pending epoch (the
	// rules retire a pending epoch written without one).
	_, unordered := s.orderedChange(w)
	err := s.reg.Activate(ctx, s.registryKey(), w.pending.Number)
	var incomplete *poolctl.FreezeIncompleteError
	if errors.As(err, &incomplete) {
		s.change.step = topologyv1.StepFreeze
		s.change.message = fmt.Sprintf("%s: waiting for %s to acknowledge the freeze", describeChange(w), firstN(incomplete.Missing, 5))
		return ctrl.Result{RequeueAfter: pollFast}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("activate epoch %d: %w", w.pending.Number, err)
	}
	s.changed = true
	r.conns().setCensusDue(s.key, true)
	// Now, not before: route rows over the new V. Should this fail, the
	// next reconcile finds the new epoch active and provisions it again
	// (ensureActiveProvisioned), whatever this process remembers.
	if err := s.ensureProvisioned(ctx, r, epochTopology(w.pending)); err != nil {
		return ctrl.Result{}, fmt.Errorf("epoch %d is active; %w", w.pending.Number, err)
	}
	if s.topo.Spec.NATS.ShardAssignment == topologyv1.ShardAssignmentSubjectTransform && w.active != nil && w.active.Shards != w.pending.Shards {
		r.event(s, eventNormal, "TransformMoved", "Activate", "the partition streams' subject transform now routes rows over %d shards (was %d)",
			w.pending.Shards, w.active.Shards)
	}
	if unordered != "" {
		r.event(s, eventWarning, "OrderNotKept", "Activate", "spec.rollout.ordering is PerKey, but %s: epoch %d (%s) moved keys without an order barrier",
			unordered, w.pending.Number, epochTopology(w.pending))
	}
	s.change.step = topologyv1.StepClaim
	s.change.message = fmt.Sprintf("epoch %d (%s) active: waiting for every unit to be claimed", w.pending.Number, epochTopology(w.pending))
	log.FromContext(ctx).Info("Epoch activated", "epoch", w.pending.Number, "shape", epochTopology(w.pending).String())
	r.event(s, eventNormal, "EpochActivated", "Activate", "epoch %d (%s) is active; every live member acknowledged the freeze",
		w.pending.Number, epochTopology(w.pending))
	return ctrl.Result{RequeueAfter: pollFast}, nil
}

var actRetirePending = changeAction{name: "RetirePending", step: topologyv1.StepAbort, run: retirePending}

// retirePending abandons a pending epoch the spec no longer wants, or that
// the abort annotation cancels, and goes back to the active one. Nothing
// was claimed under it (claims are frozen while it is pending), so nothing
// moves back, and the subject transform never moved (startEpoch keeps it
// on the active V), so its new units' consumers hold no rows: they are in
// the provisioned envelope outside the active epoch, and retireUnits
// deletes them.
func retirePending(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	if err := s.reg.Retire(ctx, s.registryKey(), w.pending.Number); err != nil {
		return ctrl.Result{}, fmt.Errorf("retire pending epoch %d: %w", w.pending.Number, err)
	}
	s.changed = true
	r.conns().forgetProvisioned(s.key)
	why := "the spec no longer asks for it"
	switch {
	case w.abort:
		why = "annotation " + topologyv1.AbortAnnotation + " asked for it"
	case w.unbarriered:
		why = "it was written without the order barrier spec.rollout.ordering PerKey needs (members may have acknowledged its freeze without it); it is written again with one"
	}
	back := "no epoch is active yet"
	if w.active != nil {
		back = fmt.Sprintf("epoch %d (%s) stays active", w.active.Number, epochTopology(w.active))
	}
	s.change.message = fmt.Sprintf("pending epoch %d (%s) retired because %s; %s", w.pending.Number, epochTopology(w.pending), why, back)
	r.event(s, eventNormal, "RolloutAborted", "Abort", "%s", s.change.message)
	return ctrl.Result{RequeueAfter: pollFast}, nil
}

var actHoldAborted = changeAction{name: "HoldAborted", step: topologyv1.StepAbort, run: holdAborted}

// holdAborted keeps the active epoch while the abort annotation is set:
// a person decides between the spec and the annotation, so it stalls.
func holdAborted(_ context.Context, _ *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	s.change.aborted = true
	if w.active == nil {
		s.change.message = fmt.Sprintf("annotation %s is set and no epoch is active yet, so there is nothing to go back to; remove the annotation to provision %s",
			topologyv1.AbortAnnotation, w.target)
	} else {
		s.change.message = fmt.Sprintf("the change to %s is aborted by annotation %s; epoch %d (%s) stays active. Set spec.partitions=%d and spec.shardsPerPartition=%d, or remove the annotation to roll the change out",
			w.target, topologyv1.AbortAnnotation, w.active.Number, epochTopology(w.active), w.active.Partitions, w.active.Shards)
	}
	s.stall = &StallError{Reason: topologyv1.ReasonRolloutAborted, Field: "metadata.annotations[" + topologyv1.AbortAnnotation + "]",
		Detail: s.change.message, Poll: pollIdle}
	return ctrl.Result{}, nil
}

var actWaitForPods = changeAction{name: "WaitForPods", step: topologyv1.StepProvision, run: func(_ context.Context, _ *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	s.change.message = fmt.Sprintf("%s waits for the pod roll in flight to finish (%s)", describeChange(w), strings.Join(w.podsInFlight, ", "))
	return ctrl.Result{RequeueAfter: pollFast}, nil
}}

var actWaitForBarrier = changeAction{name: "WaitForBarrier", step: topologyv1.StepProvision, run: func(_ context.Context, _ *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	b := s.activeBarrier()
	s.change.message = fmt.Sprintf("%s waits for the order barrier of epoch %d (%s): a key moved again before its old unit drained would lose its order",
		describeChange(w), b.Epoch, barrierChange(b))
	return ctrl.Result{RequeueAfter: pollFast}, nil
}}

var actWaitForClaims = changeAction{name: "WaitForClaims", step: topologyv1.StepClaim, run: func(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	if err := s.ensureActiveProvisioned(ctx, r, w); err != nil {
		return ctrl.Result{}, err
	}
	total, owned := unitCounts(s.snap, s.claims)
	s.change.message = fmt.Sprintf("epoch %d (%s) active: %d/%d units owned", w.active.Number, epochTopology(w.active), owned, total)
	if n := unitsHandingOver(s.snap, s.claims); n > 0 {
		s.change.step = topologyv1.StepHandOver
		s.change.message += fmt.Sprintf("; %d units still held by their old owner, handing over", n)
	}
	if len(w.live) == 0 {
		s.change.message += "; no live worker"
	}
	if len(w.retire) > 0 {
		s.change.message += fmt.Sprintf("; %d units that left are retired once every unit is owned", len(w.retire))
	}
	return ctrl.Result{RequeueAfter: pollFast}, nil
}}

// unitsHandingOver counts the active epoch's units held by a live member
// other than the one placement gives them: their old owner has not
// released them yet (the HandOver step of the plan).
func unitsHandingOver(snap *poolctl.Snapshot, claims map[string]poolctl.ClaimInfo) int {
	owners := ownedBy(snap, claims)
	n := 0
	for u, want := range placementOwners(epochTopology(snap.Active), snap.LiveMembers(), nil) {
		if have := owners[u]; have != "" && have != want {
			n++
		}
	}
	return n
}

var actRetireUnits = changeAction{name: "RetireUnits", step: topologyv1.StepRetire, run: retireUnits}

// retireUnits deletes the consumers of units that left the topology, but
// only those no member holds in the registry and that hold no rows:
// nothing pending, nothing waiting for an ack (natsops.RetireConsumers
// refuses the others). The rest are kept and looked at again; rows are
// never dropped. Streams are never deleted.
func retireUnits(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	// The active shape's transform first: no new row may reach a unit
	// being retired.
	if err := s.ensureActiveProvisioned(ctx, r, w); err != nil {
		return ctrl.Result{}, err
	}
	if behind, err := s.publishersBehind(ctx, w.active, w.retire); err != nil || len(behind) > 0 {
		if err != nil {
			return ctrl.Result{}, err
		}
		s.change.message = fmt.Sprintf("%d units that left are retired once every publisher publishes to epoch %d; still on an older epoch: %s",
			len(w.retire), w.active.Number, firstN(behind, 4))
		return ctrl.Result{RequeueAfter: pollFast}, nil
	}
	var free, keptUnits []ownership.Unit
	var held []string
	for _, u := range w.retire {
		if c, ok := s.claims[u.String()]; ok && c.State != poolctl.StateFree {
			held = append(held, fmt.Sprintf("%s (%s)", u, c.Owner))
			keptUnits = append(keptUnits, u)
			continue
		}
		free = append(free, u)
	}
	retired, holding, err := s.retireConsumers(ctx, free)
	if err != nil {
		return ctrl.Result{}, s.natsRefusal(err)
	}
	before := s.provisioned
	s.markRetired(retired, epochTopology(w.active))
	s.retireRan, s.retiringLeft = true, keptUnits
	for _, h := range holding {
		s.retiringLeft = append(s.retiringLeft, ownership.Unit{Partition: h.Unit.Partition, Shard: h.Unit.Shard})
	}
	slices.SortFunc(s.retiringLeft, ownership.CompareUnits)
	if len(s.retiringLeft) == 0 && before != nil && int(before.Partitions) > w.active.Partitions {
		l := layoutFor(s.topo, epochTopology(w.active))
		r.event(s, eventNormal, "StreamsKept", "Retire",
			"streams %s to %s of the partitions that left are kept with their rows (deleting a stream drops them); delete them by hand once they are no longer needed",
			l.StreamName(w.active.Partitions), l.StreamName(int(before.Partitions)-1))
	}
	if fresh := r.conns().newlyRetired(s.key, w.active.Number, unitNames(retired)); len(fresh) > 0 {
		r.event(s, eventNormal, "UnitsRetired", "Retire", "deleted the drained consumers of %d units that left the topology: %s",
			len(fresh), firstN(fresh, 8))
	}
	if len(held) == 0 && len(holding) == 0 {
		s.change.message = fmt.Sprintf("retired %d units that left the topology", len(retired))
		return ctrl.Result{RequeueAfter: pollFast}, nil
	}
	var waits []string
	for _, h := range holding {
		waits = append(waits, fmt.Sprintf("%s (%d pending, %d unacknowledged)", h.Unit, h.Pending, h.AckPending))
	}
	s.change.message = fmt.Sprintf("%d units that left the topology keep their consumers until drained", len(held)+len(holding))
	if len(held) > 0 {
		s.change.message += "; still claimed: " + firstN(held, 4)
	}
	if len(waits) > 0 {
		s.change.message += "; holding rows: " + firstN(waits, 4)
	}
	return ctrl.Result{RequeueAfter: pollSlow}, nil
}

// retireConsumers deletes the drained consumers of units.
func (s *scope) retireConsumers(ctx context.Context, units []ownership.Unit) ([]ownership.Unit, []natsops.Holding, error) {
	if len(units) == 0 {
		return nil, nil, nil
	}
	env := s.target()
	for _, u := range units {
		env.Partitions = max(env.Partitions, u.Partition+1)
		env.Shards = max(env.Shards, u.Shard+1)
	}
	nu := make([]natsops.Unit, len(units))
	for i, u := range units {
		nu[i] = natsops.Unit{Partition: u.Partition, Shard: u.Shard}
	}
	rctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	retired, holding, err := natsops.RetireConsumers(rctx, s.nc, layoutFor(s.topo, env), nu)
	out := make([]ownership.Unit, len(retired))
	for i, u := range retired {
		out[i] = ownership.Unit{Partition: u.Partition, Shard: u.Shard}
	}
	if err != nil {
		return out, holding, fmt.Errorf("retire consumers: %w", err)
	}
	return out, holding, nil
}

// markRetired shrinks the provisioned envelope once nothing outside the
// active shape is left.
func (s *scope) markRetired(retired []ownership.Unit, active ownership.Topology) {
	left := slices.DeleteFunc(s.unitsToRetire(active), func(u ownership.Unit) bool { return slices.Contains(retired, u) })
	if len(left) == 0 {
		s.provisioned = &topologyv1.TopologyShape{Partitions: int32(active.Partitions), ShardsPerPartition: int32(active.Shards)}
	}
}

var actKeepProvisioned = changeAction{name: "KeepProvisioned", step: "", run: keepProvisioned}

// keepProvisioned runs Provision for the active shape after every operator
// start and every reprovisionEvery, correcting drift.
func keepProvisioned(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	var res ctrl.Result
	if !w.allOwned {
		// Not Ready until workers own every unit: look again soon.
		res.RequeueAfter = 2 * pollFast
	}
	due := !r.conns().provisionedRecently(s.key, provisionedKey(layoutFor(s.topo, epochTopology(w.active))), s.now, reprovisionEvery)
	if err := s.ensureActiveProvisioned(ctx, r, w); err != nil {
		return ctrl.Result{}, err
	}
	if due {
		// As often as the drift check: each retired unit costs a probe.
		s.countStranded(ctx, r, epochTopology(w.active))
	}
	if len(s.unitsToRetire(epochTopology(w.active))) > 0 {
		// Provision found consumers outside the active shape (the
		// envelope now covers them): retire them at the next reconcile.
		return ctrl.Result{RequeueAfter: pollFast}, nil
	}
	return res, nil
}

// ensureActiveProvisioned provisions the active shape, with its subject
// transform on its own V, unless this process did exactly that within
// reprovisionEvery. The active epoch comes from the registry, so after an
// activation (or an operator restart) the transform follows it even when
// activate's own provisioning failed.
func (s *scope) ensureActiveProvisioned(ctx context.Context, r *ShardTopologyReconciler, w *changeWorld) error {
	return s.ensureProvisioned(ctx, r, epochTopology(w.active))
}

// ensureProvisioned provisions t with its subject transform on its own V,
// unless this process did exactly that within reprovisionEvery.
func (s *scope) ensureProvisioned(ctx context.Context, r *ShardTopologyReconciler, t ownership.Topology) error {
	if r.conns().provisionedRecently(s.key, provisionedKey(layoutFor(s.topo, t)), s.now, reprovisionEvery) {
		return nil
	}
	if s.nc != nil && !s.nc.IsConnected() {
		// Nothing answers (Report says NATS is unavailable): try at the
		// first reconcile that reaches a server, rather than wait out
		// every request's timeout now. Nothing is marked provisioned.
		return nil
	}
	return s.provision(ctx, r, t, 0)
}

// provisionedKey names what a Provision of l made sure of: the shape and
// the shard count rows are routed over.
func provisionedKey(l natsops.Layout) string {
	return fmt.Sprintf("%dx%d/routed %d", l.Partitions, l.Shards, l.RoutedShards())
}

// publishRetiring writes the retiring set (Registry.SetRetiring) when it
// differs from the registry's: units that left the active epoch and whose
// consumers still exist, so that workers drain one whose holder died or
// left instead of stranding its rows. It reads the registry again first
// when a step changed it (an activation changes what is outside the active
// epoch). An unchanged set costs no write.
func publishRetiring(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	if err := s.refreshRegistry(ctx); err != nil {
		return ctrl.Result{}, err
	}
	want := unitNames(s.retiringSet())
	if sameUnitSet(want, s.snap.Retiring) {
		return ctrl.Result{}, nil
	}
	if err := s.reg.SetRetiring(ctx, s.registryKey(), want); err != nil {
		return ctrl.Result{}, fmt.Errorf("publish the retiring set: %w", err)
	}
	s.changed = true
	if len(want) == 0 {
		r.event(s, eventNormal, "RetiringCleared", "PublishRetiring", "no unit outside the active epoch has a consumer left; the retiring set is empty")
	} else {
		r.event(s, eventNormal, "RetiringPublished", "PublishRetiring",
			"%d units outside the active epoch keep their consumers until drained; workers may claim them to drain them: %s", len(want), firstN(want, 8))
	}
	return ctrl.Result{}, nil
}

func sameUnitSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

func unitNames(us []ownership.Unit) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}

// firstN joins up to n items and says how many more there are.
func firstN(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
