package poolctl

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// TestAFailoverToALaggingStandbyIsRefusedAndRecovered is issue 22's
// scenario on real parts: a PostgreSQL primary and an asynchronous
// streaming standby (pg_basebackup -R), the clients behind a proxy. The
// WAL stream is held while claims move and an epoch is activated, so the
// standby lags by exactly those commits; the primary is SIGKILLed, the
// standby promoted, the proxy repointed. The clients' next calls are
// refused as behind, Recover moves every counter past what they saw, and
// after the members rejoin no (unit, token) and no epoch number is issued
// a second time.
func TestAFailoverToALaggingStandbyIsRefusedAndRecovered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, standby, wal, front, dsn := laggablePair(t)
	standbyAddr := fmt.Sprintf("127.0.0.1:%d", standby.Port)
	pg, err := Open(ctx, Config{DSN: viaAddr(t, dsn, front.Addr()), MaxConns: 4})
	must(t, err)
	defer pg.Close()
	topo := newTopology(t, pg, testParams, 1, 8)

	// issued is every (unit, token) a client was given, and to whom.
	issued := map[string]string{}
	issue := func(who string, c Claim) {
		t.Helper()
		k := fmt.Sprintf("%s@%d", c.Unit, c.Epoch)
		if prev, dup := issued[k]; dup {
			t.Fatalf("(unit, token) %s issued to %s after %s", k, who, prev)
		}
		issued[k] = who
	}
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	b, err := pg.Join(ctx, topo, "b")
	must(t, err)
	for i := range 8 {
		m := a.MemberRef
		if i >= 4 {
			m = b.MemberRef
		}
		c, err := pg.Claim(ctx, m, 1, fmt.Sprintf("0.%d", i))
		must(t, err)
		issue(m.Member, c)
	}

	// The settings say what a failover costs: one asynchronous standby.
	d, err := pg.ReadDurability(ctx)
	must(t, err)
	if d.Durable || d.Reason != DurableAsynchronous || d.Standbys != 1 {
		t.Fatalf("durability with one asynchronous standby: %+v; want not durable, %s, 1 standby", d, DurableAsynchronous)
	}

	// a gives 0.3 up before the lag: the standby will show it free.
	cs, err := pg.ConfirmOwned(ctx, a.MemberRef, nil)
	must(t, err)
	must(t, pg.Release(ctx, cs.Held["0.3"]))

	// The standby has everything so far; then its WAL stream stops.
	standbyDSN := viaAddr(t, dsn, standbyAddr)
	waitStandbySeq(ctx, t, standbyDSN, topo, pg.SeenSeq(topo))
	wal.Hold(true)
	replicated := pg.SeenSeq(topo)

	// Claims move, and an epoch is activated, on the primary only.
	maxToken, maxEpoch := int64(0), int64(1)
	for i := range 4 {
		u := fmt.Sprintf("0.%d", i)
		if i < 3 {
			cs, err := pg.ConfirmOwned(ctx, a.MemberRef, nil)
			must(t, err)
			must(t, pg.Release(ctx, cs.Held[u]))
		}
		c, err := pg.Claim(ctx, b.MemberRef, 1, u)
		must(t, err)
		issue("b", c)
		maxToken = max(maxToken, c.Epoch)
	}
	e, err := pg.CreatePending(ctx, topo, 1, 8)
	must(t, err)
	must(t, pg.AckFreeze(ctx, a.MemberRef, e))
	must(t, pg.AckFreeze(ctx, b.MemberRef, e))
	must(t, pg.Activate(ctx, topo, e))
	maxEpoch = e
	_, err = pg.Renew(ctx, a.MemberRef)
	must(t, err)
	seen := pg.SeenSeq(topo)
	if seen <= replicated {
		t.Fatalf("the client's mark %d did not rise above the replicated %d while claims moved", seen, replicated)
	}

	// The failover: SIGKILL, promote, repoint.
	must(t, primary.Kill())
	must(t, standby.Promote(ctx))
	front.Retarget(standbyAddr)
	front.CutAll()
	var standbySeq int64
	must(t, queryOne(ctx, standbyDSN, "SELECT seq FROM shardkeeper.registry_seq WHERE topology = $1", topo, &standbySeq))
	if standbySeq >= seen {
		t.Fatalf("the promoted standby is at seq %d, the client saw %d: the fault (a lagging standby) did not take effect", standbySeq, seen)
	}
	t.Logf("client saw seq %d, promoted standby has %d (replicated %d)", seen, standbySeq, replicated)

	// The client's next renewal is refused as behind (after the broken
	// connections of the dead primary are replaced).
	var renewErr error
	deadline := time.Now().Add(time.Minute)
	for {
		_, renewErr = pg.Renew(ctx, a.MemberRef)
		if !IsConnectionError(renewErr) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	be, ok := RegistryBehind(renewErr)
	if !ok || !errors.Is(renewErr, ErrRegistryBehind) {
		t.Fatalf("renewal on the promoted standby: got %v, want ErrRegistryBehind", renewErr)
	}
	t.Logf("refused: %v", be)

	// A client that saw nothing is refused too: every write is, until
	// Recover (a claim the rules refuse writes nothing and is refused by
	// the rules, as here a claim of a unit a holds on the standby).
	fresh, err := Open(ctx, Config{DSN: viaAddr(t, dsn, front.Addr()), SkipMigrate: true})
	must(t, err)
	defer fresh.Close()
	if _, err := fresh.Join(ctx, topo, "c"); !isBehind(err) {
		t.Fatalf("join by a fresh client after the failover: got %v, want behind", err)
	}
	if _, err := fresh.Claim(ctx, b.MemberRef, 1, "0.0"); !errors.Is(err, ErrHeld) {
		t.Fatalf("claim of a unit the standby still gives to a: got %v, want ErrHeld", err)
	}

	// Recover is told only the sequence seen, with the smallest margin:
	// the bound "one per lost transaction" alone must carry every counter
	// past what the lost primary issued.
	rec, err := pg.Recover(ctx, topo, RecoverFloor{Seq: seen}, 1)
	must(t, err)
	t.Logf("recovered: %+v (lost primary issued tokens up to %d, epochs up to %d)", rec, maxToken, maxEpoch)
	if rec.TokenFloor <= maxToken || rec.EpochFloor <= maxEpoch || rec.Seq <= seen {
		t.Fatalf("recovered %+v: want every floor above what was seen (token %d, epoch %d, seq %d)", rec, maxToken, maxEpoch, seen)
	}
	assertRecoverMovesRecordedAsRecover(t, pg, topo, rec.TokenFloor)

	// Members rejoin and take every unit again: every token is new. The
	// grace after the leases Recover ended passes first (moved clock).
	must(t, testShiftPast(ctx, pg, topo, testParams.Grace+time.Second))
	a2, err := pg.Rejoin(ctx, a.MemberRef, "a-1")
	must(t, err)
	b2, err := pg.Rejoin(ctx, b.MemberRef, "b-1")
	must(t, err)
	if a2.Incarnation <= b.Incarnation || b2.Incarnation <= b.Incarnation {
		t.Fatalf("incarnations after recovery %d, %d: want above %d", a2.Incarnation, b2.Incarnation, b.Incarnation)
	}
	// A renewal only the lost primary saw may have granted a lease up to
	// its death plus the TTL: nothing is re-homed (or adopted) before
	// Recover's instant + TTL + grace, though the registry's own lease
	// rows ended at Recover (chaos 14c re-homed inside that grace).
	if c, err := pg.Claim(ctx, a2.MemberRef, 1, "0.0"); err == nil {
		t.Fatalf("0.0 re-homed as %+v one grace after Recover; a lease the lost primary granted may run a TTL longer", c)
	}
	if cs, err := pg.ConfirmOwned(ctx, a2.MemberRef, nil); err != nil || len(cs.Held) != 0 {
		t.Fatalf("confirmation one grace after Recover: %v, holds %v; want nothing re-homed yet", err, cs.Held)
	}
	// 0.3 is free on the standby, but the lost primary gave it to b, whose
	// lease a paused b may still believe in: a free row Recover moved
	// waits for the same horizon.
	var held *HeldError
	if c, err := pg.Claim(ctx, a2.MemberRef, 1, "0.3"); !errors.As(err, &held) || held.Reason != HeldRecovered {
		t.Fatalf("claim of 0.3 (free on the standby, b's on the lost primary) one grace after Recover: %+v, %v; want %s",
			c, err, HeldRecovered)
	}
	// To Recover's instant + TTL + grace: the members' own leases, taken
	// one grace after Recover, still run; they renew.
	must(t, testShiftPast(ctx, pg, topo, testParams.LeaseTTL-time.Second))
	for _, m := range []MemberRef{a2.MemberRef, b2.MemberRef} {
		_, err := pg.Renew(ctx, m)
		must(t, err)
	}
	for i := range 8 {
		m := a2.MemberRef
		if i >= 4 {
			m = b2.MemberRef
		}
		c, err := pg.Claim(ctx, m, 1, fmt.Sprintf("0.%d", i))
		if err != nil {
			// a unit of the member's earlier incarnation is re-homed by
			// ConfirmOwned (after the grace), not claimed.
			cs, cerr := pg.ConfirmOwned(ctx, m, nil)
			must(t, cerr)
			tok, held := cs.Held[fmt.Sprintf("0.%d", i)]
			if !held {
				t.Fatalf("claim 0.%d after recovery: %v, and not held after confirming either", i, err)
			}
			c = Claim{Token: tok}
		}
		issue(m.Member, c)
	}
	e2, err := pg.CreatePending(ctx, topo, 1, 4)
	must(t, err)
	if e2 <= maxEpoch {
		t.Fatalf("epoch %d created after recovery; %d was activated before the failover", e2, maxEpoch)
	}
}

// laggablePair starts a primary and an asynchronous streaming standby fed
// through wal (hold it to make the standby lag), a test database, and the
// proxy the clients reach the primary through (front: retarget it at the
// standby after a promotion).
func laggablePair(t *testing.T) (primary, standby *pgtest.Server, wal, front *faultproxy.Proxy, dsn string) {
	t.Helper()
	primary = pgtest.New(t)
	primaryAddr := fmt.Sprintf("127.0.0.1:%d", primary.Port)
	wal = faultproxy.New(t, primaryAddr)
	standby = primary.NewStandby(t, wal.Addr())
	dsn = primary.NewTestDatabase(t)
	front = faultproxy.New(t, primaryAddr)
	return primary, standby, wal, front, dsn
}

// passRecoveredLeases moves the registry's clock past every lease a lost
// primary may have granted before the last Recover, plus the grace
// (waitRecovered): a unit nobody took since is claimable.
func passRecoveredLeases(ctx context.Context, t *testing.T, pg *PG, topology string) {
	t.Helper()
	must(t, testShiftPast(ctx, pg, topology, testParams.LeaseTTL+testParams.Grace))
}

// testShiftPast moves the registry's clock (the test hook) by d, so the
// grace after the ended leases passes without a sleep.
func testShiftPast(ctx context.Context, pg *PG, topology string, d time.Duration) error {
	return pg.ShiftClock(ctx, topology, d)
}

// waitStandbySeq polls the standby until it replayed the topology's
// sequence up to want.
func waitStandbySeq(ctx context.Context, t *testing.T, dsn, topology string, want int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var got int64
	for time.Now().Before(deadline) {
		if err := queryOne(ctx, dsn, "SELECT seq FROM shardkeeper.registry_seq WHERE topology = $1", topology, &got); err == nil && got >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("standby replayed seq %d, want %d, within a minute", got, want)
}

func queryOne(ctx context.Context, dsn, sql string, arg any, dest any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, arg).Scan(dest)
}

// TestACommitWhoseSynchronousWaitWasCancelledIsFoundAfterAFailover is the
// synchronous-replication variant of issue 22: commits wait for the
// standby, the WAL stream is held, and a claim's wait is cancelled by the
// caller's deadline. PostgreSQL then makes the commit visible on the
// primary though the standby never got it, and the caller sees an error
// (an unknown outcome). The commit trigger told the client its sequence
// before the wait, so after the primary dies and the standby is promoted
// the registry is found behind, and after Recover the unit's next token is
// above the one the lost commit issued.
func TestACommitWhoseSynchronousWaitWasCancelledIsFoundAfterAFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := pgtest.New(t)
	primaryAddr := fmt.Sprintf("127.0.0.1:%d", primary.Port)
	wal := faultproxy.New(t, primaryAddr)
	standby := primary.NewStandby(t, wal.Addr())
	standbyAddr := fmt.Sprintf("127.0.0.1:%d", standby.Port)
	must(t, execOn(ctx, primary.DSN("postgres"), "ALTER SYSTEM SET synchronous_standby_names = '*'"))
	must(t, execOn(ctx, primary.DSN("postgres"), "SELECT pg_reload_conf()"))
	// pgtest starts servers with synchronous_commit=off on the command
	// line; a role setting overrides it for new sessions.
	must(t, execOn(ctx, primary.DSN("postgres"), "ALTER ROLE postgres SET synchronous_commit = 'on'"))
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		if err := queryOne(ctx, primary.DSN("postgres"), "SELECT count(*) FROM pg_stat_replication WHERE sync_state = $1", "sync", &n); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby did not become synchronous within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}

	dsn := primary.NewTestDatabase(t)
	front := faultproxy.New(t, primaryAddr)
	pg, err := Open(ctx, Config{DSN: viaAddr(t, dsn, front.Addr()), MaxConns: 4})
	must(t, err)
	defer pg.Close()
	d, err := pg.ReadDurability(ctx)
	must(t, err)
	if !d.Durable || d.Reason != DurableSynchronous {
		t.Fatalf("durability with a synchronous standby: %+v; want durable, %s", d, DurableSynchronous)
	}
	topo := newTopology(t, pg, testParams, 1, 4)
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	c0, err := pg.Claim(ctx, a.MemberRef, 1, "0.0")
	must(t, err)
	replicated := pg.SeenSeq(topo)

	// The standby stops acknowledging; a claim's wait for it is cancelled.
	// The caller gives up once the commit waits for the standby (the
	// backend's wait event says so) and the client has read the commit's
	// sequence notice, which the server flushed before the wait, as a
	// query bound would. (pgx stops reading at a cancel: a caller that
	// gives up before its connection read the notice has not seen the
	// sequence; it acts on the claim only after ConfirmOwned, whose read
	// raises the mark. The CI run of 2026-12-04 cancelled in that gap.)
	wal.Hold(true)
	cctx, ccancel := context.WithCancel(ctx)
	claimed := make(chan error, 1)
	go func() { _, err := pg.Claim(cctx, a.MemberRef, 1, "0.1"); claimed <- err }()
	deadline = time.Now().Add(time.Minute)
	for {
		var n int64
		must(t, queryOne(ctx, primary.DSN("postgres"), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = $1", "SyncRep", &n))
		if n > 0 && pg.SeenSeq(topo) > replicated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within a minute, no commit waited for the standby (%d waiting) with its sequence read by the client (mark %d, replicated %d)", n, pg.SeenSeq(topo), replicated)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ccancel()
	if err := <-claimed; err == nil {
		t.Fatal("a claim returned success while its commit waited for a standby that does not answer")
	} else {
		t.Logf("claim cancelled during the wait for the standby: %v", err)
	}
	var lostToken int64
	deadline = time.Now().Add(time.Minute)
	for {
		err := queryOne(ctx, viaAddr(t, dsn, primaryAddr),
			"SELECT fencing_epoch FROM shardkeeper.claims WHERE topology = $1 AND unit = '0.1' AND owner = 'a'", topo, &lostToken)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) || time.Now().After(deadline) {
			t.Fatalf("the cancelled commit never became visible on the primary: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the primary shows 0.1 held by a at token %d, which the standby never got; the client's mark is %d (replicated %d)", lostToken, pg.SeenSeq(topo), replicated)

	must(t, primary.Kill())
	must(t, standby.Promote(ctx))
	front.Retarget(standbyAddr)
	front.CutAll()
	var renewErr error
	deadline = time.Now().Add(time.Minute)
	for {
		_, renewErr = pg.Renew(ctx, a.MemberRef)
		if !IsConnectionError(renewErr) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errors.Is(renewErr, ErrRegistryBehind) {
		t.Fatalf("renewal after the failover: got %v, want ErrRegistryBehind", renewErr)
	}
	rec, err := pg.Recover(ctx, topo, RecoverFloor{}, 1)
	must(t, err)
	passRecoveredLeases(ctx, t, pg, topo)
	a2, err := pg.Rejoin(ctx, a.MemberRef, "a-1")
	must(t, err)
	c1, err := pg.Claim(ctx, a2.MemberRef, 1, "0.1")
	must(t, err)
	if c1.Epoch <= lostToken || c1.Epoch <= c0.Epoch {
		t.Fatalf("token of 0.1 after recovery %d (%+v); the lost commit issued %d", c1.Epoch, rec, lostToken)
	}
}

func execOn(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// assertRecoverMovesRecordedAsRecover: the history records Recover's token
// moves under op "recover", which gives a unit to nobody, not under the
// row's last decision: a move of a row the standby still gave to one
// member, recorded as that member's "claim", reads as a second valid
// claim beside the holder a lost handover gave it to (chaos 14a, 14b).
func assertRecoverMovesRecordedAsRecover(t *testing.T, pg *PG, topo string, floor int64) {
	t.Helper()
	hist, err := pg.ClaimHistory(context.Background(), topo)
	must(t, err)
	moved := 0
	for _, e := range hist {
		if e.Epoch != floor {
			continue
		}
		if e.Op != string(lastRecover) {
			t.Fatalf("Recover's move of %s to token %d recorded as %q (owner %q), want %q", e.Unit, floor, e.Op, e.Owner, lastRecover)
		}
		moved++
	}
	if moved == 0 {
		t.Fatalf("no claim history event at the recovered token floor %d", floor)
	}
}
