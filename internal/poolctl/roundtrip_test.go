package poolctl

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// renewBound is how long a healthy member's Renew may take while another
// client is stalled in the middle of an operation: far below every query
// bound (DefaultParams: 2s), far above a statement on a loaded machine.
const renewBound = 1500 * time.Millisecond

// noSessionTimeouts is a registry whose server never ends an idle
// transaction or a lock wait, so a test sees what the registry itself
// holds, not what the backstops release.
func noSessionTimeouts(t *testing.T) *PG {
	t.Helper()
	reg, err := Open(context.Background(), Config{DSN: newDatabase(t), MaxConns: 8,
		LockTimeout: time.Minute, IdleInTransactionTimeout: time.Minute})
	must(t, err)
	t.Cleanup(reg.Close)
	return reg
}

// Defect 3 of issue 20: a claimer stalled between the round trips of a
// claim (SIGSTOPped, or cut off) must not hold any lock another member's
// Renew needs. The claim below reads a unit the owner holds, so a claim
// read that locked the owner's member row would block its renewal until a
// session timeout, and the owner would fence itself.
func TestStalledClaimDoesNotDelayOtherMembersRenewals(t *testing.T) { // checks P5
	reg := noSessionTimeouts(t)
	ctx := context.Background()
	topo := newTopology(t, reg, testParams, 1, 4)
	owner, err := reg.Join(ctx, topo, "owner")
	must(t, err)
	_, err = reg.Claim(ctx, owner.MemberRef, 1, "0.0")
	must(t, err)
	claimer, err := reg.Join(ctx, topo, "claimer")
	must(t, err)

	stalled, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unstall := func() { once.Do(func() { close(resume) }) }
	testHookClaimRead = func() { close(stalled); <-resume }
	// Runs before the registry closes, which waits for the claim's
	// connection.
	t.Cleanup(func() { testHookClaimRead = nil; unstall() })
	type result struct {
		outs []ClaimOutcome
		err  error
	}
	done := make(chan result, 1)
	go func() {
		outs, err := reg.ClaimMany(ctx, claimer.MemberRef, 1, []string{"0.0", "0.1"})
		done <- result{outs, err}
	}()
	<-stalled
	testHookClaimRead = nil

	// The fault took effect: the claim is stalled mid-way.
	select {
	case r := <-done:
		t.Fatalf("the claim finished while its client was stalled: %v", r.err)
	default:
	}
	for _, m := range []MemberRef{owner.MemberRef, claimer.MemberRef} {
		rctx, cancel := context.WithTimeout(ctx, renewBound)
		start := time.Now()
		_, err := reg.Renew(rctx, m)
		cancel()
		if err != nil {
			t.Fatalf("renew of %s while a claim is stalled mid-way: %v after %v (want done within %v)",
				m.Member, err, time.Since(start).Round(time.Millisecond), renewBound)
		}
		t.Logf("renew of %s while a claim is stalled mid-way: %v", m.Member, time.Since(start).Round(time.Microsecond))
	}
	unstall()
	r := <-done
	must(t, r.err)
	if !errors.Is(r.outs[0].Err, ErrHeld) || r.outs[1].Err != nil {
		t.Fatalf("claim after the stall: 0.0 %v, 0.1 %v; want held, claimed", r.outs[0].Err, r.outs[1].Err)
	}
}

// Issue 20's suspected "the claim read takes now before waiting on row
// locks": a claim that waits for a lock is judged, and its At stamped, on
// the registry's clock after the wait. Here a writer holds the unit's row
// while the clock moves 10s; the claim must be decided at the later time.
func TestClaimJudgesOnTheClockReadAfterItsLocks(t *testing.T) {
	reg := noSessionTimeouts(t)
	ctx := context.Background()
	topo := newTopology(t, reg, testParams, 1, 4)
	a, err := reg.Join(ctx, topo, "a")
	must(t, err)
	first, err := reg.Claim(ctx, a.MemberRef, 1, "0.1")
	must(t, err)
	must(t, reg.Release(ctx, first.Token))

	holder, err := reg.Pool().Begin(ctx)
	must(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM shardkeeper.claims WHERE topology = $1 AND unit = '0.1' FOR UPDATE`, topo)
	must(t, err)
	type result struct {
		c   Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := reg.Claim(ctx, a.MemberRef, 1, "0.1")
		done <- result{c, err}
	}()
	// The fault took effect: the claim waits for the row lock.
	testbed.Eventually(t, 10*time.Second, func() error {
		var n int
		if err := reg.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("the claim does not wait for the held row yet")
		}
		return nil
	})
	must(t, reg.ShiftClock(ctx, topo, 10*time.Second))
	s, err := reg.Snapshot(ctx, topo)
	must(t, err)
	must(t, holder.Rollback(ctx))
	r := <-done
	must(t, r.err)
	if r.c.At.Before(s.Now) {
		t.Fatalf("claim decided at %v, before the clock (%v) read after it got its lock", r.c.At, s.Now)
	}
}

// The session timeouts are backstops that must end a stalled session
// before a Renew queued behind it times out: idle < lock < query bound,
// all far below the lease.
func TestDefaultSessionTimeoutsEndBeforeARenewalTimesOut(t *testing.T) {
	p := DefaultParams()
	if !(DefaultIdleInTransactionTimeout < DefaultLockTimeout && DefaultLockTimeout < p.QueryBound &&
		p.QueryBound < p.LeaseTTL) {
		t.Fatalf("idle-in-transaction %v, lock %v, query bound %v, lease %v: want them in increasing order",
			DefaultIdleInTransactionTimeout, DefaultLockTimeout, p.QueryBound, p.LeaseTTL)
	}
	got := Config{}.runtimeParams()
	for name, want := range map[string]string{"lock_timeout": "1500", "idle_in_transaction_session_timeout": "1000",
		"statement_timeout": "30000"} {
		if got[name] != want {
			t.Fatalf("%s = %q ms, want %s", name, got[name], want)
		}
	}
}

// A claim decides without locks, so its write must apply only where the
// decision still holds. Here an adoption is decided from the owner's
// lapsed lease, and the owner rejoins before the write: a member that
// rejoins protects its units at once, so the claim is decided again and
// refused. checks P5
func TestAdoptionDecidedBeforeTheOwnerRejoinsIsDecidedAgain(t *testing.T) {
	pg, _ := newPG(t)
	ctx := context.Background()
	topo := newTopology(t, pg, testParams, 1, 4)
	owner, err := pg.Join(ctx, topo, "owner")
	must(t, err)
	_, err = pg.Claim(ctx, owner.MemberRef, 1, "0.0")
	must(t, err)
	c, err := pg.Join(ctx, topo, "claimer")
	must(t, err)
	lapse(t, pg, topo, c.MemberRef)
	reads := 0
	testHookClaimRead = func() {
		reads++
		if reads == 1 {
			_, err := pg.Join(ctx, topo, "owner")
			must(t, err)
		}
	}
	t.Cleanup(func() { testHookClaimRead = nil })
	_, err = pg.Claim(ctx, c.MemberRef, 1, "0.0")
	var he *HeldError
	if !errors.As(err, &he) || he.Reason != HeldOwnerLive || reads != 2 {
		t.Fatalf("adoption while the owner rejoined: %v after %d reads, want held by a live owner after 2", err, reads)
	}
}
