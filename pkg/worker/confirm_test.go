package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The confirmation rules of the member core on the real parts (issue 19:
// the mutations confirm-without-version-check and
// confirm-during-handover-starts-puller survived every real-parts test;
// the core's scripted scenarios for issue 20 defects 1 and 2 replay the
// same interleavings in virtual time). Each test holds one registry call
// of pkg/worker's member while its units change, lets it through, and
// reads the member's delivery permission once the core has handled the
// reply: the core has one lease call in flight at a time, so the next
// lease call it makes shows that it did.

// longLeaseParams give a member whose lease calls are held for a while
// (a held confirmation answer, held renewals) a lease far longer than the
// test needs, so it never fences itself meanwhile; renewals, the query
// bound and the grace stay short.
var longLeaseParams = poolctl.Params{LeaseTTL: 30 * time.Second, RenewInterval: time.Second, QueryBound: time.Second, Grace: 2 * time.Second}

// Issue 20 defect 1: a confirmation read while the member held a unit
// whose answer arrives after the member handed the unit over (the
// release committed and another worker claimed it) must not bring the
// unit back. The core applies an answer only to units that did not change
// since it was asked; without that check the late answer restarts a
// puller under the released token while the unit's next holder delivers
// it.
//
// The confirmation is the one the member asks after a claim whose reply
// was lost: it expects the unit the member holds, and the test holds its
// answer (read before the handover) until the handover is over.
//
// checks P1
func TestALateConfirmationDoesNotBringBackAReleasedUnit(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, Params: longLeaseParams})
	ctx := context.Background()
	a := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, a, 30*time.Second, "0.0")
	released := a.token(t, "0.0")

	// The next claim (of the unit the topology change adds) commits and
	// loses its reply; the confirmation that calls for is read at once
	// and its answer held.
	answer, letAnswerThrough := gate(t)
	a.reg.mu.Lock()
	a.reg.afterLostClaim = func() {}
	a.reg.confirmGate = answer
	a.reg.mu.Unlock()
	f.ChangeTopology(1, 2)
	var held confirmAnswer
	fleettest.Eventually(t, 30*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if len(a.reg.heldConfirms) == 0 {
			return fmt.Errorf("no confirmation answer held yet (claim replies lost: %d)", a.reg.lostClaims)
		}
		held = a.reg.heldConfirms[0]
		return nil
	})
	// The fault took effect: the held answer was asked while the member
	// held 0.0 and says it does, at the token it is about to release.
	if held.expected["0.0"] != released.Epoch || held.conf.Held["0.0"].Epoch != released.Epoch {
		t.Fatalf("setup: the held confirmation expected %v and answered %v, want 0.0 at epoch %d in both", held.expected, held.conf.Held, released.Epoch)
	}
	if _, ok := held.conf.Held["0.1"]; !ok {
		t.Fatalf("setup: the held answer does not list 0.1, whose claim reply was lost: %v", held.conf.Held)
	}

	// The operator drains w-0 while the answer is held: it hands 0.0 over
	// to its end (drain, UNPIN, release committed, unit forgotten), and
	// w-1 claims it.
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-0", true); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := a.histogramCount(t, "shardkeeper_worker_handover_seconds"); n < 1 {
			return fmt.Errorf("w-0 has not finished handing 0.0 over (holds %v)", a.w.Status().Held)
		}
		return nil
	})
	b := startSDK(t, f, "w-1", nil, nil)
	waitHolding(t, b, 30*time.Second, "0.0")
	next := b.token(t, "0.0")
	if next.Epoch <= released.Epoch {
		t.Fatalf("setup: w-1 holds 0.0 at epoch %d, not above w-0's released %d", next.Epoch, released.Epoch)
	}
	// From here w-0's ticks decide nothing, so what the late answer does
	// stays in its permission to be read.
	letTicksThrough := a.reg.holdSnapshots(t)
	lane := a.reg.laneLog()
	if last := lane[len(lane)-1]; last != "confirm" || held.lane != len(lane)-1 {
		t.Fatalf("setup: w-0 made lease calls after the held confirmation (%v): its answer was not held throughout", lane[held.lane:])
	}
	if a.w.Status().Fenced || a.counter(t, "shardkeeper_worker_fences_total") != 0 {
		t.Fatalf("premise broken: w-0 fenced itself while the answer was held (lease %s)", longLeaseParams.LeaseTTL)
	}

	t.Logf("w-0's confirmation answer (0.0 held at epoch %d) held while it released 0.0 and w-1 claimed it at epoch %d; letting it through", released.Epoch, next.Epoch)
	letAnswerThrough()
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(a.reg.laneLog()); n <= len(lane) {
			return fmt.Errorf("w-0 made no lease call since the answer was let through")
		}
		return nil
	})
	if e, ok := a.w.Status().Held["0.0"]; ok {
		t.Fatalf("the late confirmation brought 0.0 back: w-0 may deliver it under epoch %d, which it released, while w-1 holds it at epoch %d", e, next.Epoch)
	}

	// The answer was applied to what did not change: 0.1, whose claim
	// reply was lost, is w-0's, and w-0 (draining) hands it to w-1.
	letTicksThrough()
	waitHolding(t, b, 30*time.Second, "0.0", "0.1")
}

// Issue 20 defect 2: a confirmation answered while a unit is being handed
// over (here its release is on its way to the registry, which still shows
// the unit held) must not put the unit back into delivery. A unit in a
// handover is not confirmable; without that rule the answer makes it held
// again and starts a puller for it, whose token the release then ends.
//
// The confirmation is asked after the handover began: a claim's reply is
// lost while renewals are held, and the member's lease calls (a renewal
// first) wait until the release is out.
//
// checks P1
func TestAConfirmationDuringAHandoverStartsNoPuller(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, Params: longLeaseParams})
	ctx := context.Background()
	a := startSDK(t, f, "w-0", nil, nil)
	waitHolding(t, a, 30*time.Second, "0.0")
	tok := a.token(t, "0.0")

	releases, letReleasesThrough := gate(t)
	a.reg.mu.Lock()
	a.reg.afterLostClaim = func() {}
	a.reg.releaseGate = releases
	a.reg.mu.Unlock()
	// Renewals held: from the first one held, the member's next lease
	// call is a renewal, so the confirmation the lost claim calls for
	// waits.
	a.reg.holdRenewals()
	t.Cleanup(a.reg.releaseRenewals)
	fleettest.Eventually(t, 30*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if len(a.reg.heldRenewals) == 0 {
			return fmt.Errorf("no renewal held yet")
		}
		return nil
	})
	renewalsHeldAt := len(a.reg.laneLog()) - 1
	f.ChangeTopology(1, 2)
	fleettest.Eventually(t, 30*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if a.reg.lostClaims == 0 {
			return fmt.Errorf("no claim reply lost yet")
		}
		return nil
	})
	// The operator drains w-0: it hands 0.0 over up to the release, which
	// the test holds before it reaches the registry.
	if err := f.Registry.SetDraining(ctx, f.Topology, "w-0", true); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		a.reg.mu.Lock()
		defer a.reg.mu.Unlock()
		if len(a.reg.heldReleases) == 0 {
			return fmt.Errorf("no release held yet (w-0 delivers %v)", a.w.Status().Held)
		}
		return nil
	})
	a.reg.mu.Lock()
	release := a.reg.heldReleases[0]
	a.reg.mu.Unlock()
	if len(release) != 1 || release[0] != tok {
		t.Fatalf("setup: the held release carries %v, want 0.0 at epoch %d", release, tok.Epoch)
	}
	// From here w-0's ticks decide nothing, so what the answer does stays
	// in its permission to be read.
	letTicksThrough := a.reg.holdSnapshots(t)
	mark := a.reg.laneLog()
	for i, call := range mark[renewalsHeldAt:] {
		if call != "renew" {
			t.Fatalf("setup: lease call %q made while renewals were held (%v): the confirmation was not kept waiting", call, mark[renewalsHeldAt+i:])
		}
	}
	if a.w.Status().Fenced || a.counter(t, "shardkeeper_worker_fences_total") != 0 {
		t.Fatalf("premise broken: w-0 fenced itself while renewals were held (lease %s)", longLeaseParams.LeaseTTL)
	}

	// Renewals go through; the confirmation is asked now, while 0.0's
	// release is held, and answered at once.
	a.reg.releaseRenewals()
	var asked int
	fleettest.Eventually(t, 30*time.Second, func() error {
		lane := a.reg.laneLog()
		asked = -1
		for i := len(mark); i < len(lane); i++ {
			if lane[i] == "confirm" {
				asked = i
				break
			}
		}
		if asked < 0 || len(lane) <= asked+1 {
			return fmt.Errorf("no confirmation handled since renewals were let through: %v", lane[len(mark):])
		}
		return nil
	})
	// The fault took effect: the confirmation was asked with 0.0 in its
	// handover (it expects 0.0's token) and answered while the release
	// was still held, so the registry listed 0.0 as w-0's.
	ans, ok := a.reg.confirmAt(asked)
	if !ok {
		t.Fatalf("setup: the confirmation asked after renewals resumed failed")
	}
	if ans.expected["0.0"] != tok.Epoch || ans.conf.Held["0.0"] != tok {
		t.Fatalf("setup: the confirmation expected %v and answered %v, want 0.0 at epoch %d in both", ans.expected, ans.conf.Held, tok.Epoch)
	}
	t.Logf("w-0's confirmation asked and answered (0.0 held at epoch %d) while its release of 0.0 was held; lease calls since renewals resumed: %v",
		tok.Epoch, a.reg.laneLog()[len(mark):])
	if e, ok := a.w.Status().Held["0.0"]; ok {
		t.Fatalf("a confirmation answered during 0.0's handover put it back into delivery: w-0 may deliver 0.0 under epoch %d, whose release is on its way", e)
	}

	// The release commits; the answer's other unit (0.1, whose claim
	// reply was lost) is handed over too, and w-0 holds nothing.
	letReleasesThrough()
	letTicksThrough()
	fleettest.Eventually(t, 30*time.Second, func() error {
		cs, err := f.Registry.Claims(ctx, f.Topology)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.Owner == "w-0" && c.State != poolctl.StateFree {
				return fmt.Errorf("the draining w-0 still holds %s at epoch %d (%s)", c.Unit, c.Epoch, c.State)
			}
		}
		if held := a.w.Status().Held; len(held) != 0 {
			return fmt.Errorf("w-0 still delivers %v", held)
		}
		return nil
	})
}
