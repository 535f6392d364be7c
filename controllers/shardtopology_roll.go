package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// A pod-by-pod roll (design.md section 8) restarts the workload's pods
// that do not run the StatefulSet's update revision, highest ordinal
// first, spec.rollout.maxPodsAtOnce at a time. For each pod:
//
//  1. HandingOver: ask it to hand over (Registry.SetDraining true), also
//     when its worker has not joined or has left (the registry keeps the
//     request for a later join); every worker leaves a draining member
//     out of placement, so its units move away, and the draining member
//     claims nothing (poolctl.ErrDraining).
//  2. Verify in the registry that its member holds nothing; requeue until
//     then, and stall (still polling) once drainTimeout + lease + grace
//     have passed.
//  3. Deleting: set the drain request again (a person or a stray clear
//     may have lifted it), read the member from the registry once more
//     under it, and delete only if it holds nothing at that moment. A
//     member under a drain request cannot claim between that reading and
//     the delete, so "holds nothing" is still true when the pod goes.
//     The delete carries the pod's UID as precondition, so a replacement
//     that appeared meanwhile is never deleted by mistake.
//  4. Rejoining: once its replacement (same name, new UID) joined the
//     registry with a later incarnation than the one asked to hand over,
//     clear the drain request (it survives rejoins); the replacement must
//     be Ready and hold its placement; then the next pod.
//
// A drain request with no pod in flight behind it (a roll whose template
// went back, or status lost in a crash) is cleared, so no member stays
// out of placement.
//
// The StatefulSet must use the OnDelete update strategy, so that only the
// operator deletes pods and the StatefulSet controller recreates each at
// the update revision. Under OnDelete the StatefulSet controller never
// advances status.currentRevision, so "updateRevision != currentRevision"
// alone would mean a roll forever: a roll is needed while some pod's
// controller-revision-hash differs from status.updateRevision.
//
// What a restart needs is in status.rollout.pods (name, UID, incarnation
// of each pod in flight); everything else is read from the cluster and the
// registry again each reconcile.

// inFlightSteps are the pod steps an operator restart must resume.
var inFlightSteps = []string{topologyv1.PodStepHandingOver, topologyv1.PodStepDeleting, topologyv1.PodStepRejoining}

// podView is what the roll needs of one pod.
type podView struct {
	name     string
	ordinal  int
	uid      types.UID
	revision string
	ready    bool
	deleting bool
}

// rollReport is what the roll tells status.
type rollReport struct {
	// active: some pod does not run the update revision or is in flight.
	active bool
	// pods lists every pod in roll order with its step.
	pods        []topologyv1.PodRollStatus
	done, total int32
	step        string
	message     string
	// held: pause holds the next pod step.
	held bool
	// inFlight are the pods between hand-over request and rejoin.
	inFlight []topologyv1.PodRollStatus
	// revision is the StatefulSet's update revision, the roll's target.
	revision string
}

func (r rollReport) inFlightNames() []string {
	var out []string
	for _, p := range r.inFlight {
		out = append(out, p.Name)
	}
	return out
}

// rollWorld is the roll's input, read each reconcile.
type rollWorld struct {
	sts            *appsv1.StatefulSet
	updateRevision string
	replicas       int
	pods           map[string]podView
	// settled: the StatefulSet controller has seen the current spec.
	settled bool
}

// observePods reads the workload's pods and the roll in flight from status,
// so the topology change can tell whether a pod is being rolled.
func observePods(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	if st := s.topo.Status.Rollout; st != nil {
		for _, p := range st.Pods {
			if slices.Contains(inFlightSteps, p.Step) && p.UID != "" {
				s.roll.inFlight = append(s.roll.inFlight, p)
			}
		}
	}
	w, err := r.readRollWorld(ctx, s.sts)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.rollWorld = w
	s.roll.revision = w.updateRevision
	s.roll.active = len(s.roll.inFlight) > 0 || len(w.outdated(s.roll.inFlight)) > 0
	return ctrl.Result{}, nil
}

func (r *ShardTopologyReconciler) readRollWorld(ctx context.Context, sts *appsv1.StatefulSet) (*rollWorld, error) {
	w := &rollWorld{
		sts:            sts,
		updateRevision: sts.Status.UpdateRevision,
		replicas:       1,
		pods:           map[string]podView{},
		settled:        sts.Status.ObservedGeneration >= sts.Generation && sts.Status.UpdateRevision != "",
	}
	if sts.Spec.Replicas != nil {
		w.replicas = int(*sts.Spec.Replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("selector of StatefulSet %s: %w", sts.Name, err)
	}
	var list corev1.PodList
	if err := r.reader().List(ctx, &list, client.InNamespace(sts.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list pods of StatefulSet %s: %w", sts.Name, err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != sts.UID {
			continue
		}
		w.pods[p.Name] = podView{
			name:     p.Name,
			ordinal:  podOrdinal(p.Name),
			uid:      p.UID,
			revision: p.Labels[appsv1.ControllerRevisionHashLabelKey],
			ready:    podReady(p),
			deleting: p.DeletionTimestamp != nil,
		}
	}
	return w, nil
}

// outdated lists pods, highest ordinal first, that run another revision
// than the update revision and are not in flight.
func (w *rollWorld) outdated(inFlight []topologyv1.PodRollStatus) []podView {
	if !w.settled {
		return nil
	}
	var out []podView
	for _, p := range w.pods {
		if p.revision != w.updateRevision && !p.deleting && p.ordinal < w.replicas &&
			!slices.ContainsFunc(inFlight, func(e topologyv1.PodRollStatus) bool { return e.Name == p.name }) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b podView) int { return b.ordinal - a.ordinal })
	return out
}

// rollPods advances the pods in flight and starts the next ones.
func rollPods(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	w := s.rollWorld
	age, ok := r.conns().tokenAge(s.key, time.Now())
	if !ok {
		age = r.strayDrainHold() // no token taken by this Connections: nothing to wait for
	}
	if err := s.clearStrayDrains(ctx, age, r.strayDrainHold()); err != nil {
		return ctrl.Result{}, err
	}
	if !s.roll.active {
		if s.strayDrainsHeld {
			return ctrl.Result{RequeueAfter: pollFast}, nil
		}
		return ctrl.Result{}, nil
	}
	if !w.settled {
		s.roll.message = fmt.Sprintf("waiting for the StatefulSet controller to observe generation %d of %s", w.sts.Generation, w.sts.Name)
		s.roll.step = topologyv1.PodStepWaiting
		s.fillRollPods()
		return ctrl.Result{RequeueAfter: pollFast}, nil
	}
	var msgs []string
	var still []topologyv1.PodRollStatus
	for _, e := range s.roll.inFlight {
		if podOrdinal(e.Name) >= w.replicas {
			// Scaled away: its replacement will never come. Its drain
			// request, if any, is cleared with the strays next time.
			msgs = append(msgs, fmt.Sprintf("pod %s left the StatefulSet (scaled down)", e.Name))
			continue
		}
		e, msg, err := r.advancePod(ctx, s, e)
		if err != nil {
			return ctrl.Result{}, err
		}
		msgs = append(msgs, msg)
		if e != nil {
			still = append(still, *e)
		}
		if s.stall != nil {
			break
		}
	}
	s.roll.inFlight = still
	if s.stall == nil {
		msg, err := r.startPods(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if msg != "" {
			msgs = append(msgs, msg)
		}
	}
	s.roll.message = strings.Join(msgs, "; ")
	s.fillRollPods()
	if !s.roll.active {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: pollFast}, nil
}

// rollSettledTopology reports whether the topology lets a new pod start:
// nothing pending, and no change is starting in this reconcile. While an
// activated change waits for its units to be claimed (Claiming), the roll
// waits too, but only as long as claims can be expected: with no live
// worker, or once the handover bound (drainTimeout + leaseTTL + grace)
// has passed since the change started, it goes on, since restarting the
// pods is then the fix (workers that crash, or read N and V only at
// start), and the epoch is active, so nothing is frozen. Otherwise it
// says what the pod waits for.
func (s *scope) rollSettledTopology() (bool, string) {
	if p := s.snap.Pending; p != nil {
		return false, fmt.Sprintf("epoch %d (%dx%d) is pending: claims are frozen until it is activated", p.Number, p.Partitions, p.Shards)
	}
	switch s.change.state {
	case stateSteady, stateRetiring:
		return true, ""
	case stateChangeWanted:
		if s.change.aborted {
			return true, ""
		}
		return false, "a topology change is about to start"
	case stateClaiming:
		if len(s.snap.LiveMembers()) == 0 {
			return true, ""
		}
		bound := s.topo.Spec.Rollout.DrainTimeoutOrDefault() + s.params.LeaseTTL + s.params.Grace
		started := s.now
		if r := s.topo.Status.Rollout; r != nil && r.Kind == topologyv1.RolloutKindTopology && r.StartedAt != nil {
			started = r.StartedAt.Time
		}
		if waited := s.now.Sub(started); waited > bound {
			return true, ""
		}
		total, owned := unitCounts(s.snap, s.claims)
		return false, fmt.Sprintf("the active epoch's units are being claimed (%d/%d owned); the roll goes on %s after the change started if claims do not finish",
			owned, total, bound)
	}
	return false, fmt.Sprintf("the topology change is at %s", s.change.state)
}

// startPods starts handing over the next outdated pods, up to
// maxPodsAtOnce in flight.
func (r *ShardTopologyReconciler) startPods(ctx context.Context, s *scope) (string, error) {
	w := s.rollWorld
	outdated := w.outdated(s.roll.inFlight)
	room := s.topo.Spec.Rollout.MaxPodsAtOnceOrDefault() - len(s.roll.inFlight)
	if len(outdated) == 0 || room <= 0 {
		return "", nil
	}
	next := outdated[0].name
	settled, why := s.rollSettledTopology()
	switch {
	case !settled:
		return fmt.Sprintf("pod %s waits for the topology change to settle: %s", next, why), nil
	case s.topo.IsPaused():
		s.roll.held = true
		return fmt.Sprintf("paused before handing over pod %s", next), nil
	}
	// Do not take a pod down while another one that should serve is
	// down: missing or terminating (a pod this roll deleted whose status
	// entry was lost looks just like that), or not Ready at the update
	// revision (outdated pods that are not Ready are excepted: replacing
	// them may be the fix). This is judged from the pods, not from
	// status, so maxPodsAtOnce holds even when status lost an entry.
	for i := range w.replicas {
		name := w.sts.Name + "-" + strconv.Itoa(i)
		if slices.ContainsFunc(s.roll.inFlight, func(e topologyv1.PodRollStatus) bool { return e.Name == name }) {
			continue
		}
		switch p, ok := w.pods[name]; {
		case !ok:
			return fmt.Sprintf("pod %s waits for pod %s to be created", next, name), nil
		case p.deleting:
			return fmt.Sprintf("pod %s waits for pod %s to terminate and come back", next, name), nil
		case !p.ready && p.revision == w.updateRevision:
			return fmt.Sprintf("pod %s waits for pod %s to be Ready", next, name), nil
		}
	}
	var started []string
	for _, p := range outdated[:min(room, len(outdated))] {
		e := topologyv1.PodRollStatus{Name: p.name, Step: topologyv1.PodStepHandingOver, UID: string(p.uid), Since: ptrTime(s.now)}
		if m := s.snap.Member(p.name); m != nil {
			e.Incarnation = m.Incarnation
			e.Holds = int32(m.Holds)
		}
		// Whether or not its worker joined (or left): one that joins
		// from now on claims nothing.
		if err := s.setDraining(ctx, p.name, true); err != nil {
			return "", err
		}
		s.changed = true
		log.FromContext(ctx).Info("Pod asked to hand over", "member", p.name, "holds", e.Holds, "revision", p.revision, "updateRevision", w.updateRevision)
		r.event(s, eventNormal, "PodHandoverRequested", "HandOver",
			"pod %s (revision %s, update revision %s) asked to hand over its units before it is restarted", p.name, p.revision, w.updateRevision)
		s.roll.inFlight = append(s.roll.inFlight, e)
		started = append(started, p.name)
	}
	return fmt.Sprintf("asked %s to hand over", strings.Join(started, ", ")), nil
}

// advancePod moves one pod in flight as far as the world allows. It
// returns the entry to keep (nil once the pod rejoined) and what it waits
// for.
func (r *ShardTopologyReconciler) advancePod(ctx context.Context, s *scope, e topologyv1.PodRollStatus) (*topologyv1.PodRollStatus, string, error) {
	w := s.rollWorld
	pod, exists := w.pods[e.Name]
	if exists && string(pod.uid) == e.UID {
		return r.advanceOldPod(ctx, s, e, pod)
	}
	// The pod we asked to hand over is gone: wait for its replacement.
	if e.Step != topologyv1.PodStepRejoining {
		e.Step, e.Since = topologyv1.PodStepRejoining, ptrTime(s.now)
	}
	switch {
	case !exists || pod.deleting:
		return &e, fmt.Sprintf("pod %s: waiting for the StatefulSet controller to create its replacement", e.Name), nil
	case pod.revision != w.updateRevision:
		// Recreated at the old revision (the template moved back): it
		// counts as outdated again.
		return &e, fmt.Sprintf("pod %s came back at revision %s, not %s", e.Name, pod.revision, w.updateRevision), nil
	}
	m := s.snap.Member(e.Name)
	if m == nil || !m.Live || m.Incarnation <= e.Incarnation {
		return &e, fmt.Sprintf("pod %s: waiting for the replacement to join the registry", e.Name), nil
	}
	if m.Draining {
		// The replacement joined: the incarnation that was asked to hand
		// over is superseded, so the request has done its work.
		if err := s.setDraining(ctx, e.Name, false); err != nil {
			return nil, "", err
		}
		s.changed = true
		return &e, fmt.Sprintf("pod %s: replacement joined; drain request cleared", e.Name), nil
	}
	if !pod.ready {
		return &e, fmt.Sprintf("pod %s: waiting for the replacement to be Ready", e.Name), nil
	}
	if ok, why := s.holdsPlacement(m); !ok {
		e.Holds = int32(m.Holds)
		return &e, fmt.Sprintf("pod %s: waiting for the replacement to claim its placement (%s)", e.Name, why), nil
	}
	r.event(s, eventNormal, "PodRejoined", "Rejoin",
		"pod %s runs revision %s, joined the registry (incarnation %d) and holds its %d units", e.Name, pod.revision, m.Incarnation, m.Holds)
	return nil, fmt.Sprintf("pod %s rejoined", e.Name), nil
}

// advanceOldPod handles a pod in flight that has not been replaced yet:
// wait until its member holds nothing, then delete it.
func (r *ShardTopologyReconciler) advanceOldPod(ctx context.Context, s *scope, e topologyv1.PodRollStatus, pod podView) (*topologyv1.PodRollStatus, string, error) {
	if pod.deleting {
		e.Step = topologyv1.PodStepDeleting
		return &e, fmt.Sprintf("pod %s: terminating", e.Name), nil
	}
	m := s.snap.Member(e.Name)
	if m != nil && m.Holds > 0 {
		// A held claim counts whether or not the lease is live: its row
		// exists until someone adopts the unit (P6), so the pod still owns
		// rows in flight.
		e.Step, e.Holds = topologyv1.PodStepHandingOver, int32(m.Holds)
		if !m.Draining {
			// The request was cleared by someone else: ask again.
			if err := s.setDraining(ctx, e.Name, true); err != nil {
				return nil, "", err
			}
		}
		// A worker process that restarted in place joined afresh: its
		// replacement must come after this incarnation.
		e.Incarnation = max(e.Incarnation, m.Incarnation)
		bound := s.topo.Spec.Rollout.DrainTimeoutOrDefault() + s.params.LeaseTTL + s.params.Grace
		waited := s.now.Sub(sinceOr(e.Since, s.now))
		msg := fmt.Sprintf("pod %s: handing over, holds %d units (%s of at most %s)", e.Name, m.Holds, waited.Round(time.Second), bound)
		if waited > bound {
			s.stall = &StallError{Reason: topologyv1.ReasonHandoverTimeout, Field: "spec.rollout.drainTimeout",
				Detail: fmt.Sprintf("pod %s still holds %d units %s after it was asked to hand over (drainTimeout + leaseTTL + grace = %s); the roll waits for it and never deletes a pod that holds units. Check the worker's logs",
					e.Name, m.Holds, waited.Round(time.Second), bound),
				Poll: 2 * pollFast}
		}
		return &e, msg, nil
	}
	if e.Step == topologyv1.PodStepHandingOver {
		r.event(s, eventNormal, "PodHandoverVerified", "VerifyEmpty", "the registry shows pod %s holds no units", e.Name)
		e.Step, e.Holds, e.Since = topologyv1.PodStepDeleting, 0, ptrTime(s.now)
	}
	if s.topo.IsPaused() {
		s.roll.held = true
		return &e, fmt.Sprintf("pod %s handed over; paused before deleting it", e.Name), nil
	}
	// Delete only what the registry says holds nothing right now, under
	// a drain request that keeps it so until the pod is gone, as checked
	// by the current leader (operator_fence.go).
	checkStart := time.Now()
	dm, err := s.drainedMember(ctx, e.Name)
	if err != nil {
		return nil, "", err
	}
	if dm.Holds > 0 {
		e.Step, e.Holds, e.Since = topologyv1.PodStepHandingOver, int32(dm.Holds), ptrTime(s.now)
		e.Incarnation = max(e.Incarnation, dm.Incarnation)
		log.FromContext(ctx).Info("Pod claimed units after its handover was verified; delete called off", "member", e.Name, "holds", dm.Holds)
		return &e, fmt.Sprintf("pod %s: holds %d units again; handing over before it is deleted", e.Name, dm.Holds), nil
	}
	// The replacement must join after whatever incarnation runs now.
	e.Incarnation = max(e.Incarnation, dm.Incarnation)
	if took := time.Since(checkStart); took > r.deleteCheckValid() {
		// Paused (or slow) between the check and the delete: a newer
		// leader may have lifted the drain request since. Check again.
		log.FromContext(ctx).Info("Registry check before a pod delete is too old; checking again", "member", e.Name, "age", took.String())
		return &e, fmt.Sprintf("pod %s: the registry check before deleting it took %s; checking again", e.Name, took.Round(time.Millisecond)), nil
	}
	uid := types.UID(e.UID)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: e.Name, Namespace: s.topo.Namespace}}
	err = r.Client.Delete(ctx, p, client.Preconditions{UID: &uid})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Gone already, or replaced (the UID precondition failed).
	case err != nil:
		return nil, "", fmt.Errorf("delete pod %s: %w", e.Name, err)
	default:
		r.event(s, eventNormal, "PodDeleted", "Restart", "deleted pod %s, which the registry showed holding no units under a drain request that refuses its claims; the StatefulSet controller recreates it at revision %s",
			e.Name, s.rollWorld.updateRevision)
	}
	e.Step, e.Since = topologyv1.PodStepDeleting, ptrTime(s.now)
	return &e, fmt.Sprintf("pod %s: deleted", e.Name), nil
}

// holdsPlacement reports whether a rejoined member holds what placement
// gives its slot. Draining members are left out of the placement, as
// workers leave them out. When placement gives the member nothing, every
// unit being owned is enough.
func (s *scope) holdsPlacement(m *poolctl.Member) (bool, string) {
	if s.snap.Active == nil {
		return true, ""
	}
	owners := ownedBy(s.snap, s.claims)
	placed := placementOwners(epochTopology(s.snap.Active), s.snap.LiveMembers(), func(x poolctl.Member) bool { return x.Draining })
	want, have := 0, 0
	for u, owner := range placed {
		if owner == m.Name {
			want++
			if owners[u] == m.Name {
				have++
			}
		}
	}
	total, owned := unitCounts(s.snap, s.claims)
	switch {
	case want > 0 && have == want:
		return true, ""
	case owned == total && (m.Holds > 0 || want == 0):
		return true, ""
	}
	return false, fmt.Sprintf("holds %d of the %d units placement gives it; %d/%d units owned", have, want, owned, total)
}

// drainedMember sets member's drain request and reads the member from
// the registry under it, in one transaction under this leader's operator
// token (poolctl.OperatorRegistry.DrainedMember): what it holds then it
// can no longer add to (a draining member claims nothing, and claims in
// flight are waited for), so a delete decided on it is decided on the
// registry at that moment, by the leader of that moment.
func (s *scope) drainedMember(ctx context.Context, member string) (poolctl.Member, error) {
	d, ok := s.reg.(drainedMemberReader)
	if !ok {
		return poolctl.Member{}, errNoDrainedMember
	}
	m, err := d.DrainedMember(ctx, s.registryKey(), member)
	if err != nil {
		return poolctl.Member{}, fmt.Errorf("check member %s under its drain request before deleting its pod: %w", member, err)
	}
	s.changed = true
	return m, nil
}

// setDraining sets or clears the member's drain request. Clearing the
// request of a name with no row is a no-op.
func (s *scope) setDraining(ctx context.Context, member string, draining bool) error {
	err := s.reg.SetDraining(ctx, s.registryKey(), member, draining)
	if errors.Is(err, poolctl.ErrNotMember) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("set drain request of %s to %t: %w", member, draining, err)
	}
	return nil
}

// clearStrayDrains clears drain requests no pod in flight stands behind,
// except within hold of this process taking the operator token: a request
// the previous leader set may be what its last pod delete relied on
// (operator_fence.go).
func (s *scope) clearStrayDrains(ctx context.Context, tokenAge, hold time.Duration) error {
	for _, m := range s.snap.Members {
		if !m.Draining || slices.ContainsFunc(s.roll.inFlight, func(e topologyv1.PodRollStatus) bool { return e.Name == m.Name }) {
			continue
		}
		if tokenAge < hold {
			log.FromContext(ctx).V(1).Info("Drain request with no pod in flight kept while the previous leader's deletes may land",
				"member", m.Name, "clearAfter", (hold - tokenAge).String())
			s.strayDrainsHeld = true
			continue
		}
		if err := s.setDraining(ctx, m.Name, false); err != nil {
			return err
		}
		s.changed = true
	}
	return nil
}

// fillRollPods lists every pod in roll order with its step, and counts
// the pods done.
func (s *scope) fillRollPods() {
	w := s.rollWorld
	byName := map[string]topologyv1.PodRollStatus{}
	for _, e := range s.roll.inFlight {
		byName[e.Name] = e
	}
	s.roll.pods, s.roll.done, s.roll.total = nil, 0, int32(w.replicas)
	for i := w.replicas - 1; i >= 0; i-- {
		name := w.sts.Name + "-" + strconv.Itoa(i)
		if e, ok := byName[name]; ok {
			s.roll.pods = append(s.roll.pods, e)
			continue
		}
		p, ok := w.pods[name]
		e := topologyv1.PodRollStatus{Name: name, Step: topologyv1.PodStepWaiting}
		switch {
		case ok && p.revision == w.updateRevision && p.ready && !p.deleting:
			e.Step = topologyv1.PodStepDone
			s.roll.done++
		case ok && p.revision == w.updateRevision, !ok:
			e.Step = topologyv1.PodStepRejoining
		}
		if m := s.snap.Member(name); m != nil {
			e.Holds = int32(m.Holds)
		}
		s.roll.pods = append(s.roll.pods, e)
	}
	s.roll.step = ""
	for _, e := range s.roll.pods {
		if slices.Contains(inFlightSteps, e.Step) {
			s.roll.step = e.Step
			break
		}
	}
	s.roll.active = len(s.roll.inFlight) > 0 || len(w.outdated(s.roll.inFlight)) > 0
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podOrdinal is the ordinal suffix of a StatefulSet pod's name, -1 if none.
func podOrdinal(name string) int {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil {
		return -1
	}
	return n
}

func ptrTime(t time.Time) *metav1.Time {
	// Status keeps seconds; so does the copy in memory, or an unchanged
	// status would look changed.
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

func sinceOr(t *metav1.Time, def time.Time) time.Time {
	if t == nil {
		return def
	}
	return t.Time
}
