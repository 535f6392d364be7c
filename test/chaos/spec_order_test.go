package chaos

import (
	"fmt"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// ordered starts scenario 15 at 2 x 8 under a subject transform with
// spec.rollout.ordering PerKey; the checker then fails any cross-unit
// per-key inversion. The publisher acknowledges every active epoch
// (startFollower), as a change of N needs.
func ordered(in specInput) specInput {
	in.From, in.Assignment, in.Ordering = shape(2, 8), topologyv1.ShardAssignmentSubjectTransform, topologyv1.OrderingPerKey
	return in
}

// orderSinkDelay slows every sink so the old units still hold a backlog
// at the activation (10 rows a second a unit).
const orderSinkDelay = 100 * time.Millisecond

// orderedHolderDies changes V or N under ordering PerKey while every old unit
// holds a backlog (every sink slowed, a burst on every old unit), and
// SIGKILLs, right after the activation, the holder of the old unit with
// the most rows waiting. The order barrier must wait for that unit's
// takeover and drain rather than give up order: the checker, judging
// under PerKey, must find no cross-unit inversion, every burst row must
// reach the sink, and the barrier must have been up (Ready False with
// reason OrderBarrier) and lifted (Ready at the new shape).
func orderedHolderDies(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		from := s.spec()
		s.awaitEveryPodHolds(from)
		pods := make([]string, s.input.Replicas)
		for i := range pods {
			pods[i] = fmt.Sprintf("ingest-%d", i)
			s.slowSink(pods[i], orderSinkDelay)
		}
		burst := s.fleet.PublishBurst(from.Units(), 150*len(from.Units()))
		s.disturb()
		s.setShape(to)
		s.awaitRegistry("the new epoch active", 2*time.Minute, activeIs(to))
		victim, most := ownership.Unit{}, 0
		for _, u := range from.Units() {
			if n := s.consumerRows(u); n > most && s.holderOf(u.String()) != "" {
				victim, most = u, n
			}
		}
		holder := s.holderOf(victim.String())
		inc := s.incarnationOf(holder)
		s.signalPod(holder, syscall.SIGKILL)
		// The fault lands mid-drain: rows still wait in the old unit,
		// whose keys moved (every old shard of V 8 -> 16 feeds shard
		// s + 8; under N 2 -> 3 each old partition feeds the other and
		// the new one).
		if most < 20 {
			s.t.Errorf("the held old unit with the most rows waiting had %d at the kill: the drain was (nearly) over", most)
		}
		s.eventually(2*time.Minute, func() error {
			if h := s.holderOf(victim.String()); h == "" || (h == holder && s.incarnationOf(h) == inc) {
				return fmt.Errorf("old unit %s not taken over from %s (incarnation %d) yet: held by %q", victim, holder, inc, h)
			}
			return nil
		})
		for _, pod := range pods {
			s.slowSink(pod, 0)
		}
		s.settle()
		s.note("SIGKILLed %s mid-drain of old unit %s (%d rows waiting), taken over by %s", holder, victim, most, s.holderOf(victim.String()))
		s.waitReady(to, 3*time.Minute)
		s.expectBurstDelivered(burst)
		barrier := false
		for _, g := range s.status.since(s.disturbed) {
			if c, reason := g.condition(topologyv1.ConditionReady); c == metav1.ConditionFalse && reason == topologyv1.ReasonOrderBarrier {
				barrier = true
				break
			}
		}
		if !barrier {
			s.t.Errorf("status never showed Ready False with reason %s after the change: the barrier held nothing", topologyv1.ReasonOrderBarrier)
		}
	}
}
