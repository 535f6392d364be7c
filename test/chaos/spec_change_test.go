package chaos

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Scenarios 8, 9 and 11: the spec and the abort annotation changing under
// a rollout.

// changedWhilePending changes the spec to second and, while second's
// epoch is pending (Freezing), to third: the stale pending epoch must be
// retired without ever being active, third must go through, and nothing
// may be left behind.
func changedWhilePending(second, third ownership.Topology) func(*scene) {
	return func(s *scene) {
		s.setShape(second)
		moved := s.moveWhilePending(second, third)
		s.settle()
		s.waitReady(third, readyTimeout)
		s.expectAbandoned(second, moved)
		s.expectNothingStranded(third)
	}
}

// pendingEpoch is what the registry said, just before the spec moved on,
// of the change it moved away from.
type pendingEpoch struct {
	at   time.Time
	step string // Freeze or Activate: pending, not active
}

// moveWhilePending waits until the registry holds pending's epoch as
// pending and changes the spec to next at once. It returns the step the
// awaited snapshot showed and when the move began. The step comes from
// that snapshot, not a fresh read: every read between the snapshot and
// the move widens the window in which the freeze completes first.
//
// The operator activates the epoch as soon as every live member has
// acknowledged its freeze, which a fast operator did before the spec
// update landed (a CI run, once the operator's own status patches stopped
// waking reconciles). So a member that has not acknowledged yet is
// SIGSTOPped for as long as the spec update takes (tens of milliseconds,
// far inside its lease), and the freeze cannot complete meanwhile.
func (s *scene) moveWhilePending(pending, next ownership.Topology) pendingEpoch {
	s.t.Helper()
	sn := s.awaitRegistry("the pending epoch", time.Minute, pendingIs(pending))
	resume := s.holdFreeze(sn)
	at := time.Now()
	s.setShape(next)
	resume()
	step := topologyv1.StepFreeze
	if allAcked(sn) {
		step = topologyv1.StepActivate
	}
	return pendingEpoch{at: at, step: step}
}

// holdFreeze SIGSTOPs the worker of a live member that sn shows has not
// acknowledged the pending freeze, and returns what resumes it; nothing
// when every member had.
func (s *scene) holdFreeze(sn poolctl.Snapshot) (resume func()) {
	s.t.Helper()
	for _, m := range sn.LiveMembers() {
		if slices.Contains(sn.Pending.Acked, m.Name) {
			continue
		}
		s.signalPod(m.Name, syscall.SIGSTOP)
		return func() { s.signalPod(m.Name, syscall.SIGCONT) }
	}
	s.note("every member had acknowledged the freeze when the pending epoch was seen: nothing held")
	return func() {}
}

// expectAbandoned checks that the fault took effect (the epoch of shape
// was pending, Freeze or Activate in the registry, when the spec moved
// on) and that the epoch was retired after the move without ever being
// active.
func (s *scene) expectAbandoned(shape ownership.Topology, moved pendingEpoch) {
	s.t.Helper()
	if moved.step != topologyv1.StepFreeze && moved.step != topologyv1.StepActivate {
		s.t.Errorf("the spec moved away from %s at step %s (registry, just before): its epoch was not pending", shape, moved.step)
	}
	e, ok := s.epochOf(shape)
	switch {
	case !ok:
		s.t.Errorf("no epoch of shape %s was ever written", shape)
	case !e.ActivatedAt.IsZero():
		s.t.Errorf("epoch %d (%s) was activated at %s before the spec moved on: the scenario lost its race with the freeze; rerun it",
			e.Number, shape, e.ActivatedAt.Format("15:04:05.000"))
	case e.RetiredAt.IsZero():
		s.t.Errorf("epoch %d (%s) was never retired", e.Number, shape)
	case e.RetiredAt.Before(moved.at):
		s.t.Errorf("epoch %d (%s) was retired at %s, before the spec moved on at %s: it was not pending when the spec moved",
			e.Number, shape, e.RetiredAt.Format("15:04:05.000"), moved.at.Format("15:04:05.000"))
	default:
		s.note("epoch %d (%s) was pending at step %s when the spec moved on (registry), retired %s later, never active",
			e.Number, shape, moved.step, e.RetiredAt.Sub(moved.at).Round(time.Millisecond))
	}
}

// expectNothingStranded checks, once Ready at topo, that nothing outside
// it is left: status's provisioned envelope is topo, the registry's
// retiring set is empty, and every stream has exactly topo's consumers.
func (s *scene) expectNothingStranded(topo ownership.Topology) {
	s.t.Helper()
	s.eventually(time.Minute, func() error {
		g, _ := s.status.latest()
		p := g.obj.Status.Provisioned
		if p == nil || int(p.Partitions) != topo.Partitions || int(p.ShardsPerPartition) != topo.Shards {
			return fmt.Errorf("status.provisioned is %+v, want %s", p, topo)
		}
		return nil
	})
	s.expectRetiringEmpty()
	for p := 0; p < topo.Partitions; p++ {
		names := s.consumerNames(p)
		var want []string
		for sh := 0; sh < topo.Shards; sh++ {
			want = append(want, s.fleet.Layout.ConsumerDurable(p, sh))
		}
		slices.Sort(want)
		if !slices.Equal(names, want) {
			s.t.Errorf("stream %s has consumers %v, want exactly %v", s.fleet.Layout.StreamName(p), names, want)
		}
	}
	s.note("nothing stranded: provisioned %s, retiring set empty, every stream has exactly its consumers", topo)
}

// consumerNames lists partition p's stream's consumers, sorted.
func (s *scene) consumerNames(p int) []string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.jetstream().Stream(ctx, s.fleet.Layout.StreamName(p))
	if err != nil {
		s.t.Fatal(err)
	}
	lister := st.ConsumerNames(ctx)
	var names []string
	for n := range lister.Name() {
		names = append(names, n)
	}
	if err := lister.Err(); err != nil {
		s.t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// abortAfterActivation sets the abort annotation once the change to `to`
// is active, while it still claims units. As documented, an active epoch
// is not undone: the change completes. While the annotation stays, a
// change back is held (Stalled, RolloutAborted) and no epoch starts; once
// it goes, the change back goes through. The fault must take effect: the
// epoch activated before the annotation was set (registry) and the change
// not over once it was (a unit still unowned or retiring, registry).
func abortAfterActivation(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		from := s.spec()
		s.setShape(to)
		s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(to)(sn) && s.someUnowned(to)
		})
		set := time.Now()
		s.annotate(topologyv1.AbortAnnotation, "true")
		step := s.stepNow(to)
		e, ok := s.epochOf(to)
		switch {
		case !ok || e.ActivatedAt.IsZero() || e.ActivatedAt.After(set):
			s.t.Errorf("the epoch of %s was not active before the abort annotation was set at %s (registry: %+v)", to, set.Format("15:04:05.000"), e)
		case step == "done":
			s.t.Errorf("the change to %s was over once the abort annotation was set (registry): the abort met no change under way", to)
		}
		s.note("abort set %s after the epoch of %s activated (registry), with the change at step %s once set",
			set.Sub(e.ActivatedAt).Round(time.Millisecond), to, step)
		s.waitReady(to, readyTimeout)
		s.note("abort set after activation: the change to %s completed (an active epoch is not undone)", to)
		s.setShape(from)
		s.awaitStatus("Stalled/RolloutAborted", time.Minute, func(g sighting) bool {
			c, reason := g.condition(topologyv1.ConditionStalled)
			return s.generationIs(g) && c == metav1.ConditionTrue && reason == topologyv1.ReasonRolloutAborted
		})
		if sn, err := s.snapshot(); err != nil || sn.Pending != nil || !activeIs(to)(sn) {
			s.t.Errorf("while aborted, the registry must keep %s active with nothing pending: %+v (%v)", to, sn, err)
		}
		s.note("abort held the change back to %s: Stalled/RolloutAborted, %s stays active, nothing pending", from, to)
		s.annotate(topologyv1.AbortAnnotation, "")
		s.settle()
		s.waitReady(from, readyTimeout)
		s.expectNothingStranded(from)
	}
}

// abortDuringPodRoll sets the abort annotation while a pod hands over in
// a pod roll. As documented, abort retires pending epochs and holds new
// ones; a pod roll is neither, so it goes on to the end without a stall.
// The fault must take effect: the pod held units when the annotation was
// set and handed at least one over to another member after (claim
// history).
func abortDuringPodRoll() func(*scene) {
	return func(s *scene) {
		const pod = "ingest-1"
		s.rollPods()
		s.awaitStatus(pod+" HandingOver", 3*time.Minute, func(g sighting) bool { return g.podStep(pod) == topologyv1.PodStepHandingOver })
		inc := s.incarnationOf(pod)
		set := time.Now()
		s.annotate(topologyv1.AbortAnnotation, "true")
		s.waitReady(s.spec(), readyTimeout)
		events := s.claimHistory()
		held := heldAt(events, pod, set)
		handed := takenOver(events, held, pod, inc, set, time.Now())
		switch {
		case len(held) == 0:
			s.t.Errorf("%s held no unit when the abort annotation was set: its handover was over, the abort met no pod handing over", pod)
		case len(handed) == 0:
			s.t.Errorf("none of the %d units %s held when the abort was set went to another member or incarnation after: no handover met the abort", len(held), pod)
		}
		s.note("abort set while %s held %d units; %d of them handed over after it (claim history)", pod, len(held), len(handed))
		for _, g := range s.status.since(set) {
			if c, reason := g.condition(topologyv1.ConditionStalled); c == metav1.ConditionTrue {
				s.t.Errorf("abort during a pod roll stalled the topology (%s): %s", reason, g)
				break
			}
		}
		s.note("abort set while ingest-1 handed over: the pod roll finished, no stall")
		s.annotate(topologyv1.AbortAnnotation, "")
		s.settle()
	}
}

// transformRevertedWhileFreezing changes V to `to` under a subject
// transform and reverts the spec while the new epoch is pending: the
// transform never moved, so no row may have been routed to a shard beyond
// the original V (no unit nobody may claim), and the new consumers must
// be retired.
func transformRevertedWhileFreezing(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		from := s.spec()
		s.setShape(to)
		moved := s.moveWhilePending(to, from)
		s.settle()
		s.waitReady(from, readyTimeout)
		s.expectAbandoned(to, moved)
		s.expectNoRowsBeyond(from, to)
		s.expectNothingStranded(from)
	}
}

// expectNoRowsBeyond checks that no row was stored in, delivered from or
// written for a shard of `to` beyond from's V.
func (s *scene) expectNoRowsBeyond(from, to ownership.Topology) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stored := 0
	for p := 0; p < from.Partitions; p++ {
		st, err := s.jetstream().Stream(ctx, s.fleet.Layout.StreamName(p))
		if err != nil {
			s.t.Fatal(err)
		}
		for sh := from.Shards; sh < to.Shards; sh++ {
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(s.fleet.Layout.FilterSubject(p, sh)))
			if err != nil {
				s.t.Fatal(err)
			}
			for _, n := range info.State.Subjects {
				stored += int(n)
			}
		}
	}
	written := 0
	for _, w := range s.sinkWrites() {
		if u, err := ownership.ParseUnit(w.Unit); err == nil && !from.Contains(u) {
			written++
		}
	}
	if stored+written > 0 {
		s.t.Errorf("rows routed beyond V=%d: %d stored in shards %d..%d, %d written from them", from.Shards, stored, from.Shards, to.Shards-1, written)
	}
	s.note("rows routed to shards %d..%d (no claimable unit): %d stored, %d written", from.Shards, to.Shards-1, stored, written)
}
