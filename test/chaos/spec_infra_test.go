package chaos

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Scenarios 5, 6 and 7: PostgreSQL and NATS servers failing under the
// fleet.

// registryOutageLength is how long PostgreSQL stays unreachable: ten
// leases, so every worker fences itself and every lease lapses.
const registryOutageLength = 30 * time.Second

// registryOutage makes PostgreSQL unreachable for the whole fleet and the
// operator, as refused connections (the proxy refuses and cuts them) or
// as a hung server (every postgres process SIGSTOPped), then brings it
// back. Nothing may be delivered while fenced, nobody may adopt within the
// grace after the return (the owners renew first), the units return to
// their owners, and every unit flows within lease + grace + 5s. The fault
// must take effect: units held and rows in flight when it began (one
// pod's sink is slow until then), no lease event in the registry during
// it, and every holder's last lease run out before the return.
func registryOutage(hung bool) func(*scene) {
	return func(s *scene) {
		const slow = "ingest-0"
		topo := s.spec()
		s.awaitEveryPodHolds(topo)
		s.disturb()
		s.awaitInFlight(slow, s.slowSink(slow, 200*time.Millisecond))
		before := s.owners()
		start := time.Now()
		s.cutRegistry(hung, true)
		s.slowSink(slow, 0)
		time.Sleep(registryOutageLength)
		s.cutRegistry(hung, false)
		back := time.Now()
		s.settle()
		s.expectOutageTookEffect(before, start, back)
		s.expectFlowWithin(topo, back, s.flowBound(), "after the registry came back")
		s.waitReady(topo, readyTimeout)
		s.expectNoAdoptionWithin(back, s.params.Grace)
		s.expectOwnersBack(before)
		s.expectNothingDeliveredBetween(start.Add(leaseTTL), back)
	}
}

// cutRegistry starts (on) or ends the registry outage.
func (s *scene) cutRegistry(hung, on bool) {
	s.t.Helper()
	switch {
	case hung:
		sig := syscall.SIGCONT
		if on {
			sig = syscall.SIGSTOP
		}
		if err := s.in.pg.SignalAll(sig); err != nil {
			s.t.Fatal(err)
		}
	default:
		s.proxy.Refuse(on)
		if on {
			s.proxy.CutAll()
		}
	}
	s.t.Logf("registry outage (hung %t): %t", hung, on)
}

// awaitEveryPodHolds waits until every unit of topo is held by its
// placement owner and every pod holds one: Ready does not wait for the
// last pod to claim its share, and an outage that lands mid-rebalance
// moves units after the return.
func (s *scene) awaitEveryPodHolds(topo ownership.Topology) {
	s.t.Helper()
	s.eventually(time.Minute, func() error {
		owners := s.owners()
		holds := map[string]int{}
		for _, o := range owners {
			holds[o]++
		}
		for _, pod := range podsOf(s.input.Replicas) {
			if holds[pod] == 0 {
				return fmt.Errorf("%s holds no unit yet (%d of %d units held)", pod, len(owners), topo.Len())
			}
		}
		if len(owners) < topo.Len() {
			return fmt.Errorf("%d of %d units held", len(owners), topo.Len())
		}
		// Settled, not mid-rebalance: a fault that lands while a unit
		// moves to the last pod rightly ends with the unit there (a CI
		// run's "owners back" check took the moving unit's old owner as
		// its owner).
		sn, err := s.snapshot()
		if err != nil {
			return err
		}
		if !s.allPlaced(sn, topo) {
			return fmt.Errorf("units still moving to their placement owners")
		}
		return nil
	})
}

// expectOutageTookEffect checks that the registry outage [start, back]
// was one: units were held and rows in flight when it began, the registry
// recorded no lease grant, leave or fence change during it (nobody reached
// it), and every member that held a unit at its start saw its last lease
// run out before the return (so each was fenced for a while).
func (s *scene) expectOutageTookEffect(before map[string]string, start, back time.Time) {
	s.t.Helper()
	rows := inFlightAt(s.histories(), start)
	leases := s.leaseHistory()
	// A renewal already committing when the cut came may land just after.
	during := leaseEventsBetween(leases, start.Add(time.Second), back)
	holders := map[string]bool{}
	for _, owner := range before {
		holders[owner] = true
	}
	lapsed, latest := 0, time.Time{}
	for m := range holders {
		end := leaseEndAt(leases, m, back)
		if end.IsZero() || !end.Before(back) {
			s.t.Errorf("%s held units when the registry went away, and its lease ran to %s, past the return at %s: it was never fenced",
				m, end.Format("15:04:05.000"), back.Format("15:04:05.000"))
			continue
		}
		lapsed++
		if end.After(latest) {
			latest = end
		}
	}
	switch {
	case len(before) == 0:
		s.t.Errorf("no unit was held when the registry went away: the outage tested nothing")
	case len(rows) == 0:
		s.t.Errorf("no row was in flight when the registry went away: no handler met the fence")
	case len(during) > 0:
		e := during[0]
		s.t.Errorf("the registry recorded %d lease events during the outage (the first: %s incarnation %d at %s): it was reachable",
			len(during), e.Member, e.Incarnation, e.At.Format("15:04:05.000"))
	}
	s.note("at the cut %d units were held by %d members with %d rows in flight; lease events during the outage: %d; every holder's lease ran out (%d of %d), the last %s after the cut",
		len(before), len(holders), len(rows), len(during), lapsed, len(holders), latest.Sub(start).Round(time.Millisecond))
}

// expectNoAdoptionWithin checks the claim history for adoptions in [
// from+d].
func (s *scene) expectNoAdoptionWithin(from time.Time, d time.Duration) {
	s.t.Helper()
	n := 0
	for _, e := range s.claimHistory() {
		if e.Op == "adopt" && !e.At.Before(from) && !e.At.After(from.Add(d)) {
			n++
			s.t.Errorf("%s adopted %s %s after the registry came back, within the grace %s", e.Owner, e.Unit, e.At.Sub(from).Round(time.Millisecond), d)
		}
	}
	s.note("adoptions within the grace after the return: %d", n)
}

// expectOwnersBack checks that every unit is held by the member that held
// it before.
func (s *scene) expectOwnersBack(before map[string]string) {
	s.t.Helper()
	after := s.owners()
	moved := 0
	for u, owner := range before {
		if after[u] != owner {
			moved++
			s.t.Errorf("unit %s was %s's before the outage and is %q's after", u, owner, after[u])
		}
	}
	s.note("units back with their owners: %d of %d", len(before)-moved, len(before))
}

// expectNothingDeliveredBetween checks that no worker delivered or settled
// a row in [from, to]: every lease had lapsed, so every worker was fenced.
func (s *scene) expectNothingDeliveredBetween(from, to time.Time) {
	s.t.Helper()
	var bad []act
	for _, a := range acts(s.histories(), history.KindDeliver, history.KindAck, history.KindNak, history.KindTerm) {
		if a.at.After(from) && a.at.Before(to) {
			bad = append(bad, a)
		}
	}
	if len(bad) > 0 {
		s.t.Errorf("%d deliveries or settlements while every lease had lapsed: %s", len(bad), describeActs(bad, 4))
	}
	s.note("deliveries and settlements while fenced (%s to the return): %d", to.Sub(from).Round(time.Second), len(bad))
}

// natsDownLength is how long a killed NATS server stays down.
const natsDownLength = 20 * time.Second

// natsLeaderKilledDuringHandover SIGKILLs the NATS server leading a unit's
// consumer the moment a pod roll asks the unit's holder to hand it over:
// the holder's drain, UNPIN and release and the new owner's UNPIN and
// first pulls all meet the consumer's leader election. It restarts the
// server after a while and checks that the unit is delivered again by an
// owner whose claim postdates the kill. That owner may be another member
// or the holder's own next incarnation: slots are sticky, so once the
// rolled pod rejoins it gets its units back, and an interim owner whose
// consumer had no leader meanwhile may hand the unit back without having
// delivered. The fault must take effect: the server killed led the
// unit's consumer and the holder still held the unit at the kill, and the
// unit left the holder's incarnation after it (claim history).
func natsLeaderKilledDuringHandover() func(*scene) {
	return func(s *scene) {
		const pod = "ingest-2"
		// Ready does not wait for the last pod to claim its share.
		s.eventually(time.Minute, func() error {
			if len(s.unitsOf(pod)) == 0 {
				return fmt.Errorf("%s holds no unit yet", pod)
			}
			return nil
		})
		inc := s.incarnationOf(pod)
		s.disturb()
		// A row in the unit's handler keeps its handover open (the drain
		// waits for it, up to the drain timeout) until the kill landed:
		// with nothing in flight a handover can end before the test sees
		// HandingOver and kills the leader (a loaded run saw it over).
		unit := s.unitWithRowInFlight(pod, s.awaitInFlight(pod, s.slowSink(pod, time.Hour)))
		s.rollPods()
		s.awaitStatus(pod+" HandingOver", 2*time.Minute, func(g sighting) bool { return g.podStep(pod) == topologyv1.PodStepHandingOver })
		// The leader now, not before the roll: it may have moved.
		proc := s.in.nats.Procs[s.consumerLeader(unit)]
		proc.Kill()
		killAt := time.Now()
		s.slowSink(pod, 0)
		s.t.Logf("killed NATS server %s, leader of unit %s's consumer", proc.Config.Name, unit)
		time.Sleep(natsDownLength)
		if err := proc.Start(30 * time.Second); err != nil {
			s.t.Fatal(err)
		}
		if err := s.in.nats.Ready(2 * time.Minute); err != nil {
			s.t.Fatal(err)
		}
		s.settle()
		var owners []poolctl.ClaimEvent
		var first act
		s.eventually(3*time.Minute, func() error {
			owners = claimsAfter(s.claimHistory(), unit, pod, inc, killAt)
			if len(owners) == 0 {
				return fmt.Errorf("unit %s not claimed since the kill by anyone but %s incarnation %d", unit, pod, inc)
			}
			for _, a := range acts(s.histories(), history.KindDeliver) {
				if a.rec.Unit == unit && claimedBefore(owners, a) {
					first = a
					return nil
				}
			}
			return fmt.Errorf("unit %s not delivered since the kill by an owner claiming it after the kill (%s)", unit, describeClaims(owners))
		})
		if held := heldAt(s.claimHistory(), pod, killAt); !slices.Contains(held, unit) {
			s.t.Errorf("%s no longer held unit %s when its consumer's leader was killed: the handover under test was over", pod, unit)
		}
		who := "another member"
		if first.rec.Member == pod {
			who = "the holder's next incarnation"
		}
		// Each owner since the kill and its first delivery of the unit
		// after its claim, for the log: an owner that held the unit long
		// after NATS elected a new leader and delivered nothing would be
		// a defect this check does not catch by itself.
		deliveries := acts(s.histories(), history.KindDeliver)
		for i, e := range owners {
			firstOwn := "none"
			until := time.Now()
			if i+1 < len(owners) {
				until = owners[i+1].At
			}
			for _, a := range deliveries {
				if a.rec.Unit == unit && a.rec.Member == e.Owner && a.rec.Incarnation == e.Incarnation && !a.at.Before(e.At) && a.at.Before(until) {
					firstOwn = fmt.Sprintf("%s after its %s", a.at.Sub(e.At).Round(time.Millisecond), e.Op)
					break
				}
			}
			s.t.Logf("owner since the kill: %s/%d %s at %+.1fs after the kill, first delivery before the next claim %s", e.Owner, e.Incarnation, e.Op, e.At.Sub(killAt).Seconds(), firstOwn)
		}
		s.note("unit %s: its consumer's leader %s killed while %s (incarnation %d) held it HandingOver, down %s; owners claiming it since: %s; delivered again %s after the kill by %s incarnation %d (%s)",
			unit, proc.Config.Name, pod, inc, natsDownLength, describeClaims(owners), first.at.Sub(killAt).Round(time.Millisecond), first.rec.Member, first.rec.Incarnation, who)
	}
}

// claimsAfter lists the claims on unit that (member, inc) did not make,
// from at on: who took it over.
func claimsAfter(events []poolctl.ClaimEvent, unit, member string, inc int64, at time.Time) []poolctl.ClaimEvent {
	var out []poolctl.ClaimEvent
	for _, e := range events {
		if e.Unit == unit && !e.At.Before(at) && e.Owner != "" && e.State != poolctl.StateFree && (e.Owner != member || e.Incarnation != inc) {
			out = append(out, e)
		}
	}
	return out
}

// claimedBefore reports whether a's process (member and incarnation)
// claimed the unit, by one of claims, before a.
func claimedBefore(claims []poolctl.ClaimEvent, a act) bool {
	for _, e := range claims {
		if e.Owner == a.rec.Member && e.Incarnation == a.rec.Incarnation && !e.At.After(a.at) {
			return true
		}
	}
	return false
}

// describeClaims renders claim events for a message.
func describeClaims(events []poolctl.ClaimEvent) string {
	var parts []string
	for _, e := range events {
		parts = append(parts, fmt.Sprintf("%s %s/%d at %s", e.Op, e.Owner, e.Incarnation, e.At.Format("15:04:05.000")))
	}
	return strings.Join(parts, ", ")
}

// consumerLeader is the index of the server leading unit's consumer.
func (s *scene) consumerLeader(unit string) int {
	s.t.Helper()
	u, err := ownership.ParseUnit(unit)
	if err != nil {
		s.t.Fatal(err)
	}
	ref := s.fleet.Layout.ConsumerRef(natsUnit(u))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.jetstream().Consumer(ctx, ref.Stream, ref.Name)
	if err != nil {
		s.t.Fatal(err)
	}
	info := c.CachedInfo()
	if info.Cluster == nil {
		s.t.Fatalf("consumer %s has no cluster information", ref.Name)
	}
	for i, cfg := range s.in.nats.Configs {
		if cfg.Name == info.Cluster.Leader {
			return i
		}
	}
	s.t.Fatalf("consumer %s is led by %q, not a server of the cluster", ref.Name, info.Cluster.Leader)
	return -1
}

// natsRestartLength is how long the restarted server stays down: longer
// than a census interval plus the census timeout and a reconcile, so
// status must have said so.
const natsRestartLength = 25 * time.Second

// honestyLag is how long status may go on saying what the last census saw
// after the world changed: a census interval, a census's timeout and a
// few seconds of reconcile.
const honestyLag = censusInterval + 10*time.Second + 3*time.Second

// natsRestartMidRollout restarts one NATS server while the change to `to`
// claims units, and checks the census through it: RESET refused (fail
// closed) and VersionFloorMet not True while the server is down, both
// back once it is up. The fault must take effect: the rollout mid-step
// when the server went (registry, just before), the server's port
// refusing connections from then until just before its restart, and
// censuses taken in between.
func natsRestartMidRollout(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		s.setShape(to)
		s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(to)(sn) && s.someUnowned(to)
		})
		verdicts := s.sampleVerdicts()
		proc := s.in.nats.Procs[1]
		landed := s.stepNow(to)
		proc.Stop(10 * time.Second)
		down := time.Now()
		downFirst := serverGone(proc)
		time.Sleep(natsRestartLength)
		downLast := serverGone(proc)
		// Down ends when the process starts again: a census taken from
		// then on may see it, before the cluster counts as ready (up).
		restarted := time.Now()
		if err := proc.Start(30 * time.Second); err != nil {
			s.t.Fatal(err)
		}
		if err := s.in.nats.Ready(2 * time.Minute); err != nil {
			s.t.Fatal(err)
		}
		up := time.Now()
		s.settle()
		_, back := s.status.await(up, time.Minute, func(g sighting) bool {
			c, _ := g.condition(topologyv1.ConditionVersionFloorMet)
			cs := g.obj.Status.Census
			return c == metav1.ConditionTrue && cs != nil && cs.ObservedAt != nil && !cs.ObservedAt.Time.Before(up.Truncate(time.Second))
		})
		allowed := false
		for end := time.Now().Add(30 * time.Second); !allowed && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			allowed = verdicts.allowedSince(up)
		}
		verdicts.stop()
		s.logFloorTimeline(down, up)
		verdicts.log(s.t, down)
		censuses := verdicts.takenBetween(down.Add(time.Second), restarted)
		switch {
		case landed == "done":
			s.t.Errorf("the change to %s was over when the server went down (registry): no rollout step met the restart", to)
		case downFirst != nil:
			s.t.Errorf("NATS server %s still answered once stopped: %v", proc.Config.Name, downFirst)
		case downLast != nil:
			s.t.Errorf("NATS server %s answered before the test restarted it: %v", proc.Config.Name, downLast)
		case censuses == 0:
			s.t.Errorf("no census was taken while %s was down: the census under test never met the outage", proc.Config.Name)
		}
		s.note("NATS server %s stopped at step %s of the change to %s (registry); its port refused connections when stopped and %s later; %d censuses taken while it was down",
			proc.Config.Name, landed, to, natsRestartLength, censuses)
		if !back || !allowed {
			s.t.Fatalf("after the restart: VersionFloorMet True again %t, RESET allowed again %t", back, allowed)
		}
		s.judgeCensus(verdicts, down, restarted)
	}
}

// verdictSample is the RESET verdict the registry held at one instant,
// with when its census was taken (on the registry's clock).
type verdictSample struct {
	takenAt time.Time
	allowed bool
	reason  string
}

// verdictSampler polls the registry's published RESET verdict.
type verdictSampler struct {
	mu      sync.Mutex
	samples []verdictSample
	stopc   chan struct{}
	done    chan struct{}
}

func (s *scene) sampleVerdicts() *verdictSampler {
	v := &verdictSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(v.done)
		for {
			if sn, err := s.snapshot(); err == nil && sn.Reset.Published {
				v.mu.Lock()
				v.samples = append(v.samples, verdictSample{takenAt: sn.Now.Add(-sn.Reset.CensusAge), allowed: sn.Reset.Allowed, reason: sn.Reset.Reason})
				v.mu.Unlock()
			}
			select {
			case <-v.stopc:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return v
}

func (v *verdictSampler) stop() { close(v.stopc); <-v.done }

// log logs every change of the sampled verdict, relative to down.
func (v *verdictSampler) log(t testing.TB, down time.Time) {
	last := ""
	for _, x := range v.samples {
		line := fmt.Sprintf("census of %+.1fs: allowed %t (%s)", x.takenAt.Sub(down).Seconds(), x.allowed, x.reason)
		if line != last {
			t.Log("RESET verdict: " + line)
			last = line
		}
	}
}

// takenBetween counts the distinct censuses sampled that were taken in
// (from, to).
func (v *verdictSampler) takenBetween(from, to time.Time) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	seen := map[time.Time]bool{}
	for _, x := range v.samples {
		// The registry's clock reads the census age to the microsecond:
		// one census sampled twice may differ by a hair.
		at := x.takenAt.Round(10 * time.Millisecond)
		if x.takenAt.After(from) && x.takenAt.Before(to) {
			seen[at] = true
		}
	}
	return len(seen)
}

// serverGone is nil when proc has exited and its client port refuses
// connections, or what shows it is still there.
func serverGone(proc *natstest.Proc) error {
	if proc.Running() {
		return fmt.Errorf("process still running")
	}
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", proc.Config.Port), time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("port %d accepted a connection", proc.Config.Port)
	}
	return nil
}

// allowedSince reports whether a census taken after t allowed RESET.
func (v *verdictSampler) allowedSince(t time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, x := range v.samples {
		if x.takenAt.After(t) && x.allowed {
			return true
		}
	}
	return false
}

// judgeCensus checks what the census published and status said while the
// server was down: from down until up, when it was started again.
func (s *scene) judgeCensus(v *verdictSampler, down, up time.Time) {
	s.t.Helper()
	refused, lied := 0, 0
	for _, x := range v.samples {
		// A census taken a second after the server went down cannot have
		// seen it.
		if x.takenAt.After(down.Add(time.Second)) && x.takenAt.Before(up) {
			if x.allowed {
				lied++
			} else {
				refused++
			}
		}
	}
	if lied > 0 {
		s.t.Errorf("%d RESET verdicts from censuses taken while a server was down allowed RESET (fail closed means refuse)", lied)
	}
	if refused == 0 {
		s.t.Errorf("no census taken while the server was down refused RESET")
	}
	floorTrue := 0
	for _, g := range s.status.since(down.Add(honestyLag)) {
		if g.at.After(up) {
			break
		}
		if c, _ := g.condition(topologyv1.ConditionVersionFloorMet); c == metav1.ConditionTrue {
			floorTrue++
		}
	}
	if g, ok := s.status.at(up); ok {
		if c, reason := g.condition(topologyv1.ConditionVersionFloorMet); c == metav1.ConditionTrue {
			s.t.Errorf("status said VersionFloorMet=True (%s) when the server came back after %s down", reason, up.Sub(down).Round(time.Second))
		}
	}
	if floorTrue > 0 {
		s.t.Errorf("status said VersionFloorMet=True %d times while a server was down (more than %s after it went)", floorTrue, honestyLag)
	}
	s.note("server down %s: %d verdict samples from censuses taken while it was down refused RESET, %d allowed it; VersionFloorMet True %d times while down; RESET and VersionFloorMet back after the restart",
		up.Sub(down).Round(time.Second), refused, lied, floorTrue)
}

// logFloorTimeline logs every change of VersionFloorMet status showed
// around the restart, relative to the server going down.
func (s *scene) logFloorTimeline(down, up time.Time) {
	last := ""
	for _, g := range s.status.since(down.Add(-10 * time.Second)) {
		c, reason := g.condition(topologyv1.ConditionVersionFloorMet)
		line := fmt.Sprintf("%s/%s", c, reason)
		if cs := g.obj.Status.Census; cs != nil {
			line += fmt.Sprintf(" min %s below %v", cs.MinVersion, cs.BelowFloor)
		}
		if line != last {
			s.t.Logf("VersionFloorMet at %+.1fs: %s", g.at.Sub(down).Seconds(), line)
			last = line
		}
	}
	s.t.Logf("server down at 0s, up at %+.1fs", up.Sub(down).Seconds())
}
