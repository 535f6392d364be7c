package chaos

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
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
// their owners, and every unit flows within lease + grace + 5s.
func registryOutage(hung bool) func(*scene) {
	return func(s *scene) {
		topo := s.spec()
		before := s.owners()
		s.disturb()
		start := time.Now()
		s.cutRegistry(hung, true)
		time.Sleep(registryOutageLength)
		s.cutRegistry(hung, false)
		back := time.Now()
		s.settle()
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

// expectNoAdoptionWithin checks the claim history for adoptions in [from,
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
// server after a while and checks that the unit reaches its new owner.
func natsLeaderKilledDuringHandover() func(*scene) {
	return func(s *scene) {
		const pod = "ingest-2"
		units := s.unitsOf(pod)
		if len(units) == 0 {
			s.t.Fatalf("%s holds no unit", pod)
		}
		unit := units[0]
		server := s.consumerLeader(unit)
		s.disturb()
		s.rollPods()
		s.awaitStatus(pod+" HandingOver", 2*time.Minute, func(g sighting) bool { return g.podStep(pod) == topologyv1.PodStepHandingOver })
		proc := s.in.nats.Procs[server]
		proc.Kill()
		killAt := time.Now()
		s.t.Logf("killed NATS server %s, leader of unit %s's consumer", proc.Config.Name, unit)
		time.Sleep(natsDownLength)
		if err := proc.Start(30 * time.Second); err != nil {
			s.t.Fatal(err)
		}
		if err := s.in.nats.Ready(2 * time.Minute); err != nil {
			s.t.Fatal(err)
		}
		s.settle()
		// The new owner is another member: the holder's own next
		// incarnation (its pod comes back from the roll) would not show a
		// handover at all.
		var took time.Duration
		var owner string
		s.eventually(3*time.Minute, func() error {
			for _, a := range acts(s.histories(), history.KindDeliver) {
				if a.rec.Unit == unit && a.at.After(killAt) && a.rec.Member != pod {
					took, owner = a.at.Sub(killAt), a.rec.Member
					return nil
				}
			}
			return fmt.Errorf("unit %s not delivered by another member than %s yet", unit, pod)
		})
		s.note("unit %s handed over from %s to %s while its consumer leader %s was down %s: new owner delivering %s after the kill",
			unit, pod, owner, proc.Config.Name, natsDownLength, took.Round(time.Millisecond))
	}
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
// back once it is up.
func natsRestartMidRollout(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		s.setShape(to)
		s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(to)(sn) && s.someUnowned(to)
		})
		verdicts := s.sampleVerdicts()
		proc := s.in.nats.Procs[1]
		proc.Stop(10 * time.Second)
		down := time.Now()
		time.Sleep(natsRestartLength)
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
		if !back || !allowed {
			s.t.Fatalf("after the restart: VersionFloorMet True again %t, RESET allowed again %t", back, allowed)
		}
		s.judgeCensus(verdicts, down, up)
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
// server was down.
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
