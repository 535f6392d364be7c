package poolctl

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// lostTake is a registry failed over to a standby that never received the
// newest operator token take: l1 took token 1 (replicated), l2 took token
// 2 on the primary only, and the standby now serves both through pg.
type lostTake struct {
	pg     *PG
	topo   string
	l1, l2 *PG
	t1, t2 OperatorToken
}

func failOverLosingATake(ctx context.Context, t *testing.T) lostTake {
	t.Helper()
	primary, standby, wal, front, dsn := laggablePair(t)
	standbyAddr := fmt.Sprintf("127.0.0.1:%d", standby.Port)
	pg, err := Open(ctx, Config{DSN: viaAddr(t, dsn, front.Addr()), MaxConns: 4})
	must(t, err)
	t.Cleanup(pg.Close)
	f := lostTake{pg: pg, topo: newTopology(t, pg, testParams, 1, 4)}

	f.t1, err = pg.TakeOperatorToken(ctx, f.topo, "operator-0")
	must(t, err)
	f.l1 = pg.AsOperator(f.t1)
	// A write under the first token, so that the standby's sequence
	// shows when it has the take (the WAL is replayed in order).
	must(t, f.l1.SetDraining(ctx, f.topo, "a", true))
	waitStandbySeq(ctx, t, viaAddr(t, dsn, standbyAddr), f.topo, pg.SeenSeq(f.topo))
	wal.Hold(true)

	f.t2, err = pg.TakeOperatorToken(ctx, f.topo, "operator-1")
	must(t, err)
	f.l2 = pg.AsOperator(f.t2)

	must(t, primary.Kill())
	must(t, standby.Promote(ctx))
	front.Retarget(standbyAddr)
	front.CutAll()
	var onStandby int64
	must(t, untilConnected(func() error {
		tok, err := pg.OperatorToken(ctx, f.topo)
		onStandby = tok.Epoch
		return err
	}))
	if onStandby != f.t1.Epoch || f.t2.Epoch <= onStandby {
		t.Fatalf("the promoted standby's token is %d (taken: %d, then %d): the fault (a lost take) did not take effect",
			onStandby, f.t1.Epoch, f.t2.Epoch)
	}
	return f
}

// untilConnected retries f while it fails on a connection the failover
// broke.
func untilConnected(f func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		if !IsConnectionError(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Issue 21: a standby promoted before it received the newest operator
// token take would hand that number out again at the next take, and the
// leader that took it on the lost primary, paused, would resume as the
// new leader's twin once Recover let writes through. A take while the
// registry may have lost commits jumps past every take the lost primary
// could have made; Recover moves the token again and binds it to the
// leader that ran it; every earlier token is refused.
func TestATokenTakeTheFailoverLostIsNotIssuedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := failOverLosingATake(ctx, t)

	t3, err := f.pg.TakeOperatorToken(ctx, f.topo, "operator-2")
	must(t, err)
	if t3.Epoch <= f.t2.Epoch {
		t.Fatalf("take after the failover got token %d; the lost primary had issued %d", t3.Epoch, f.t2.Epoch)
	}
	// The lost take's holder cannot recover the registry for itself now.
	if _, err := f.l2.Recover(ctx, f.topo, RecoverFloor{}, 1); !errors.Is(err, ErrOperatorSuperseded) {
		t.Fatalf("Recover by the lost take's holder after a newer take: got %v, want superseded", err)
	}
	l3 := f.pg.AsOperator(t3)
	rec, err := l3.Recover(ctx, f.topo, RecoverFloor{}, 1)
	must(t, err)
	if got, _ := l3.Operator(); rec.OperatorToken.Epoch <= t3.Epoch || got != rec.OperatorToken || got.Holder != "operator-2" {
		t.Fatalf("after Recover the handle presents %+v (Recover said %+v), want operator-2's token above %d", got, rec.OperatorToken, t3.Epoch)
	}
	wantFenced(t, "the lost take's holder", f.l2.SetDraining(ctx, f.topo, "a", false), f.t2.Epoch, rec.OperatorToken.Epoch, "operator-2")
	wantFenced(t, "the leader before it", f.l1.SetDraining(ctx, f.topo, "a", false), f.t1.Epoch, rec.OperatorToken.Epoch, "operator-2")
	must(t, l3.SetDraining(ctx, f.topo, "a", false))
}

// Issue 21: the leader whose take the failover lost presents a token above
// the registry's. It is the newest leader, not a superseded one: its
// Recover goes through and binds the token to it, and the leader before
// it is refused.
func TestALeaderWhoseTakeTheFailoverLostRecoversAndGoesOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := failOverLosingATake(ctx, t)

	// Until then its writes are refused as the registry's loss, not as a
	// newer leader's (which would stop the process), and the check every
	// reconcile starts with says the registry is behind.
	err := f.l2.SetDraining(ctx, f.topo, "a", false)
	if !errors.Is(err, ErrRegistryBehind) || errors.Is(err, ErrOperatorSuperseded) {
		t.Fatalf("a write of the lost take's holder before Recover: got %v, want the registry behind, not superseded", err)
	}
	if _, err := f.l2.CheckSeq(ctx, f.topo); !isBehind(err) {
		t.Fatalf("CheckSeq of the lost take's holder: got %v, want the registry behind", err)
	}
	rec, err := f.l2.Recover(ctx, f.topo, RecoverFloor{}, 1)
	must(t, err)
	if rec.OperatorToken.Epoch <= f.t2.Epoch || rec.OperatorToken.Holder != "operator-1" {
		t.Fatalf("Recover by the lost take's holder moved the token to %+v, want operator-1's above %d", rec.OperatorToken, f.t2.Epoch)
	}
	cur, err := f.pg.OperatorToken(ctx, f.topo)
	must(t, err)
	if cur.Epoch != rec.OperatorToken.Epoch || cur.Holder != "operator-1" {
		t.Fatalf("registry's token %+v after Recover, want %+v", cur, rec.OperatorToken)
	}
	wantFenced(t, "the leader before it", f.l1.SetDraining(ctx, f.topo, "a", false), f.t1.Epoch, cur.Epoch, "operator-1")
	must(t, f.l2.SetDraining(ctx, f.topo, "a", false))

	// A Recover whose reply was lost (a timeout after its commit) is
	// confirmed, not guessed: a handle that did not see its answer, here
	// another handle of the same holder still on the lost take, learns
	// the token from the check every reconcile starts with.
	unaware := f.pg.AsOperator(f.t2)
	if _, err := unaware.CheckSeq(ctx, f.topo); err != nil {
		t.Fatalf("CheckSeq after Recover: %v", err)
	}
	if got, _ := unaware.Operator(); got.Epoch != cur.Epoch {
		t.Fatalf("a handle of the holder that recovered presents token %d after CheckSeq, want %d", got.Epoch, cur.Epoch)
	}
	must(t, unaware.SetDraining(ctx, f.topo, "a", true))
	// A handle of another holder learns nothing from it.
	if _, err := f.l1.CheckSeq(ctx, f.topo); err != nil {
		t.Fatalf("CheckSeq of the earlier leader: %v", err)
	}
	if got, _ := f.l1.Operator(); got.Epoch != f.t1.Epoch {
		t.Fatalf("the earlier leader's handle moved to token %d, want it left at %d", got.Epoch, f.t1.Epoch)
	}
}
