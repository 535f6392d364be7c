package poolctl

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestParamsValidateEnforcesP5Grace(t *testing.T) { // checks P5
	cases := []struct {
		name string
		p    Params
		ok   bool
	}{
		{"defaults", DefaultParams(), true},
		{"grace equal to renew plus query", Params{LeaseTTL: 10 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second, Grace: 5 * time.Second}, true},
		{"grace below renew plus query", Params{LeaseTTL: 10 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second, Grace: 4 * time.Second}, false},
		{"renew plus query not below ttl", Params{LeaseTTL: 5 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second, Grace: 5 * time.Second}, false},
		{"zero", Params{}, false},
		{"negative drain timeout", Params{LeaseTTL: 10 * time.Second, RenewInterval: 3 * time.Second, QueryBound: 2 * time.Second,
			Grace: 5 * time.Second, Worker: WorkerSettings{DrainTimeout: -time.Second}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.p.Validate(); (err == nil) != c.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", c.p, err, c.ok)
			}
		})
	}
}

func TestParseUnitAcceptsOnlyCanonicalNames(t *testing.T) {
	for unit, ok := range map[string]bool{"0.0": true, "3.11": true, "03.1": false, "1": false, "a.b": false, "1.-1": false, "1.2.3": false} {
		if _, _, err := parseUnit(unit); (err == nil) != ok {
			t.Errorf("parseUnit(%q) = %v, want ok=%v", unit, err, ok)
		}
	}
}

// forBackends runs f against a fresh registry of each backend.
func forBackends(t *testing.T, f func(t *testing.T, r testRegistry)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { f(t, b.new(t)) })
	}
}

func TestMembershipSlotsAreStickyAndIncarnationsGrow(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		b, err := r.Join(ctx, topo, "b")
		must(t, err)
		if a.Slot != 0 || b.Slot != 1 || b.Incarnation <= a.Incarnation {
			t.Fatalf("first joins: a=%+v b=%+v", a, b)
		}
		if a.TTL != testParams.LeaseTTL {
			t.Fatalf("lease TTL %v", a.TTL)
		}
		a2, err := r.Join(ctx, topo, "a")
		must(t, err)
		if a2.Slot != 0 || a2.Incarnation <= b.Incarnation {
			t.Fatalf("rejoin of a: %+v", a2)
		}
		_, err = r.Renew(ctx, a.MemberRef)
		wantErr(t, "renew of superseded incarnation", err, ErrStaleIncarnation)

		// a's lease lapses; c joins and takes the lowest slot no live member holds.
		must(t, r.ShiftClock(ctx, topo, 40*time.Second))
		_, err = r.Renew(ctx, b.MemberRef)
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, 30*time.Second))
		_, err = r.Renew(ctx, a2.MemberRef)
		wantErr(t, "renew after expiry", err, ErrLeaseExpired)
		c, err := r.Join(ctx, topo, "c")
		must(t, err)
		if c.Slot != 0 {
			t.Fatalf("c took slot %d, want a's slot 0", c.Slot)
		}
		a3, err := r.Join(ctx, topo, "a")
		must(t, err)
		if a3.Slot != 2 {
			t.Fatalf("a rejoined at slot %d, want 2", a3.Slot)
		}
		s, err := r.Snapshot(ctx, topo)
		must(t, err)
		if m := s.Member("a"); m == nil || !m.Live || m.FenceLiftedAt.IsZero() {
			t.Fatalf("a after rejoin from a lapse: %+v (want live, fence lifted)", m)
		}
		if m := s.Member("b"); m == nil || !m.FenceLiftedAt.IsZero() {
			t.Fatalf("b never fenced: %+v", m)
		}
		if len(s.LiveMembers()) != 3 {
			t.Fatalf("live members %+v", s.LiveMembers())
		}
	})
}

func TestLeaveRefusesWhileHoldingAndReleasesNothing(t *testing.T) { // checks P6
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 2)
		a, _ := r.Join(ctx, topo, "a")
		c, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		err = r.Leave(ctx, a.MemberRef)
		var he *HoldingError
		if !errors.As(err, &he) || he.Units != 1 {
			t.Fatalf("leave while holding: %v", err)
		}
		must(t, r.CheckToken(ctx, c.Token))
		must(t, r.Release(ctx, c.Token))
		must(t, r.Leave(ctx, a.MemberRef))
		s, _ := r.Snapshot(ctx, topo)
		if m := s.Member("a"); m == nil || m.Live || !m.Left {
			t.Fatalf("after leave: %+v", m)
		}
		_, err = r.Renew(ctx, a.MemberRef)
		wantErr(t, "renew after leave", err, ErrNotMember)
	})
}

func TestClaimAdoptionFollowsP5(t *testing.T) { // checks P1, P5, P6
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 2, 2)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		ca, err := r.Claim(ctx, a.MemberRef, 1, "1.1")
		must(t, err)
		if ca.Epoch != 1 || ca.Adopted || ca.From != "" {
			t.Fatalf("first claim %+v", ca)
		}
		again, err := r.Claim(ctx, a.MemberRef, 1, "1.1")
		must(t, err)
		if again.Token != ca.Token {
			t.Fatalf("repeat claim changed the token: %+v", again)
		}
		var he *HeldError
		_, err = r.Claim(ctx, b.MemberRef, 1, "1.1")
		if !errors.As(err, &he) || he.Reason != HeldOwnerLive {
			t.Fatalf("claim of a live owner's unit: %v", err)
		}
		// a stops renewing; b keeps renewing.
		must(t, r.ShiftClock(ctx, topo, 50*time.Second))
		_, err = r.Renew(ctx, b.MemberRef)
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, 20*time.Second)) // a expired 10s ago, grace 30s
		_, err = r.Claim(ctx, b.MemberRef, 1, "1.1")
		if !errors.As(err, &he) || he.Reason != HeldOwnerGrace {
			t.Fatalf("claim within grace: %v", err)
		}
		var se *StaleEpochError
		if err := r.CheckToken(ctx, ca.Token); !errors.As(err, &se) || se.Reason != StaleLease {
			t.Fatalf("a's token after its lease lapsed: %v", err)
		}
		must(t, r.ShiftClock(ctx, topo, 20*time.Second)) // 30s past expiry: adoptable
		_, err = r.Renew(ctx, b.MemberRef)
		must(t, err)
		cb, err := r.Claim(ctx, b.MemberRef, 1, "1.1")
		must(t, err)
		if !cb.Adopted || cb.From != "a" || cb.Epoch != 2 {
			t.Fatalf("adoption %+v", cb)
		}
		if err := r.Checkpoint(ctx, ca.Token, 7); !errors.As(err, &se) || se.Reason != StaleMoved || se.Epoch != 2 {
			t.Fatalf("a's write after adoption: %v", err)
		}
		if err := r.Release(ctx, ca.Token); !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("a's release after adoption: %v", err)
		}
		must(t, r.Checkpoint(ctx, cb.Token, 9))
		// Release keeps the row and its epoch; the unit is claimable at once.
		must(t, r.Release(ctx, cb.Token))
		cl, _ := r.Claims(ctx, topo)
		if len(cl) != 1 || cl[0].State != StateFree || cl[0].Epoch != 2 || cl[0].Owner != "" || cl[0].CheckpointSeq != 9 {
			t.Fatalf("released row %+v", cl)
		}
		a2, _ := r.Join(ctx, topo, "a")
		// a rejoined after a lapse: it may claim a free unit at once.
		ca2, err := r.Claim(ctx, a2.MemberRef, 1, "1.1")
		must(t, err)
		if ca2.Epoch != 3 || ca2.Adopted || ca2.CheckpointSeq != 9 {
			t.Fatalf("claim after release %+v", ca2)
		}
	})
}

func TestClaimRefusesOutsideTheActiveEpochAndWhileFrozen(t *testing.T) { // checks P2
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 2, 2)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		_, err := r.Claim(ctx, a.MemberRef, 1, "2.0")
		wantErr(t, "unit outside 2x2", err, ErrUnitOutOfRange)
		_, err = r.Claim(ctx, a.MemberRef, 1, "x")
		wantErr(t, "bad unit", err, ErrInvalid)
		_, err = r.Claim(ctx, a.MemberRef, 2, "0.0")
		wantErr(t, "claim under a future epoch", err, ErrEpochMoved)
		held, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)

		e2, err := r.CreatePending(ctx, topo, 2, 4)
		must(t, err)
		again, err := r.CreatePending(ctx, topo, 2, 4)
		must(t, err)
		if again != e2 || e2 != 2 {
			t.Fatalf("pending epochs %d, %d", e2, again)
		}
		_, err = r.CreatePending(ctx, topo, 4, 4)
		wantErr(t, "second pending", err, ErrPendingExists)
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.1")
		wantErr(t, "claim while frozen", err, ErrFrozen)
		if _, err := r.Claim(ctx, a.MemberRef, 1, "0.0"); err != nil {
			t.Fatalf("repeat of a held claim while frozen: %v", err)
		}
		must(t, r.Checkpoint(ctx, held.Token, 1)) // held units keep flowing

		must(t, r.AckFreeze(ctx, a.MemberRef, e2))
		var fe *FreezeIncompleteError
		if err := r.Activate(ctx, topo, e2); !errors.As(err, &fe) || !reflect.DeepEqual(fe.Missing, []string{"b"}) {
			t.Fatalf("activate before b acked: %v", err)
		}
		s, _ := r.Snapshot(ctx, topo)
		if s.Pending == nil || s.Pending.Number != 2 || !reflect.DeepEqual(s.Pending.Acked, []string{"a"}) || s.Active.Number != 1 {
			t.Fatalf("snapshot during freeze: active %+v pending %+v", s.Active, s.Pending)
		}
		wantErr(t, "ack of a non-pending epoch", r.AckFreeze(ctx, b.MemberRef, 1), ErrEpochState)
		must(t, r.AckFreeze(ctx, b.MemberRef, e2))
		must(t, r.Activate(ctx, topo, e2))
		must(t, r.Activate(ctx, topo, e2))
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.3")
		wantErr(t, "claim under the retired epoch", err, ErrEpochMoved)
		if _, err := r.Claim(ctx, b.MemberRef, 2, "0.3"); err != nil {
			t.Fatal(err)
		}
		s, _ = r.Snapshot(ctx, topo)
		if s.Pending != nil || s.Active.Number != 2 || s.Active.Shards != 4 {
			t.Fatalf("after activation: active %+v pending %+v", s.Active, s.Pending)
		}

		// Abort: a pending epoch is retired, the active one cannot be.
		e3, err := r.CreatePending(ctx, topo, 1, 1)
		must(t, err)
		must(t, r.Retire(ctx, topo, e3))
		wantErr(t, "retire the active epoch", r.Retire(ctx, topo, 2), ErrEpochState)
		wantErr(t, "activate a retired epoch", r.Activate(ctx, topo, e3), ErrEpochState)
		if _, err := r.Claim(ctx, b.MemberRef, 2, "0.2"); err != nil {
			t.Fatalf("claim after abort: %v", err)
		}
	})
}

func TestFenceBlocksClaimsAndGraceFollowsTheLift(t *testing.T) { // checks P5
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		_, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		must(t, r.Fence(ctx, b.MemberRef, 1))
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.1")
		wantErr(t, "claim while fenced", err, ErrFenced)
		// a lapses past its grace while b is fenced.
		for i := 0; i < 5; i++ {
			must(t, r.ShiftClock(ctx, topo, 20*time.Second))
			_, err := r.Renew(ctx, b.MemberRef)
			must(t, err)
		}
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.0")
		wantErr(t, "adoption while fenced", err, ErrFenced)
		must(t, r.Unfence(ctx, b.MemberRef, 1))
		must(t, r.Unfence(ctx, b.MemberRef, 1)) // a repeat does not move the lift
		var he *HeldError
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.0")
		if !errors.As(err, &he) || he.Reason != HeldClaimerFenceGrace {
			t.Fatalf("adoption right after the lift: %v", err)
		}
		if _, err := r.Claim(ctx, b.MemberRef, 1, "0.1"); err != nil {
			t.Fatalf("free unit right after the lift: %v", err)
		}
		must(t, r.ShiftClock(ctx, topo, 20*time.Second))
		_, err = r.Renew(ctx, b.MemberRef)
		must(t, err)
		_, err = r.Claim(ctx, b.MemberRef, 1, "0.0")
		if !errors.As(err, &he) || he.Reason != HeldClaimerFenceGrace {
			t.Fatalf("adoption 20s after the lift: %v", err)
		}
		must(t, r.ShiftClock(ctx, topo, 10*time.Second))
		c, err := r.Claim(ctx, b.MemberRef, 1, "0.0")
		must(t, err)
		if !c.Adopted {
			t.Fatalf("claim %+v", c)
		}
	})
}

func TestHandoverSettlesByTheTargetsClaimOrARelease(t *testing.T) { // checks P1, P6
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		c, _ := r.Join(ctx, topo, "c")
		u0, _ := r.Claim(ctx, a.MemberRef, 1, "0.0")
		u1, _ := r.Claim(ctx, a.MemberRef, 1, "0.1")
		u2, _ := r.Claim(ctx, a.MemberRef, 1, "0.2")
		wantErr(t, "handover to self", r.Handover(ctx, u0.Token, "a"), ErrInvalid)
		must(t, r.Handover(ctx, u0.Token, "b"))
		must(t, r.Handover(ctx, u0.Token, "b"))
		s, _ := r.Snapshot(ctx, topo)
		if m := s.Member("a"); m.Holds != 3 || m.Handovers != 1 || s.Counts.Handover != 1 || s.Counts.Held != 2 {
			t.Fatalf("a during handover: %+v counts %+v", m, s.Counts)
		}
		var he *HeldError
		if _, err := r.Claim(ctx, c.MemberRef, 1, "0.0"); !errors.As(err, &he) || he.Reason != HeldHandoverToOther {
			t.Fatalf("c claims a unit handed to b: %v", err)
		}
		cb, err := r.Claim(ctx, b.MemberRef, 1, "0.0")
		must(t, err)
		if !cb.Settled || cb.From != "a" || cb.Epoch != 2 {
			t.Fatalf("b settles: %+v", cb)
		}
		wantErr(t, "a writes after settlement", r.Checkpoint(ctx, u0.Token, 1), ErrStaleEpoch)
		wantErr(t, "a releases after settlement", r.Release(ctx, u0.Token), ErrStaleEpoch)

		must(t, r.Handover(ctx, u1.Token, ""))
		cc, err := r.Claim(ctx, c.MemberRef, 1, "0.1")
		must(t, err)
		if !cc.Settled {
			t.Fatalf("c settles an open handover: %+v", cc)
		}
		must(t, r.Handover(ctx, u2.Token, "b"))
		must(t, r.Release(ctx, u2.Token))
		cl, _ := r.Claims(ctx, topo)
		if cl[2].State != StateFree || cl[2].HandoverTo != "" {
			t.Fatalf("release settles the intent: %+v", cl[2])
		}
	})
}

func TestConfirmOwnedReportsMovesAndRehomesAfterRejoin(t *testing.T) { // checks P1
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 8)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		expected := map[string]int64{}
		for _, u := range []string{"0.0", "0.1", "0.2", "0.3"} {
			c, err := r.Claim(ctx, a.MemberRef, 1, u)
			must(t, err)
			expected[u] = c.Epoch
		}
		cb, _ := r.Claim(ctx, b.MemberRef, 1, "0.7")
		// 0.1 handed to b and taken; 0.2 released; 0.3 in handover.
		must(t, r.Handover(ctx, Token{Topology: topo, Unit: "0.1", Member: "a", Epoch: 1}, "b"))
		_, err := r.Claim(ctx, b.MemberRef, 1, "0.1")
		must(t, err)
		must(t, r.Release(ctx, Token{Topology: topo, Unit: "0.2", Member: "a", Epoch: 1}))
		must(t, r.Handover(ctx, Token{Topology: topo, Unit: "0.3", Member: "a", Epoch: 1}, ""))
		expected["0.9"] = 4 // never claimed

		conf, err := r.ConfirmOwned(ctx, a.MemberRef, expected)
		must(t, err)
		wantHeld := map[string]Token{"0.0": {Topology: topo, Unit: "0.0", Member: "a", Epoch: 1}, "0.3": {Topology: topo, Unit: "0.3", Member: "a", Epoch: 1}}
		if !reflect.DeepEqual(conf.Held, wantHeld) || !reflect.DeepEqual(conf.Handover, []string{"0.3"}) {
			t.Fatalf("held %+v handover %v", conf.Held, conf.Handover)
		}
		wantMoved := []Moved{
			{Unit: "0.1", Expected: 1, Owner: "b", Epoch: 2, State: StateHeld},
			{Unit: "0.2", Expected: 1, Owner: "", Epoch: 1, State: StateFree},
			{Unit: "0.9", Expected: 4},
		}
		if !reflect.DeepEqual(conf.Moved, wantMoved) {
			t.Fatalf("moved %+v", conf.Moved)
		}

		// a rejoins: its claims stay judged by its new lease, its old tokens
		// are refused, and once the old incarnation's lease and the grace
		// have passed, ConfirmOwned re-homes them at epoch+1.
		a2, _ := r.Join(ctx, topo, "a")
		var se *StaleEpochError
		if err := r.Checkpoint(ctx, Token{Topology: topo, Unit: "0.0", Member: "a", Epoch: 1}, 1); !errors.As(err, &se) || se.Reason != StaleLease {
			t.Fatalf("old incarnation's write: %v", err)
		}
		if _, err := r.Claim(ctx, b.MemberRef, 1, "0.0"); !errors.Is(err, ErrHeld) {
			t.Fatalf("b adopts a rejoined member's unit: %v", err)
		}
		_, err = r.ConfirmOwned(ctx, a.MemberRef, nil)
		wantErr(t, "confirm by the old incarnation", err, ErrStaleIncarnation)
		conf, err = r.ConfirmOwned(ctx, a2.MemberRef, map[string]int64{"0.0": 1})
		must(t, err)
		if len(conf.Held) != 0 || len(conf.Moved) != 0 || !reflect.DeepEqual(conf.Waiting, []string{"0.0", "0.3"}) {
			t.Fatalf("right after the rejoin: %+v", conf)
		}
		must(t, r.ShiftClock(ctx, topo, 50*time.Second))
		for _, m := range []MemberRef{a2.MemberRef, b.MemberRef} {
			_, err := r.Renew(ctx, m)
			must(t, err)
		}
		must(t, r.ShiftClock(ctx, topo, 41*time.Second)) // the old lease expired 31s ago, grace 30s
		conf, err = r.ConfirmOwned(ctx, a2.MemberRef, map[string]int64{"0.0": 1})
		must(t, err)
		if got := conf.Held["0.0"].Epoch; got != 2 || len(conf.Held) != 2 || len(conf.Moved) != 0 || len(conf.Waiting) != 0 {
			t.Fatalf("after rejoin and grace: %+v", conf)
		}
		// A lost reply: confirming again with the old epochs reports the
		// current ones, without another bump.
		conf2, err := r.ConfirmOwned(ctx, a2.MemberRef, map[string]int64{"0.0": 1})
		must(t, err)
		if !reflect.DeepEqual(conf2.Held, conf.Held) {
			t.Fatalf("repeat confirm %+v, first %+v", conf2.Held, conf.Held)
		}
		must(t, r.Checkpoint(ctx, conf.Held["0.0"], 5))
		wantErr(t, "pre-rejoin token", r.CheckToken(ctx, Token{Topology: topo, Unit: "0.0", Member: "a", Epoch: 1}), ErrStaleEpoch)
		must(t, r.CheckToken(ctx, cb.Token))

		// An expired member cannot confirm.
		must(t, r.ShiftClock(ctx, topo, 2*time.Minute))
		_, err = r.ConfirmOwned(ctx, a2.MemberRef, nil)
		wantErr(t, "confirm after expiry", err, ErrLeaseExpired)
	})
}

// Workers read the spec's naming and drain timeout from the registry, with
// their lease and every snapshot, as they read the lease parameters.
func TestWorkerSettingsTravelWithTheLeaseAndTheSnapshot(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		p := testParams
		p.Worker = WorkerSettings{SubjectPrefix: "orders", ConsumerName: "sink", DrainTimeout: 42 * time.Second}
		topo := newTopology(t, r, p, 1, 1)
		l, err := r.Join(ctx, topo, "a")
		must(t, err)
		if l.Params != p {
			t.Fatalf("lease params %+v, want %+v", l.Params, p)
		}
		p.Worker.DrainTimeout = time.Minute
		must(t, r.EnsureTopology(ctx, topo, p))
		s, err := r.Snapshot(ctx, topo)
		must(t, err)
		l, err = r.Renew(ctx, l.MemberRef)
		must(t, err)
		if s.Params != p || l.Params != p {
			t.Fatalf("after a spec change: snapshot %+v, renewal %+v, want %+v", s.Params, l.Params, p)
		}
	})
}

func TestSnapshotCarriesResetPermissionAndUnknownTopologiesFail(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 1)
		s, err := r.Snapshot(ctx, topo)
		must(t, err)
		if s.Reset.Published || s.Params != testParams || s.Active == nil || s.Now.IsZero() {
			t.Fatalf("fresh snapshot %+v", s)
		}
		servers := map[string]string{"n1": "2.14.9", "n2": "2.14.9", "leaf-a": ""}
		must(t, r.PublishResetPermission(ctx, topo, ResetPermission{Allowed: true, CensusAge: 3 * time.Second, Reason: "all at 2.14.9",
			Floor: "2.14.0", Servers: servers}))
		servers["n1"] = "changed by the caller afterwards"
		must(t, r.ShiftClock(ctx, topo, 10*time.Second))
		s, err = r.Snapshot(ctx, topo)
		must(t, err)
		if !s.Reset.Published || !s.Reset.Allowed || s.Reset.Reason != "all at 2.14.9" ||
			s.Reset.CensusAge < 13*time.Second || s.Reset.CensusAge > 15*time.Second {
			t.Fatalf("reset permission %+v", s.Reset)
		}
		// A worker checks the consumer's servers against the census at the
		// moment it would RESET (P4): the detail comes back as published.
		if want := map[string]string{"n1": "2.14.9", "n2": "2.14.9", "leaf-a": ""}; s.Reset.Floor != "2.14.0" ||
			!reflect.DeepEqual(s.Reset.Servers, want) {
			t.Fatalf("census detail: floor %q servers %v", s.Reset.Floor, s.Reset.Servers)
		}
		must(t, r.PublishResetPermission(ctx, topo, ResetPermission{Reason: "census failed"}))
		s, err = r.Snapshot(ctx, topo)
		must(t, err)
		if s.Reset.Allowed || s.Reset.Floor != "" || s.Reset.Servers != nil {
			t.Fatalf("a later verdict without detail: %+v", s.Reset)
		}
		_, err = r.Snapshot(ctx, "ns/none")
		wantErr(t, "snapshot", err, ErrUnknownTopology)
		_, err = r.Join(ctx, "ns/none", "a")
		wantErr(t, "join", err, ErrUnknownTopology)
		_, err = r.Renew(ctx, MemberRef{"ns/none", "a", 1})
		wantErr(t, "renew", err, ErrUnknownTopology)
		_, err = r.Claims(ctx, "ns/none")
		wantErr(t, "claims", err, ErrUnknownTopology)
		wantErr(t, "check token", r.CheckToken(ctx, Token{Topology: "ns/none", Unit: "0.0", Member: "a", Epoch: 1}), ErrUnknownTopology)
		wantErr(t, "bad params", r.EnsureTopology(ctx, "ns/bad", Params{Grace: time.Second}), ErrInvalid)
	})
}

func TestEpochFenceRefusesOlderEpochs(t *testing.T) { // checks P1
	var f EpochFence
	tok := func(member string, epoch int64) Token {
		return Token{Topology: "ns/t", Unit: "0.1", Member: member, Epoch: epoch}
	}
	steps := []struct {
		tok Token
		ok  bool
	}{
		{tok("a", 1), true}, {tok("a", 1), true}, {tok("b", 2), true},
		{tok("a", 1), false}, {tok("c", 2), false}, {tok("a", 3), true}, {tok("b", 2), false},
	}
	for i, s := range steps {
		if err := f.Admit(s.tok); (err == nil) != s.ok {
			t.Fatalf("step %d: Admit(%v) = %v, want ok=%v", i, s.tok, err, s.ok)
		}
	}
	if err := f.Admit(Token{Topology: "ns/t", Unit: "0.2", Member: "a", Epoch: 1}); err != nil {
		t.Fatalf("another unit: %v", err)
	}
}

func TestDrainRequestSurvivesRejoinsUntilCleared(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		_, err := r.Join(ctx, topo, "a")
		must(t, err)
		b, err := r.Join(ctx, topo, "b")
		must(t, err)
		wantErr(t, "clearing the drain of a stranger", r.SetDraining(ctx, topo, "nobody", false), ErrNotMember)
		must(t, r.SetDraining(ctx, topo, "b", true))

		slots := func() []int {
			s, err := r.Snapshot(ctx, topo)
			must(t, err)
			if m := s.Member("b"); m == nil {
				t.Fatal("b missing")
			}
			return s.PlacementSlots()
		}
		if got := slots(); len(got) != 1 || got[0] != 0 {
			t.Fatalf("placement slots while b drains: %v, want [0]", got)
		}
		// The restarting pod rejoins under the same name: still draining.
		b2, err := r.Join(ctx, topo, "b")
		must(t, err)
		if b2.Slot != b.Slot {
			t.Fatalf("b rejoined at slot %d, want its sticky slot %d", b2.Slot, b.Slot)
		}
		if got := slots(); len(got) != 1 {
			t.Fatalf("drain lost on rejoin: placement slots %v", got)
		}
		must(t, r.SetDraining(ctx, topo, "b", false))
		if got := slots(); len(got) != 2 {
			t.Fatalf("placement slots after clearing: %v, want both", got)
		}
	})
}

// A drain request for a name that never joined is kept, so the operator
// can mark a pod before deleting it whether or not its worker joined yet:
// a process joining under that name afterwards claims nothing, and the
// placeholder takes no slot and is not live.
func TestDrainRequestForANameNotJoinedYetHoldsItsFirstJoin(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		must(t, r.SetDraining(ctx, topo, "late", true))
		must(t, r.SetDraining(ctx, topo, "late", true)) // idempotent
		s, err := r.Snapshot(ctx, topo)
		must(t, err)
		m := s.Member("late")
		if m == nil || m.Live || !m.Draining || m.Slot != -1 || m.Holds != 0 {
			t.Fatalf("placeholder %+v, want a member row that is draining, not live, with no slot", m)
		}
		if got := s.PlacementSlots(); len(got) != 1 || got[0] != a.Slot {
			t.Fatalf("placement slots %v, want only a's", got)
		}
		late, err := r.Join(ctx, topo, "late")
		must(t, err)
		if late.Incarnation <= a.Incarnation {
			t.Fatalf("late joined as incarnation %d, want after a's %d", late.Incarnation, a.Incarnation)
		}
		_, err = r.Claim(ctx, late.MemberRef, 1, "0.0")
		wantErr(t, "claim by a member drained before it joined", err, ErrDraining)
		must(t, r.SetDraining(ctx, topo, "late", false))
		if _, err := r.Claim(ctx, late.MemberRef, 1, "0.0"); err != nil {
			t.Fatalf("claim once the drain request is cleared: %v", err)
		}
		wantErr(t, "drain of an unknown topology", r.SetDraining(ctx, "no/such", "x", true), ErrUnknownTopology)
	})
}
