package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestEveryCommittedWriteRaisesTheClientsMark: the commit trigger's
// notice reaches the client that wrote, so its mark covers its own claim
// before Claim returns (a claim lost in a failover is above the mark the
// next renewal sends).
func TestEveryCommittedWriteRaisesTheClientsMark(t *testing.T) {
	ctx := context.Background()
	pg, _ := newPG(t)
	topo := newTopology(t, pg, testParams, 1, 4)
	s0 := pg.SeenSeq(topo)
	if s0 == 0 {
		t.Fatalf("creating and activating an epoch left the mark at 0")
	}
	l, err := pg.Join(ctx, topo, "a")
	must(t, err)
	s1 := pg.SeenSeq(topo)
	c, err := pg.Claim(ctx, l.MemberRef, 1, "0.0")
	must(t, err)
	s2 := pg.SeenSeq(topo)
	_, err = pg.Renew(ctx, l.MemberRef)
	must(t, err)
	s3 := pg.SeenSeq(topo)
	if !(s0 < s1 && s1 < s2 && s2 < s3) {
		t.Fatalf("marks after epoch, join, claim, renew: %d %d %d %d; want strictly rising", s0, s1, s2, s3)
	}
	seq, err := pg.CheckSeq(ctx, topo)
	must(t, err)
	if seq != s3 {
		t.Fatalf("registry seq %d, client mark %d: want equal with no other writer", seq, s3)
	}
	// A refused write commits nothing and raises nothing.
	_, err = pg.Claim(ctx, MemberRef{Topology: topo, Member: "nobody", Incarnation: 1}, 1, "0.1")
	if err == nil {
		t.Fatal("claim by a non-member succeeded")
	}
	if got := pg.SeenSeq(topo); got != s3 {
		t.Fatalf("a refused claim moved the mark from %d to %d", s3, got)
	}
	_ = c
}

// TestARegistryBehindAClientsMarkIsRefusedUntilRecovered rolls the
// registry's sequence back by hand (what a failover to a lagging standby
// does to it) and checks the whole path: the next renewal is refused as
// behind; so is every other client, even one whose mark is low; Recover
// moves tokens, epochs and incarnations past what was seen; members rejoin
// and claim again above everything seen.
func TestARegistryBehindAClientsMarkIsRefusedUntilRecovered(t *testing.T) {
	ctx := context.Background()
	pg, dsn := newPG(t)
	topo := newTopology(t, pg, testParams, 1, 4)
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	c, err := pg.Claim(ctx, a.MemberRef, 1, "0.0")
	must(t, err)

	// The fault: the client saw 10 more commits than the registry has.
	pg.NoteSeq(topo, pg.SeenSeq(topo)+10)
	_, err = pg.Renew(ctx, a.MemberRef)
	be, ok := RegistryBehind(err)
	if !ok || !errors.Is(err, ErrRegistryBehind) {
		t.Fatalf("renew on a registry behind the client's mark: got %v, want ErrRegistryBehind", err)
	}
	if be.Seen <= be.Seq {
		t.Fatalf("refusal names seen %d and seq %d; want seen above seq", be.Seen, be.Seq)
	}

	// Another client, which saw nothing, is refused too: the refusal was
	// recorded, so new writes cannot carry the sequence past the mark.
	other, err := Open(ctx, Config{DSN: dsn, SkipMigrate: true})
	must(t, err)
	defer other.Close()
	if _, err := other.Join(ctx, topo, "b"); !isBehind(err) {
		t.Fatalf("join by a fresh client on a registry found behind: got %v, want behind", err)
	}
	if _, err := other.Claim(ctx, a.MemberRef, 1, "0.1"); !isBehind(err) {
		t.Fatalf("claim on a registry found behind: got %v, want behind", err)
	}
	if _, err := other.CheckSeq(ctx, topo); !isBehind(err) {
		t.Fatalf("CheckSeq on a registry found behind: got %v, want behind", err)
	}

	rec, err := pg.Recover(ctx, topo, RecoverFloor{Seq: pg.SeenSeq(topo), Token: c.Epoch + 5, Epoch: 7}, 100)
	must(t, err)
	if rec.TokenFloor < c.Epoch+5+100 || rec.EpochFloor < 7+100 || rec.Seq < pg.SeenSeq(topo)-1 {
		t.Fatalf("recovered %+v: want token floor >= %d, epoch floor >= 107", rec, c.Epoch+105)
	}
	// Every lease ended: the member rejoins and confirms.
	if _, err := pg.Renew(ctx, a.MemberRef); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("renew after recovery: got %v, want ErrLeaseExpired (every member rejoins)", err)
	}
	passRecoveredLeases(ctx, t, pg, topo)
	b, err := other.Join(ctx, topo, "b")
	must(t, err)
	if b.Incarnation < rec.IncarnationFloor-100 {
		t.Fatalf("incarnation %d after recovery, floor %d", b.Incarnation, rec.IncarnationFloor)
	}
	c1, err := other.Claim(ctx, b.MemberRef, 1, "0.1")
	must(t, err)
	if c1.Epoch <= rec.TokenFloor {
		t.Fatalf("token of a never-claimed unit after recovery %d; want above the floor %d", c1.Epoch, rec.TokenFloor)
	}
	// A new shape's units, which a lost primary may have claimed from
	// token 1 up, start above the floor too.
	e, err := other.CreatePending(ctx, topo, 1, 8)
	must(t, err)
	if e <= rec.EpochFloor {
		t.Fatalf("epoch after recovery %d; want above %d", e, rec.EpochFloor)
	}
	must(t, other.AckFreeze(ctx, b.MemberRef, e))
	must(t, other.Activate(ctx, topo, e))
	c2, err := other.Claim(ctx, b.MemberRef, e, "0.6")
	must(t, err)
	if c2.Epoch <= rec.TokenFloor {
		t.Fatalf("token of a unit new after recovery %d; want above the floor %d", c2.Epoch, rec.TokenFloor)
	}
	if _, err := pg.CheckSeq(ctx, topo); err != nil {
		t.Fatalf("CheckSeq after recovery: %v", err)
	}
}

// TestAChangedServerRefusesEveryWrite: the commit trigger compares the
// server's WAL timeline and system identifier with the last write's. A
// promotion changes the timeline; a load of a logical dump into another
// cluster changes the identifier (and may start on the recorded timeline).
// The test moves the recorded value by one (up: timeline 0 reads as
// unknown), which is what the promoted or restored server sees: the next renewal and claim are
// refused, CheckSeq names it, and Recover records the server anew.
func TestAChangedServerRefusesEveryWrite(t *testing.T) {
	for _, tc := range []struct{ column, reason string }{
		{"timeline", "registry timeline changed"},
		{"system_id", "registry system identifier changed"},
	} {
		t.Run(tc.column, func(t *testing.T) {
			ctx := context.Background()
			pg, _ := newPG(t)
			topo := newTopology(t, pg, testParams, 1, 2)
			a, err := pg.Join(ctx, topo, "a")
			must(t, err)
			var recorded *int64
			must(t, pg.Pool().QueryRow(ctx, "SELECT "+tc.column+" FROM shardkeeper.registry_seq WHERE topology = $1", topo).Scan(&recorded))
			if recorded == nil || *recorded == 0 {
				t.Fatalf("recorded %s %v: want the server's (the tests' role may read it)", tc.column, recorded)
			}
			_, err = pg.Pool().Exec(ctx, "UPDATE shardkeeper.registry_seq SET "+tc.column+" = "+tc.column+" + 1 WHERE topology = $1", topo)
			must(t, err)
			if _, err := pg.Renew(ctx, a.MemberRef); !behindFor(err, tc.reason) {
				t.Fatalf("renew: got %v, want behind for %q", err, tc.reason)
			}
			if _, err := pg.Claim(ctx, a.MemberRef, 1, "0.0"); !behindFor(err, tc.reason) {
				t.Fatalf("claim: got %v, want behind for %q", err, tc.reason)
			}
			if _, err := pg.CheckSeq(ctx, topo); !behindFor(err, tc.reason) {
				t.Fatalf("CheckSeq: got %v, want behind for %q", err, tc.reason)
			}
			// Reads a member acts on are refused too, not only writes.
			if _, err := pg.Snapshot(ctx, topo); !behindFor(err, tc.reason) {
				t.Fatalf("snapshot: got %v, want behind for %q", err, tc.reason)
			}
			if _, err := pg.ConfirmOwned(ctx, a.MemberRef, nil); !behindFor(err, tc.reason) {
				t.Fatalf("confirmation: got %v, want behind for %q", err, tc.reason)
			}
			_, err = pg.Recover(ctx, topo, RecoverFloor{}, 0)
			must(t, err)
			passRecoveredLeases(ctx, t, pg, topo)
			a2, err := pg.Rejoin(ctx, a.MemberRef, "p1")
			must(t, err)
			_, err = pg.Claim(ctx, a2.MemberRef, 1, "0.0")
			must(t, err)
			if _, err := pg.CheckSeq(ctx, topo); err != nil {
				t.Fatalf("CheckSeq after Recover: %v", err)
			}
		})
	}
}

// TestAReadBelowTheClientsMarkIsRefusedUnlessACommitWasInFlight: a
// snapshot or a confirmation (what a member acts on) from a registry whose
// sequence is below the client's mark is refused and the loss recorded for
// every client (chaos 14a: a worker confirmed a release the promoted
// standby had lost, and delivered again under the released token). But a
// mark may come from a commit's notice before the commit is visible: a
// read that meets such a commit waits for it and is answered, and nothing
// is recorded.
func TestAReadBelowTheClientsMarkIsRefusedUnlessACommitWasInFlight(t *testing.T) {
	ctx := context.Background()
	pg, dsn := newPG(t)
	topo := newTopology(t, pg, testParams, 1, 2)
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	seq, err := pg.CheckSeq(ctx, topo)
	must(t, err)

	t.Run("a commit in flight", func(t *testing.T) {
		tx, err := pg.Pool().Begin(ctx)
		must(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, "UPDATE shardkeeper.registry_seq SET seq = seq + 1 WHERE topology = $1", topo)
		must(t, err)
		pg.NoteSeq(topo, seq+1) // the notice came; the commit is not visible yet
		done := make(chan error, 1)
		go func() { _, err := pg.Snapshot(ctx, topo); done <- err }()
		select {
		case err := <-done:
			t.Fatalf("snapshot answered (%v) while the commit it must wait for was in flight", err)
		case <-time.After(300 * time.Millisecond):
		}
		must(t, tx.Commit(ctx))
		if err := <-done; err != nil {
			t.Fatalf("snapshot after the commit landed: %v, want an answer", err)
		}
		var reason *string
		must(t, pg.Pool().QueryRow(ctx, "SELECT behind_reason FROM shardkeeper.registry_seq WHERE topology = $1", topo).Scan(&reason))
		if reason != nil {
			t.Fatalf("a commit in flight recorded the registry as behind: %q", *reason)
		}
	})
	t.Run("a registry that went back", func(t *testing.T) {
		_, err := pg.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		seq, err := pg.CheckSeq(ctx, topo)
		must(t, err)
		pg.NoteSeq(topo, seq+5)
		// A repeated claim writes nothing, yet hands out a token.
		if outs, err := pg.ClaimMany(ctx, a.MemberRef, 1, []string{"0.0"}); !isBehind(err) {
			t.Fatalf("repeated claim: got %+v, %v; want behind", outs, err)
		}
		if _, err := pg.ConfirmOwned(ctx, a.MemberRef, map[string]int64{"0.0": 1}); !behindFor(err, "a client has seen a later sequence") {
			t.Fatalf("confirmation: got %v, want behind", err)
		}
		if _, err := pg.Snapshot(ctx, topo); !isBehind(err) {
			t.Fatalf("snapshot: got %v, want behind", err)
		}
		// Recorded: a client that saw nothing later is refused its writes.
		other, err := Open(ctx, Config{DSN: dsn, MaxConns: 2})
		must(t, err)
		defer other.Close()
		if _, err := other.Renew(ctx, a.MemberRef); !isBehind(err) {
			t.Fatalf("another client's renewal: got %v, want behind (recorded by the refused read)", err)
		}
	})
}

// behindFor reports whether err refuses a registry that went back in time
// for reason.
func behindFor(err error, reason string) bool {
	be, ok := RegistryBehind(err)
	return ok && be.Reason == reason
}

func isBehind(err error) bool { _, ok := RegistryBehind(err); return ok }

func TestDurabilityIsJudgedFromTheReplicationSettings(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          Durability
		durable     bool
		reason      string
		mentionsFix string
	}{
		{"no standby", Durability{SynchronousCommit: "on"}, false, DurableNoStandby, ""},
		{"asynchronous standby", Durability{SynchronousCommit: "on", Standbys: 2}, false, DurableAsynchronous, "dataDurability: required"},
		{"synchronous standby", Durability{SynchronousStandbyNames: "ANY 1 (*)", SynchronousCommit: "on", Standbys: 1}, true, DurableSynchronous, ""},
		{"remote_apply waits too", Durability{SynchronousStandbyNames: "s1", SynchronousCommit: "remote_apply"}, true, DurableSynchronous, ""},
		{"local commit does not wait", Durability{SynchronousStandbyNames: "s1", SynchronousCommit: "local", Standbys: 1}, false, DurableLocalCommit, ""},
		{"commit off does not wait", Durability{SynchronousStandbyNames: "s1", SynchronousCommit: "off", Standbys: 1}, false, DurableLocalCommit, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judgeDurability(tc.in)
			if got.Durable != tc.durable || got.Reason != tc.reason {
				t.Fatalf("got durable=%v reason=%s, want %v %s", got.Durable, got.Reason, tc.durable, tc.reason)
			}
			if tc.mentionsFix != "" && !strings.Contains(got.Message, tc.mentionsFix) {
				t.Fatalf("message %q does not say how to fix it (%q)", got.Message, tc.mentionsFix)
			}
		})
	}
}

// TestRecoverOfATopologyWithoutClaimsStillSetsFloors: a lost primary may
// have issued tokens and epochs the standby has no trace of at all.
func TestRecoverOfATopologyWithoutClaimsStillSetsFloors(t *testing.T) {
	ctx := context.Background()
	pg, _ := newPG(t)
	topo := fmt.Sprintf("ns/bare-%d", topologySeq.Add(1))
	must(t, pg.EnsureTopology(ctx, topo, testParams))
	rec, err := pg.Recover(ctx, topo, RecoverFloor{}, 10)
	must(t, err)
	passRecoveredLeases(ctx, t, pg, topo)
	e, err := pg.CreatePending(ctx, topo, 1, 2)
	must(t, err)
	must(t, pg.Activate(ctx, topo, e))
	l, err := pg.Join(ctx, topo, "a")
	must(t, err)
	c, err := pg.Claim(ctx, l.MemberRef, e, "0.1")
	must(t, err)
	if e <= 10 || c.Epoch <= 10 {
		t.Fatalf("after recovering a bare topology (%+v): epoch %d, token %d; want both above the margin 10", rec, e, c.Epoch)
	}
}
