package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Scenarios 1 and 2: the operator process SIGKILLed at each step of a V
// change and of a pod roll, and started again.

// stepKill is one change of the spec and the step at which the operator
// is killed during it.
type stepKill struct {
	To   ownership.Topology
	Step string
}

// stepRank orders the steps of a topology change; a finished change ranks
// last.
func stepRank(step string) int {
	if i := slices.Index(topologyv1.TopologySteps, step); i >= 0 {
		return i
	}
	return len(topologyv1.TopologySteps)
}

// operatorKilledAtEachStep runs the changes one after another, SIGKILLs
// the operator when each reaches its step, starts it again, and checks
// that the kill landed at that step (from the registry, just before the
// kill), that the operator resumed at that step or a later one (never an
// earlier one) and that no epoch was created twice.
//
// A step can be a few hundred milliseconds long under load, and the test
// sees it only by polling; when the kill lands at another step, the
// change is undone without a kill and made again, up to killTries times,
// so one unlucky poll does not fail the scenario while a step the test
// can never hit still does.
func operatorKilledAtEachStep(kills []stepKill) func(*scene) {
	return func(s *scene) {
		changes := 0
		for _, k := range kills {
			for try := 1; ; try++ {
				from := s.spec()
				changes++
				if s.killOperatorAt(k, try == killTries) {
					break
				}
				s.setShape(from)
				s.waitReady(from, readyTimeout)
				changes++
				s.note("change to %s: the kill missed %s; changed back to %s to aim again (try %d of %d)", k.To, k.Step, from, try+1, killTries)
			}
		}
		s.settle()
		s.expectEachEpochOnce(changes)
	}
}

// killTries is how many times a change is made to hit its step.
const killTries = 3

// killOperatorAt changes the spec to k.To, kills the operator when the
// change reaches k.Step, starts it again and waits until the change is
// done. It reports whether the kill landed at k.Step; a miss is an error
// only on the last try.
func (s *scene) killOperatorAt(k stepKill, lastTry bool) bool {
	s.t.Helper()
	undo := s.prepareStep(k)
	s.setShape(k.To)
	landed := s.awaitStep(k)
	members := s.liveIncarnations()
	killAt := time.Now()
	if err := s.in.op.Kill(); err != nil {
		s.t.Fatal(err)
	}
	// Every version after this one is the new process's: the watch may
	// still be delivering the killed one's last status (a Freeze written
	// just before its acknowledgements came in, say), which says nothing
	// about where the new process resumed.
	killed := s.topologyVersion()
	if err := s.in.op.Start(); err != nil {
		s.t.Fatal(err)
	}
	undo()
	// The first step status shows from the new process on: the same step
	// (then status may not change until a later one) or a later one.
	g, ok := s.status.await(killAt, readyTimeout, func(g sighting) bool {
		return versionAfter(g.obj.ResourceVersion, killed) && (g.step() != "" || g.readyAt(k.To))
	})
	resumed := "Ready"
	if ok && g.step() != "" {
		resumed = g.step()
	}
	if stepRank(resumed) < stepRank(landed) {
		// Back from Activate to Freeze is right when a member joined or
		// rejoined since the kill: its new incarnation has not acknowledged
		// the freeze (P2). Anything else going back is the operator's.
		if rejoined := s.rejoinedSince(members); landed == topologyv1.StepActivate && resumed == topologyv1.StepFreeze && len(rejoined) > 0 {
			s.note("change to %s: the restarted operator went back from %s to %s because %v joined or rejoined since the kill (a new incarnation must acknowledge the freeze)",
				k.To, landed, resumed, rejoined)
		} else {
			s.t.Errorf("killed at %s of the change to %s, the restarted operator went back to %s (no member joined or rejoined since the kill)", landed, k.To, resumed)
		}
	}
	if landed != k.Step && lastTry {
		s.t.Errorf("change to %s: aimed at %s, the kill landed at %s (registry) on each of %d tries: the step under test was not hit", k.To, k.Step, landed, killTries)
	}
	s.waitReady(k.To, readyTimeout)
	s.note("change to %s: operator killed at %s (%s after the spec change), resumed at %s; Ready %s after the kill",
		k.To, landed, killAt.Sub(s.lastSpecChange()).Round(time.Millisecond), resumed, time.Since(killAt).Round(time.Second))
	return landed == k.Step
}

// allPlaced reports whether every unit of to is held, not in handover,
// by the live member placement gives it (as the operator places units).
func (s *scene) allPlaced(sn poolctl.Snapshot, to ownership.Topology) bool {
	bySlot := map[ownership.Slot]string{}
	var slots []ownership.Slot
	for _, m := range sn.LiveMembers() {
		if m.Slot >= 0 {
			bySlot[ownership.Slot(m.Slot)] = m.Name
			slots = append(slots, ownership.Slot(m.Slot))
		}
	}
	pl := ownership.Place(to.Units(), slots)
	cl := s.claims()
	for _, u := range to.Units() {
		slot, ok := pl.Owner(u)
		c := cl[u.String()]
		if !ok || c.State != poolctl.StateHeld || c.Owner != bySlot[slot] {
			return false
		}
	}
	return true
}

// topologyVersion reads the topology's resourceVersion from the API
// server now.
func (s *scene) topologyVersion() string {
	s.t.Helper()
	st := &topologyv1.ShardTopology{}
	if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, st); err != nil {
		s.t.Fatalf("read the topology: %v", err)
	}
	return st.ResourceVersion
}

// versionAfter reports whether resourceVersion v is later than w. The
// test bed's API server stores in etcd, whose versions are revisions.
func versionAfter(v, w string) bool {
	a, errA := strconv.ParseUint(v, 10, 64)
	b, errB := strconv.ParseUint(w, 10, 64)
	return errA == nil && errB == nil && a > b
}

// liveIncarnations maps each live member to its incarnation now.
func (s *scene) liveIncarnations() map[string]int64 {
	s.t.Helper()
	sn, err := s.snapshot()
	if err != nil {
		s.t.Fatalf("read the registry: %v", err)
	}
	out := map[string]int64{}
	for _, m := range sn.LiveMembers() {
		out[m.Name] = m.Incarnation
	}
	return out
}

// rejoinedSince names the live members whose incarnation is not the one
// in before (they joined or rejoined since), sorted.
func (s *scene) rejoinedSince(before map[string]int64) []string {
	var out []string
	for name, inc := range s.liveIncarnations() {
		if was, ok := before[name]; !ok || was != inc {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// lastSpecChange is when the test last changed the spec, from the watch.
func (s *scene) lastSpecChange() time.Time {
	seen := s.status.since(s.disturbed)
	for i := len(seen) - 1; i > 0; i-- {
		if seen[i].obj.Generation != seen[i-1].obj.Generation {
			return seen[i].at
		}
	}
	return s.disturbed
}

// prepareStep makes a short step last long enough to be hit: before a
// change whose Retire step is the target, the holder of a leaving unit
// gets a backlog and a slow sink, so the unit keeps its consumer for
// seconds after activation. It returns how to undo it.
func (s *scene) prepareStep(k stepKill) func() {
	if k.Step != topologyv1.StepRetire {
		return func() {}
	}
	cur := s.spec()
	leaving := ownership.Unit{Partition: cur.Partitions - 1, Shard: cur.Shards - 1}
	if k.To.Contains(leaving) {
		s.t.Fatalf("a kill at Retire needs a change that retires units; %s keeps %s", k.To, leaving)
	}
	holder := s.holderOf(leaving.String())
	s.slowSink(holder, 300*time.Millisecond)
	s.fleet.PublishBurst([]ownership.Unit{leaving}, 40)
	return func() { s.slowSink(holder, 0) }
}

// awaitStep returns when the change to k.To is at k.Step (as close as the
// registry, NATS or status let the test see it), and the step it is at.
func (s *scene) awaitStep(k stepKill) string {
	s.t.Helper()
	switch k.Step {
	case topologyv1.StepProvision:
		s.awaitNewConsumer(k.To)
	case topologyv1.StepFreeze:
		s.awaitRegistry("the pending epoch", time.Minute, pendingIs(k.To))
	case topologyv1.StepActivate:
		s.awaitRegistry("every live member's freeze acknowledgement", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(k.To)(sn) || (pendingIs(k.To)(sn) && allAcked(sn))
		})
	case topologyv1.StepClaim:
		s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(k.To)(sn) && s.someUnowned(k.To)
		})
	case topologyv1.StepRetire:
		s.awaitStatus("step Retire", 2*time.Minute, func(g sighting) bool { return g.step() == topologyv1.StepRetire })
		// Retire starts once every unit has a holder, possibly still the
		// old one of a moved unit: its release then leaves the unit free
		// for a moment, and the operator (rightly) back at Claim. Aim at
		// Retire once every unit is with its placement owner.
		s.awaitRegistry("every unit with its placement owner while units retire", time.Minute, func(sn poolctl.Snapshot) bool {
			return len(sn.Retiring) > 0 && s.allPlaced(sn, k.To)
		})
	}
	return s.stepNow(k.To)
}

// stepNow says which step the change to `to` is at, from the registry:
// what a restarted operator finds.
func (s *scene) stepNow(to ownership.Topology) string {
	sn, err := s.snapshot()
	switch {
	case err != nil:
		s.t.Fatal(err)
	case pendingIs(to)(sn) && allAcked(sn):
		return topologyv1.StepActivate
	case pendingIs(to)(sn):
		return topologyv1.StepFreeze
	case !activeIs(to)(sn):
		return topologyv1.StepProvision
	case s.someUnowned(to):
		return topologyv1.StepClaim
	case len(sn.Retiring) > 0, s.leftBehind(to) > 0:
		return topologyv1.StepRetire
	}
	if g, ok := s.status.latest(); ok && g.step() == topologyv1.StepRetire {
		return topologyv1.StepRetire
	}
	return "done"
}

// leftBehind counts the unit consumers outside `to` still in the streams
// `to` keeps: units the operator has still to retire. Between activation
// and the operator's Retire step no unit is unowned and no retiring row
// is written yet, and only these tell that the change is not over.
func (s *scene) leftBehind(to ownership.Topology) int {
	n := 0
	for p := range to.Partitions {
		for _, name := range s.consumerNames(p) {
			if shard, ok := s.fleet.Layout.ParseConsumerDurable(p, name); ok && shard >= to.Shards {
				n++
			}
		}
	}
	return n
}

func allAcked(sn poolctl.Snapshot) bool {
	for _, m := range sn.LiveMembers() {
		if !slices.Contains(sn.Pending.Acked, m.Name) {
			return false
		}
	}
	return true
}

// someUnowned reports whether a unit of `to` has no holder with a live
// lease.
func (s *scene) someUnowned(to ownership.Topology) bool {
	sn, err := s.snapshot()
	if err != nil {
		return false
	}
	live := map[string]bool{}
	for _, m := range sn.LiveMembers() {
		live[m.Name] = true
	}
	cl := s.claims()
	for _, u := range to.Units() {
		c, ok := cl[u.String()]
		if !ok || c.State == poolctl.StateFree || !live[c.Owner] {
			return true
		}
	}
	return false
}

// awaitNewConsumer returns as soon as a consumer of `to` that the current
// shape lacks exists: the operator is provisioning. Provision is short (a
// few consumers, a status patch, the pending epoch), so the test listens
// for JetStream's consumer-created advisories rather than polling: a poll
// under load saw the pending epoch before the kill it aimed at Provision.
func (s *scene) awaitNewConsumer(to ownership.Topology) {
	s.t.Helper()
	js := s.jetstream()
	from := s.input.From
	if sn, err := s.snapshot(); err == nil && sn.Active != nil {
		from = ownership.Topology{Partitions: sn.Active.Partitions, Shards: sn.Active.Shards}
	}
	l := s.fleet.Layout
	fresh := map[string]bool{}
	for _, u := range to.Units() {
		if !from.Contains(u) {
			fresh[l.StreamName(u.Partition)+"."+l.ConsumerDurable(u.Partition, u.Shard)] = true
		}
	}
	nc := js.Conn()
	sub, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>")
	if err != nil {
		s.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		s.t.Fatal(err)
	}
	// One may have been created before the subscription.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name := range fresh {
		stream, consumer, _ := strings.Cut(name, ".")
		if _, err := js.Consumer(ctx, stream, consumer); err == nil {
			return
		}
	}
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		msg, err := sub.NextMsg(time.Until(end))
		if err != nil {
			break
		}
		if fresh[strings.TrimPrefix(msg.Subject, "$JS.EVENT.ADVISORY.CONSUMER.CREATED.")] {
			return
		}
	}
	s.t.Fatalf("no consumer of %s's new units created within a minute", to)
}

// expectEachEpochOnce checks the registry's epoch history: the first epoch
// and one per change, each activated, none abandoned (a pending epoch
// written twice would show as one abandoned).
func (s *scene) expectEachEpochOnce(changes int) {
	s.t.Helper()
	epochs := s.epochHistory()
	var shapes []string
	for _, e := range epochs {
		shapes = append(shapes, fmt.Sprintf("%d:%dx%d", e.Number, e.Partitions, e.Shards))
		if e.ActivatedAt.IsZero() {
			s.t.Errorf("epoch %d (%dx%d) was never activated: written for a change that had its epoch already", e.Number, e.Partitions, e.Shards)
		}
	}
	if len(epochs) != changes+1 {
		s.t.Errorf("%d epochs for the first shape and %d changes, want %d: %v", len(epochs), changes, changes+1, shapes)
	}
	s.note("epochs: %v (one per change, each activated once)", shapes)
}

// podKill is a pod of a roll and the step at which the operator is killed
// while the roll is at that pod.
type podKill struct {
	Pod, Step string
}

// operatorKilledDuringPodRoll rolls the pods and kills the operator at
// each pod's step, then checks from the API server's audit log and the
// registry's claim history that no pod was deleted while it held a unit.
func operatorKilledDuringPodRoll(kills []podKill) func(*scene) {
	return func(s *scene) {
		s.rollPods()
		for _, k := range kills {
			g := s.awaitStatus(k.Pod+" "+k.Step, 3*time.Minute, func(g sighting) bool { return g.podStep(k.Pod) == k.Step })
			if err := s.in.op.Kill(); err != nil {
				s.t.Fatal(err)
			}
			if err := s.in.op.Start(); err != nil {
				s.t.Fatal(err)
			}
			s.note("operator killed while %s was at %s (%s after status showed it)", k.Pod, k.Step, time.Since(g.at).Round(time.Millisecond))
		}
		s.waitReady(s.spec(), readyTimeout)
		s.settle()
		s.expectNoPodDeletedHolding()
	}
}
