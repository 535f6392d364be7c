package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// Regression tests for the defects found in review (issue "Correctness
// defects found in review"), each named for the behaviour it pins, each
// failing on the code before its fix. They run pkg/worker in the test
// process so the fault lands exactly where the defect was.

// roomyParams are lease parameters with room between a member's own
// fence (at a quarter of the lease, with a wide fence margin) and the
// registry seeing its lease expire, so a test can act in between on a
// loaded machine.
var roomyParams = poolctl.Params{LeaseTTL: 6 * time.Second, RenewInterval: time.Second, QueryBound: time.Second, Grace: 2 * time.Second}

// slowHandler acks after d, or naks when its context ends first.
func slowHandler(d time.Duration) worker.Handler {
	return func(ctx context.Context, _ worker.Row) worker.Settlement {
		select {
		case <-time.After(d):
			return worker.Ack
		case <-ctx.Done():
			return worker.Nak
		}
	}
}

// Defect 1: a handover whose drain outlasts the lease must not starve
// renewals. The handler takes longer than the whole lease, the drain
// timeout is longer still; the member must hand over (and shut down) on
// the same incarnation, never fencing itself.
//
// checks P5 (liveness: a healthy member keeps its lease)
func TestRenewalsContinueWhileAHandoverDrains(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2, DrainTimeout: 6 * time.Second})
	ttl := f.Opts.Params.LeaseTTL
	a := startSDK(t, f, "w-0", slowHandler(ttl+time.Second), nil)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")
	pub := f.StartPublisher(ownership.Topology{Partitions: 1, Shards: 2}, 20)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(a.records(history.KindDeliver, "")) < 2 {
			return fmt.Errorf("no rows in the slow handler yet")
		}
		return nil
	})
	// A drain request moves both units away: their drains wait on the
	// slow handler, longer than the lease.
	ctx := context.Background()
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-0", true); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(a.w.Status().Held); n != 0 {
			return fmt.Errorf("still holds %d units", n)
		}
		return nil
	})
	pub.Stop()
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatalf("graceful shutdown after a slow drain: %v", err)
	}
	if n := a.counter(t, "shardkeeper_worker_fences_total"); n != 0 {
		premiseRenewalsInTime(t, a)
		t.Fatalf("a healthy member fenced itself %v times during a drain longer than its lease", n)
	}
	if n := a.counter(t, "shardkeeper_worker_joins_total"); n != 1 {
		t.Fatalf("the member joined %v times, want 1 (it lost its lease)", n)
	}
}

// premiseRenewalsInTime fails the test as a broken premise when renewals
// were sent and failed (timed out): on a machine too loaded to answer a
// renewal of the fleet's 2s lease within its 500ms query bound the member
// fences whatever the drain does, and the fence says nothing about
// whether the drain starved renewals (which then are never sent, so never
// fail). The core's scripted scenarios check the same rule in virtual
// time ("renewals continue while a handover's drain outlasts the lease").
func premiseRenewalsInTime(t *testing.T, a *sdkWorker) {
	t.Helper()
	if n := a.counter(t, "shardkeeper_worker_renew_failures_total"); n > 0 {
		t.Fatalf("premise broken: %v renewals failed (timed out: the registry or the machine too slow for a %s lease), "+
			"so the member's fence says nothing about the drain; the rule is checked in virtual time in pkg/worker/internal/member", n, fleettest.FastParams().LeaseTTL)
	}
}

// Defect 1, shutdown half: a graceful stop with a slow drain keeps the
// lease renewed until the member has left, instead of falling into the
// crash path.
//
// checks P5 (liveness)
func TestShutdownKeepsRenewingWhileItDrains(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, DrainTimeout: 6 * time.Second})
	ttl := f.Opts.Params.LeaseTTL
	a := startSDK(t, f, "w-0", slowHandler(ttl+2*time.Second), nil)
	waitHolding(t, a, 30*time.Second, "0.0")
	pub := f.StartPublisher(ownership.Topology{Partitions: 1, Shards: 1}, 10)
	defer pub.Stop()
	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(a.records(history.KindDeliver, "")) < 1 {
			return fmt.Errorf("no row in the slow handler yet")
		}
		return nil
	})
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatalf("graceful shutdown: %v", err)
	}
	if n := a.counter(t, "shardkeeper_worker_fences_total"); n != 0 {
		premiseRenewalsInTime(t, a)
		t.Fatalf("the member fenced itself %v times while shutting down", n)
	}
	snap, err := f.Registry.Snapshot(context.Background(), f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Member("w-0"); m == nil || !m.Left || m.Holds != 0 {
		t.Fatalf("after shutdown the registry shows %+v, want left holding nothing", m)
	}
}

// Defect 2: a Fence that reaches the registry after the worker recovered
// (and lifted it) must not leave the member fenced there: the next epoch's
// units are claimed.
//
// checks P5 (liveness), P3
func TestALateFenceDoesNotLeaveTheMemberFenced(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2, Params: roomyParams})
	p := f.Opts.Params
	// A wide fence margin: the member fences itself a quarter of the way
	// into its lease, so its renewal after the fence still finds the lease
	// live (the registry saw no lapse, only the member's own fence).
	a := startSDK(t, f, "w-0", nil, func(o *worker.Options) { o.FenceMargin = p.LeaseTTL * 3 / 4 })
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")

	// Hold renewals past the self-fence; the fence's registry call "times
	// out" and reaches the registry a whole lease later, after the member
	// recovered and lifted it.
	a.reg.mu.Lock()
	a.reg.lateFence = p.LeaseTTL
	a.reg.mu.Unlock()
	a.reg.holdRenewals()
	fleettest.Eventually(t, 10*time.Second, func() error {
		if !a.w.Status().Fenced {
			return fmt.Errorf("not fenced yet")
		}
		return nil
	})
	a.reg.releaseRenewals()
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")
	a.reg.late.Wait() // the late Fence has landed
	if n := a.counter(t, "shardkeeper_worker_joins_total"); n != 1 {
		t.Fatalf("setup: the member lost its lease (joined %v times); the late fence tested nothing", n)
	}

	f.ChangeTopology(1, 4)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1", "0.2", "0.3")
	snap, err := f.Registry.Snapshot(context.Background(), f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Member("w-0"); m == nil || m.Fenced {
		t.Fatalf("registry shows the member fenced after it recovered: %+v", m)
	}
}

// Defect 6: when a handover's drain times out, the rest of the batch is
// nak'd (the next owner gets it at once), not withheld until ack wait.
//
// checks P3 (delay)
func TestDrainTimeoutNaksTheRestOfTheBatch(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, AckWait: time.Minute, DrainTimeout: time.Second})
	block := make(chan struct{})
	defer close(block)
	stuck := func(ctx context.Context, _ worker.Row) worker.Settlement {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return worker.Nak
	}
	a := startSDK(t, f, "w-0", stuck, func(o *worker.Options) { o.FetchBatch = 20 })
	waitHolding(t, a, 30*time.Second, "0.0")
	rows := f.PublishBurst([]ownership.Unit{{}}, 20)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(a.records(history.KindDeliver, "0.0")) == 0 {
			return fmt.Errorf("no row delivered yet")
		}
		return nil
	})
	b := startSDK(t, f, "w-1", nil, nil)
	if err := f.Registry.SetDraining(context.Background(), f.Topology, "w-0", true); err != nil {
		t.Fatal(err)
	}
	// Every row reaches w-1 well before the minute of ack wait.
	start := time.Now()
	fleettest.Eventually(t, 20*time.Second, func() error {
		got := map[string]bool{}
		for _, r := range b.records(history.KindAck, "0.0") {
			got[r.RowID] = true
		}
		for id := range rows {
			if !got[id] {
				return fmt.Errorf("row %s not acked by w-1 yet (%d/%d)", id, len(got), len(rows))
			}
		}
		return nil
	})
	naks, withheld := len(a.records(history.KindNak, "0.0")), len(a.records(history.KindWithheld, "0.0"))
	t.Logf("drain timeout: w-0 nak'd %d rows and withheld %d; w-1 had all %d within %s", naks, withheld, len(rows), time.Since(start).Round(time.Millisecond))
	if withheld != 0 {
		t.Fatalf("w-0 withheld %d rows at its drain timeout instead of nak'ing them", withheld)
	}
}

// Defect 8 (a member fenced while its claims were in flight adopts
// nothing on NATS until its fence lifts) depended on the machine's speed;
// its premise is a scripted interleaving of the member core now:
// pkg/worker/internal/member, "an adoption granted while fenced waits for
// the fence to lift".

// Defect 9: when the reply to an adopting claim is lost, the retry (a
// no-op in the registry) still reports the adoption, so the consumer is
// RESET and the dead owner's unacked rows come back before ack wait.
//
// checks P4
func TestALostAdoptionReplyStillResetsTheConsumer(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, AckWait: time.Minute})
	f.PublishCensus(natsops.DefaultFloor.String())
	// w-x pulls a row, never acks it, and dies.
	block := make(chan struct{})
	defer close(block)
	x := startSDK(t, f, "w-x", func(ctx context.Context, _ worker.Row) worker.Settlement {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return worker.Abandon
	}, nil)
	waitHolding(t, x, 30*time.Second, "0.0")
	rows := f.PublishBurst([]ownership.Unit{{}}, 1)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(x.records(history.KindDeliver, "0.0")) == 0 {
			return fmt.Errorf("w-x has not taken the row yet")
		}
		return nil
	})
	x.reg.holdRenewals()

	a := startSDK(t, f, "w-0", nil, func(o *worker.Options) {})
	a.reg.mu.Lock()
	a.reg.loseClaimReply = true
	a.reg.mu.Unlock()
	start := time.Now()
	fleettest.Eventually(t, 30*time.Second, func() error {
		for id := range rows {
			for _, r := range a.records(history.KindAck, "0.0") {
				if r.RowID == id {
					return nil
				}
			}
			return fmt.Errorf("row %s not redelivered to w-0 yet", id)
		}
		return nil
	})
	if len(a.records(history.KindReset, "0.0")) == 0 {
		t.Fatalf("no RESET after the adoption whose reply was lost")
	}
	t.Logf("the dead owner's unacked row reached w-0 %s after it started (ack wait 1m)", time.Since(start).Round(time.Millisecond))
}

// Defect 10: a unit whose handover intent the registry confirms after a
// fence gets no puller; the member releases it.
//
// checks P1
func TestRecoveryDoesNotRestartAUnitInHandover(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	a := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")
	ctx := context.Background()
	tok := a.token(t, "0.1")
	a.reg.holdRenewals()
	fleettest.Eventually(t, 10*time.Second, func() error {
		if !a.w.Status().Fenced {
			return fmt.Errorf("not fenced yet")
		}
		return nil
	})
	// While w-0 is fenced, its unit 0.1 gets a handover intent.
	if err := f.Registry.Handover(ctx, tok, ""); err != nil {
		t.Fatal(err)
	}
	lift := history.Now()
	a.reg.releaseRenewals()
	fleettest.Eventually(t, 30*time.Second, func() error {
		cs, err := f.Registry.Claims(ctx, f.Topology)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.Unit == "0.1" && c.Owner == "w-0" && c.Epoch == tok.Epoch {
				return fmt.Errorf("0.1 still held by w-0 at epoch %d (%s)", c.Epoch, c.State)
			}
		}
		return nil
	})
	for _, r := range a.records(history.KindFetch, "0.1") {
		if r.Start > lift && r.Epoch == tok.Epoch {
			t.Fatalf("w-0 pulled 0.1 under the handed-over claim after recovering")
		}
	}
}

// Found by the chaos suite (scenario 4: a worker SIGKILLed mid-handover in
// a pod roll): a process restarted under its pod name while the operator
// asks that pod to drain must still give up what its dead incarnation
// held. The registry leaves those units waiting until the dead lease and
// the grace have passed ("confirm again"); the new incarnation must
// confirm again, re-home them and hand them over. Before the fix it never
// did: nobody may adopt the units of a live member, the draining member
// claims nothing, and the roll waited forever for the pod to hold nothing.
//
// checks P3, P5, P6
func TestARestartedDrainingWorkerGivesUpItsDeadIncarnationsUnits(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	ctx := context.Background()
	// The incarnation that died: it joined, claimed both units and never
	// renews again.
	dead, err := f.Registry.Join(ctx, f.Topology, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := f.Registry.Snapshot(ctx, f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := f.Registry.ClaimMany(ctx, dead.MemberRef, snap.Active.Number, []string{"0.0", "0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-0", true); err != nil {
		t.Fatal(err)
	}
	// Its pod's process comes back at once, while the dead lease is live.
	startSDK(t, f, "w-0", nil, nil)
	b := startSDK(t, f, "w-1", nil, nil)
	waitHolding(t, b, 30*time.Second, "0.0", "0.1")
	cs, err := f.Registry.Claims(ctx, f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Owner == "w-0" && c.State != poolctl.StateFree {
			t.Fatalf("the draining w-0 still holds %s (%s)", c.Unit, c.State)
		}
	}
}

// Found by the chaos suite (scenario 5: PostgreSQL unreachable for 30s,
// then back): while the registry does not answer, a member keeps trying
// at least every half renew interval plus one query. It used to back off
// to 2s between attempts, longer than the grace, so the first member back
// could adopt the units of one still waiting out its backoff, and units
// did not return to their owners.
//
// checks P5 (liveness: owners renew first)
func TestAMemberRetriesTheRegistryWithinTheGrace(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	a := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")
	p := f.Opts.Params
	a.reg.holdRenewals()
	// Hold long enough for any backoff to reach its cap.
	time.Sleep(3 * p.LeaseTTL)
	a.reg.releaseRenewals()
	a.reg.mu.Lock()
	attempts := append([]time.Time(nil), a.reg.heldRenewals...)
	a.reg.mu.Unlock()
	if len(attempts) < 3 {
		t.Fatalf("only %d renewals while the registry did not answer", len(attempts))
	}
	bound := p.RenewInterval/2 + p.QueryBound + 250*time.Millisecond
	for i := 1; i < len(attempts); i++ {
		if gap := attempts[i].Sub(attempts[i-1]); gap > bound {
			t.Fatalf("%s between renewal attempts %d and %d while the registry did not answer; the grace is %s, bound %s "+
				"(wall clock: scheduling delays of a loaded machine count too; the member's scripted scenario "+
				"\"a member retries the registry within half a renew interval\" checks the rule in virtual time)", gap, i, i+1, p.Grace, bound)
		}
	}
}

// Issue 20 defect 6: a second process under the same pod name (a
// partitioned old pod that healed after its replacement started) displaces
// the first. The displaced process must not join again: each join pushed
// the other's re-home back, and the two took turns forever (54 joins each
// in 20s, no acks). Now the displaced one gives up (its Run returns an
// error), the units settle on the newer process, its rows flow, and
// neither joins again.
//
// checks P3 (liveness), P1
func TestTwoProcessesUnderOnePodNameDoNotTakeTurns(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	old := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, old, 30*time.Second, "0.0", "0.1")
	repl := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, repl, 60*time.Second, "0.0", "0.1")
	// The fault took effect: the first process was displaced and fenced.
	if !old.w.Status().Fenced || old.counter(t, "shardkeeper_worker_fences_total") < 1 {
		t.Fatalf("setup: the first process was not displaced: %+v", old.w.Status())
	}
	displaced := history.Now()
	joins := []float64{old.counter(t, "shardkeeper_worker_joins_total"), repl.counter(t, "shardkeeper_worker_joins_total")}

	rows := f.PublishBurst([]ownership.Unit{{Partition: 0, Shard: 0}, {Partition: 0, Shard: 1}}, 200)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(repl.records(history.KindAck, "")); n < len(rows) {
			return fmt.Errorf("the newer process acked %d of %d rows", n, len(rows))
		}
		return nil
	})
	// A window as long as two leases plus the grace, in which the old
	// code joined dozens of times.
	p := f.Opts.Params
	<-time.After(2*p.LeaseTTL + p.Grace) // the observation's length, not a wait for a condition
	now := []float64{old.counter(t, "shardkeeper_worker_joins_total"), repl.counter(t, "shardkeeper_worker_joins_total")}
	t.Logf("joins (displaced, newer): %v at displacement, %v after %s; %d rows acked by the newer process",
		joins, now, 2*p.LeaseTTL+p.Grace, len(repl.records(history.KindAck, "")))
	if now[0] != joins[0] || now[1] != joins[1] {
		t.Fatalf("the processes joined again: %v, then %v", joins, now)
	}
	if !old.w.Status().Fenced {
		t.Fatal("the displaced process unfenced while the newer one lives")
	}
	if err := old.stop(time.Second); err == nil || strings.Contains(err.Error(), "did not stop") {
		t.Fatalf("the displaced process's Run should have returned an error by itself, got %v", err)
	}
	for _, k := range []history.Kind{history.KindDeliver, history.KindAck} {
		for _, r := range old.records(k, "") {
			if r.Start > displaced {
				t.Fatalf("the displaced process recorded %s on %s after it was displaced", k, r.Unit)
			}
		}
	}
}

// Issue 20 defect 5: a claim commits and its reply is lost, and before the
// member hears anything placement moves the unit away (the operator asks
// it to drain). The member confirms the unknown outcome and hands the
// units over; before the core it took the lost reply for a refusal, placed
// nothing on itself, and the units stayed with it, live, where nobody may
// adopt them.
//
// checks P3 (liveness), P6
func TestALostClaimReplyThenAPlacementChangeStrandsNothing(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	a := startArmedSDK(t, f, "w-0", nil, func(r *faultyRegistry) {
		r.afterLostClaim = func() {
			if err := f.Registry.SetDraining(context.Background(), f.Topology, "w-0", true); err != nil {
				t.Errorf("set draining: %v", err)
			}
		}
	}, nil)
	fleettest.Eventually(t, 30*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if a.reg.lostClaims == 0 {
			return fmt.Errorf("no claim reply lost yet")
		}
		return nil
	})
	b := startSDK(t, f, "w-1", nil, nil)
	waitHolding(t, b, 30*time.Second, "0.0", "0.1")
	cs, err := f.Registry.Claims(context.Background(), f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Owner != "w-1" || c.State != poolctl.StateHeld {
			t.Fatalf("unit %s: owner %q state %s, want held by w-1", c.Unit, c.Owner, c.State)
		}
	}
	if st := a.w.Status(); len(st.Held) != 0 {
		t.Fatalf("w-0 still holds %v", st.Held)
	}
}

// Issue 20 defect 4: the reply to a freeze acknowledgement comes back
// after the member lost its lease and joined again. The acknowledgement
// was the earlier incarnation's; the new one must acknowledge again, or
// Activate waits forever and claims stay frozen fleet-wide.
//
// checks P2 (liveness)
func TestAFreezeAcknowledgementReturningAfterARejoinIsSentAgain(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	ctx := context.Background()
	gate := make(chan struct{})
	a := startArmedSDK(t, f, "w-0", nil, func(r *faultyRegistry) { r.ackGate = gate }, nil)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")
	first := a.w.Status().Incarnation
	epoch, err := f.Registry.CreatePending(ctx, f.Topology, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 20*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if a.reg.heldAcks == 0 {
			return fmt.Errorf("no acknowledgement committed yet")
		}
		return nil
	})
	// The lease lapses while the reply is held; the member joins again.
	a.reg.holdRenewals()
	fleettest.Eventually(t, 30*time.Second, func() error {
		snap, err := f.Registry.Snapshot(ctx, f.Topology)
		if err != nil {
			return err
		}
		if m := snap.Member("w-0"); m == nil || m.Live {
			return fmt.Errorf("w-0's lease has not lapsed yet")
		}
		return nil
	})
	a.reg.releaseRenewals()
	fleettest.Eventually(t, 30*time.Second, func() error {
		if st := a.w.Status(); st.Incarnation == first || st.Fenced {
			return fmt.Errorf("not rejoined and unfenced yet: %+v", st)
		}
		return nil
	})
	if err := f.Registry.Activate(ctx, f.Topology, epoch); err == nil {
		t.Fatal("setup: the epoch activated before the new incarnation acknowledged")
	}
	close(gate) // incarnation 1's acknowledgement returns, late
	fleettest.Eventually(t, 20*time.Second, func() error {
		return f.Registry.Activate(ctx, f.Topology, epoch)
	})
}
