package chaos

import (
	"context"
	"fmt"
	"maps"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Scenarios 3, 4, 10 and 12: worker processes stopped, killed and
// terminated at the worst moments.

// flowBound is how soon every unit must flow again after a worker or the
// registry came back: the lease, the grace and five seconds.
func (s *scene) flowBound() time.Duration { return leaseTTL + s.params.Grace + 5*time.Second }

// pauseLength is how long a SIGSTOP lasts: past the lease and the grace,
// so the others adopt the stopped worker's units meanwhile.
func (s *scene) pauseLength() time.Duration { return leaseTTL + s.params.Grace + 3*time.Second }

// pausedPastLease SIGSTOPs a worker past its lease and grace during a
// freeze, during a claim step and during its own handover (a pod roll),
// resumes it each time, and checks that the fault took effect (the pod
// held units and rows were in flight when it stopped, others took units
// over meanwhile) and that the resumed process delivered and settled
// nothing under its old incarnation's claims. The sink is slow only until
// the SIGSTOP landed, so the resumed handlers go on to write and settle:
// the fence and the write guard must stop them.
func pausedPastLease(freezeTo, claimTo ownership.Topology) func(*scene) {
	return func(s *scene) {
		s.setShape(freezeTo)
		s.awaitRegistry("the pending epoch", time.Minute, pendingIs(freezeTo))
		s.awaitInFlight("ingest-1", s.slowSink("ingest-1", time.Hour))
		s.pauseAndCheck("ingest-1", "during the freeze")
		s.waitReady(freezeTo, readyTimeout)

		s.setShape(claimTo)
		s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
			return activeIs(claimTo)(sn) && s.someUnowned(claimTo)
		})
		s.awaitInFlight("ingest-0", s.slowSink("ingest-0", time.Hour))
		s.pauseAndCheck("ingest-0", "during the claim step")
		s.waitReady(claimTo, readyTimeout)

		// Its own handover lasts while rows wait in its slow sink.
		s.awaitInFlight("ingest-2", s.slowSink("ingest-2", time.Hour))
		s.rollPods()
		s.awaitStatus("ingest-2 HandingOver", 2*time.Minute, func(g sighting) bool { return g.podStep("ingest-2") == topologyv1.PodStepHandingOver })
		s.pauseAndCheck("ingest-2", "during its own handover")
		s.settle()
	}
}

// pauseAndCheck SIGSTOPs pod past its lease and grace, resumes it, and
// checks the resumed incarnation's history. The caller slowed pod's sink
// for an hour and saw rows in flight: they stay there until the SIGSTOP
// landed, when pauseFor removes the delay, so the resumed handlers go on
// to write and settle (a fixed delay of 5 s was not always enough under
// CI load for a row seen in flight to still be there at the stop).
// The fault must take effect: the pod held units and had rows in flight
// when it stopped, and another member or incarnation took at least one of
// its units during the pause. The resume instant is the process's own
// first record after the pause (SIGCONT returns well after the process
// runs again, and the kubelet also sends one on deletion).
func (s *scene) pauseAndCheck(pod, when string) {
	s.t.Helper()
	inc := s.incarnationOf(pod)
	var held []string
	var rows map[string]time.Time
	p := s.pauseFor(pod, s.pauseLength(), func() {
		held = s.unitsOf(pod)
		rows = inFlight(s.histories(), pod, inc)
	})
	// Let the resumed process run into its fence and rejoin, then read
	// what it did.
	s.eventually(time.Minute, func() error {
		if s.incarnationOf(pod) == inc && s.kubeletRuns(pod) {
			return fmt.Errorf("%s has not rejoined since it was resumed", pod)
		}
		return nil
	})
	taken := takenOver(s.claimHistory(), held, pod, inc, p.stoppedAt, p.contAt)
	switch {
	case len(held) == 0:
		s.t.Errorf("%s held no unit when it was stopped %s: the pause tested nothing", pod, when)
	case len(taken) == 0:
		s.t.Errorf("none of the %d units %s held was taken by another member or incarnation during its pause %s", len(held), pod, when)
	case len(rows) == 0:
		s.t.Errorf("%s had no row in flight when it was stopped %s: nothing could be acted on after the pause", pod, when)
	}
	procs := s.histories()
	resumed, ok := firstRecordAfter(procs, pod, p.pid, p.stoppedAt)
	if !ok {
		s.note("%s recorded nothing after its pause %s (it was stopped before it ran again)", pod, when)
		resumed = p.contAt
	}
	if bad := actionsAfter(procs, pod, inc, resumed.Add(-time.Nanosecond)); len(bad) > 0 {
		s.t.Errorf("%s, resumed after a pause past its lease %s, acted under its old incarnation %d: %s", pod, when, inc, describeActs(bad, 4))
	}
	s.note("%s SIGSTOPped %s for %s holding %d units (%d taken over during the pause) with %d rows in flight; first record after it %s after SIGCONT: nothing delivered or settled under incarnation %d afterwards",
		pod, when, s.pauseLength(), len(held), len(taken), len(rows), resumed.Sub(p.contAt).Round(time.Millisecond), inc)
}

// kubeletRuns reports whether pod has a running process that is not being
// stopped.
func (s *scene) kubeletRuns(pod string) bool {
	_, ok := s.kubelet.Addr(pod)
	return ok
}

// awaitInFlight waits until pod's current incarnation holds rows
// delivered since its sink was made slow and not settled yet. A row
// delivered before may have been settled a moment later.
func (s *scene) awaitInFlight(pod string, since time.Time) map[string]time.Time {
	s.t.Helper()
	inc := s.incarnationOf(pod)
	var rows map[string]time.Time
	s.eventually(time.Minute, func() error {
		if rows = deliveredSince(inFlight(s.histories(), pod, inc), since); len(rows) == 0 {
			// Which half is missing: units (Ready comes before every pod
			// claimed; a joiner gets its share by handovers) or rows.
			return fmt.Errorf("%s has no row in flight yet; it holds %v (registry)", pod, s.unitsOf(pod))
		}
		return nil
	})
	return rows
}

// unitWithRowInFlight is a unit pod holds with one of rows (from
// awaitInFlight) in its handler.
func (s *scene) unitWithRowInFlight(pod string, rows map[string]time.Time) string {
	s.t.Helper()
	procs := s.histories()
	for _, u := range s.unitsOf(pod) {
		if inFlightOf(maps.Clone(rows), procs, u) > 0 {
			return u
		}
	}
	s.t.Fatalf("none of %s's units %v has one of its %d rows in flight", pod, s.unitsOf(pod), len(rows))
	return ""
}

// killedMidHandover SIGKILLs a worker whose sink hangs while it hands its
// units over (a pod roll asked it to), and checks how its in-flight rows
// reach the new owners: through RESET within lease + grace + 5s when the
// census allows it, or only after ack_wait when it refuses. It reads
// shardkeeper_worker_takeovers_total by outcome from the adopters.
func killedMidHandover(reset bool) func(*scene) {
	return func(s *scene) {
		const pod = "ingest-2"
		// Ready comes before the last pod joined and got its share: its
		// incarnation read before that matches none of its deliveries (a
		// CI run waited a minute for rows in flight of incarnation 0).
		s.awaitEveryPodHolds(s.spec())
		s.disturb()
		slowed := s.slowSink(pod, time.Hour)
		inc := s.incarnationOf(pod)
		s.awaitInFlight(pod, slowed)
		takeovers := s.watchTakeovers()
		s.rollPods()
		s.awaitStatus(pod+" HandingOver", 2*time.Minute, func(g sighting) bool { return g.podStep(pod) == topologyv1.PodStepHandingOver })
		killAt := time.Now()
		s.signalPod(pod, syscall.SIGKILL)
		s.slowSink(pod, 0)
		rows := inFlight(s.histories(), pod, inc) // final: the process is dead
		if len(rows) == 0 {
			s.t.Errorf("%s had no row in flight when it was killed mid-handover: no takeover of rows was tested", pod)
		}
		bound := s.flowBound()
		if !reset {
			bound += s.input.ackWait()
		}
		var back map[string]time.Time
		s.eventually(bound+time.Minute, func() error {
			back = redelivered(s.histories(), rows, pod, inc, killAt)
			if len(back) < len(rows) {
				return fmt.Errorf("%d of %d in-flight rows redelivered", len(back), len(rows))
			}
			return nil
		})
		counts := takeovers.stop()
		s.settle()
		s.judgeRedelivery(rows, back, killAt, bound, reset)
		s.note("takeovers counted by the workers (shardkeeper_worker_takeovers_total): reset %.0f, ackwait %.0f", counts["reset"], counts["ackwait"])
		switch {
		case reset && counts["reset"] == 0:
			s.t.Errorf("the census allows RESET, yet no takeover used it (takeovers %v)", counts)
		case !reset && (counts["reset"] > 0 || counts["ackwait"] == 0):
			s.t.Errorf("the census refuses RESET: every takeover must wait for ack_wait (takeovers %v)", counts)
		}
	}
}

// judgeRedelivery checks each in-flight row's way back: within bound of
// the kill, and, without RESET, no sooner than ack_wait after it was
// delivered.
func (s *scene) judgeRedelivery(rows, back map[string]time.Time, killAt time.Time, bound time.Duration, reset bool) {
	s.t.Helper()
	if len(rows) == 0 {
		s.t.Fatalf("the killed worker had no row in flight: the scenario checked nothing")
	}
	slowest := time.Duration(0)
	for id, delivered := range rows {
		after := back[id].Sub(killAt)
		slowest = max(slowest, after)
		if after > bound {
			s.t.Errorf("in-flight row %s reached its new owner %s after the kill, bound %s", id, after.Round(time.Millisecond), bound)
		}
		if early := back[id].Sub(delivered); !reset && early < s.input.ackWait()-time.Second {
			s.t.Errorf("in-flight row %s came back %s after its delivery, before ack_wait %s, though the census refuses RESET", id, early.Round(time.Millisecond), s.input.ackWait())
		}
	}
	s.note("%d in-flight rows of the killed worker redelivered, the last %s after the kill (bound %s)", len(rows), slowest.Round(time.Millisecond), bound)
}

// scaleDownHolderDies scales N and V down while the holder of a leaving
// unit still drains it (a backlog in a slow sink), and sig ends that
// holder mid-drain. The leaving unit's rows must all reach the sink and
// the operator must reach Ready, not wait in Retiring forever.
func scaleDownHolderDies(to ownership.Topology, sig syscall.Signal) func(*scene) {
	return func(s *scene) {
		from := s.spec()
		leaving := ownership.Unit{Partition: from.Partitions - 1, Shard: from.Shards - 1}
		holder := s.holderOf(leaving.String())
		s.disturb()
		slowed := s.slowSink(holder, 100*time.Millisecond)
		burst := s.fleet.PublishBurst([]ownership.Unit{leaving}, 150)
		s.setShape(to)
		s.awaitRegistry("the smaller epoch active", time.Minute, activeIs(to))
		if h := s.holderOf(leaving.String()); h != holder {
			s.t.Fatalf("leaving unit %s moved from %s to %q before the fault", leaving, holder, h)
		}
		pending := s.consumerRows(leaving)
		inc := s.incarnationOf(holder)
		s.awaitInFlight(holder, slowed)
		old, _ := s.kubelet.Addr(holder)
		s.signalPod(holder, sig)
		// The fault must land mid-drain: rows of the leaving unit in the
		// holder's handler and more waiting in its consumer. (A SIGKILLed
		// holder's history is final now; a SIGTERMed one's only grows.)
		rows := inFlightOf(inFlight(s.histories(), holder, inc), s.histories(), leaving.String())
		switch {
		case pending <= 0:
			s.t.Errorf("%s's consumer held no rows when %s was signalled: the drain under test was over", leaving, holder)
		case rows == 0:
			s.t.Errorf("%s had no row of %s in flight when it was signalled: it was not draining", holder, leaving)
		}
		if sig == syscall.SIGTERM {
			// It drains for its drain timeout, releases what is left and
			// exits; its restarted process must not be slow.
			s.awaitRestart(holder, old)
		}
		s.slowSink(holder, 0)
		s.settle()
		s.note("%s sent to %s mid-drain of %s with %d rows of it in flight and %d left in its consumer", unix.SignalName(sig), holder, leaving, rows, pending)
		s.waitReady(to, 3*time.Minute)
		s.expectBurstDelivered(burst)
		s.expectRetiringEmpty()
	}
}

// awaitRestart waits until the kubelet runs a new process for pod, whose
// process served at old before.
func (s *scene) awaitRestart(pod, old string) {
	s.t.Helper()
	s.eventually(2*time.Minute, func() error {
		if addr, ok := s.kubelet.Addr(pod); !ok || addr == old {
			return fmt.Errorf("%s not restarted yet", pod)
		}
		return nil
	})
}

// consumerRows is how many rows u's consumer holds (pending or awaiting
// an ack), -1 when it cannot be read.
func (s *scene) consumerRows(u ownership.Unit) int {
	ref := s.fleet.Layout.ConsumerRef(natsUnit(u))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.jetstream().Consumer(ctx, ref.Stream, ref.Name)
	if err != nil {
		return -1
	}
	ci := info.CachedInfo()
	return int(ci.NumPending) + ci.NumAckPending
}

// expectBurstDelivered checks that every row of a burst reached the sink.
func (s *scene) expectBurstDelivered(burst map[string]ownership.Unit) {
	s.t.Helper()
	written := map[string]bool{}
	for _, w := range s.sinkWrites() {
		written[w.ID] = true
	}
	missing := 0
	for id := range burst {
		if !written[id] {
			missing++
		}
	}
	if missing > 0 {
		s.t.Errorf("%d of the leaving unit's %d backlog rows never reached the sink", missing, len(burst))
	}
	s.note("all %d backlog rows of the leaving unit reached the sink", len(burst)-missing)
}

// expectRetiringEmpty checks that nothing is left retiring: the registry's
// retiring set is empty once Ready.
func (s *scene) expectRetiringEmpty() {
	s.t.Helper()
	sn, err := s.snapshot()
	if err != nil {
		s.t.Fatal(err)
	}
	if len(sn.Retiring) > 0 {
		s.t.Errorf("Ready with units still retiring: %v", sn.Retiring)
	}
}

// killedAndRestarted SIGKILLs a worker, which the kubelet restarts under
// the same name, in steady state or, when mid is set, while the change to
// mid claims its units; every unit must flow within lease + grace + 5s of
// the restart.
func killedAndRestarted(mid *ownership.Topology) func(*scene) {
	return func(s *scene) {
		const pod = "ingest-1"
		topo := s.spec()
		s.awaitEveryPodHolds(topo)
		if mid != nil {
			topo = *mid
			s.setShape(topo)
			s.awaitRegistry("the new epoch active with units unowned", time.Minute, func(sn poolctl.Snapshot) bool {
				return activeIs(topo)(sn) && s.someUnowned(topo)
			})
		}
		s.disturb()
		// A slow sink keeps rows in the handler, so the kill lands with
		// rows in flight; the restarted process is not slow. The sink
		// waits until the kill (at 200 ms a row a cold make test once saw
		// the row awaitInFlight found settled before the SIGKILL landed).
		inc := s.incarnationOf(pod)
		s.awaitInFlight(pod, s.slowSink(pod, time.Hour))
		held := len(s.unitsOf(pod))
		old, _ := s.kubelet.Addr(pod)
		s.signalPod(pod, syscall.SIGKILL)
		s.slowSink(pod, 0)
		rows := len(inFlight(s.histories(), pod, inc)) // final: the process is dead
		switch {
		case held == 0:
			s.t.Errorf("%s held no unit when it was killed: the kill tested nothing", pod)
		case rows == 0:
			s.t.Errorf("%s had no row in flight when it was killed", pod)
		}
		s.awaitRestart(pod, old)
		restarted := time.Now()
		s.settle()
		s.expectFlowWithin(topo, restarted, s.flowBound(), fmt.Sprintf("after %s (holding %d units, %d rows in flight) was killed and restarted", pod, held, rows))
	}
}
