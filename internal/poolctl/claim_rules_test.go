package poolctl

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Defect 7: a member the operator is draining claims nothing.
func TestDrainingMemberClaimsNothing(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		must(t, r.SetDraining(ctx, topo, "a", true))
		_, err = r.Claim(ctx, a.MemberRef, 1, "0.0")
		wantErr(t, "claim while draining", err, ErrDraining)
		outs, err := r.ClaimMany(ctx, a.MemberRef, 1, []string{"0.1", "0.2"})
		must(t, err)
		for _, o := range outs {
			wantErr(t, "batch claim while draining", o.Err, ErrDraining)
		}
		if IsConnectionError(outs[0].Err) {
			t.Fatalf("ErrDraining reads as a connection error: %v", outs[0].Err)
		}
		must(t, r.SetDraining(ctx, topo, "a", false))
		_, err = r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
	})
}

// Defect 3: after a shrink, a unit outside the new shape that still holds
// rows can be drained by someone once it is retiring; before, it cannot be
// claimed at all. checks P2, P5
func TestRetiringUnitsCanBeDrainedAfterAShrink(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		x, err := r.Join(ctx, topo, "x")
		must(t, err)
		y, err := r.Join(ctx, topo, "y")
		must(t, err)
		_, err = r.Claim(ctx, x.MemberRef, 1, "0.3")
		must(t, err)
		c2, err := r.Claim(ctx, x.MemberRef, 1, "0.2")
		must(t, err)
		e2, err := r.CreatePending(ctx, topo, 1, 2)
		must(t, err)
		must(t, r.AckFreeze(ctx, x.MemberRef, e2))
		must(t, r.AckFreeze(ctx, y.MemberRef, e2))
		must(t, r.Activate(ctx, topo, e2))
		must(t, r.Release(ctx, c2.Token))

		// x's lease lapses (60s); y stays live. Within the grace (30s):
		for i := 0; i < 4; i++ {
			must(t, r.ShiftClock(ctx, topo, 20*time.Second))
			_, err := r.Renew(ctx, y.MemberRef)
			must(t, err)
		}
		for _, u := range []string{"0.2", "0.3", "0.5"} {
			_, err = r.Claim(ctx, y.MemberRef, e2, u)
			wantErr(t, "claim of "+u+" outside the shape, not retiring", err, ErrUnitOutOfRange)
		}
		must(t, r.SetRetiring(ctx, topo, []string{"0.3", "0.2", "0.5", "0.2"}))
		snap, err := r.Snapshot(ctx, topo)
		must(t, err)
		if want := []string{"0.2", "0.3", "0.5"}; !equalStrings(snap.Retiring, want) {
			t.Fatalf("retiring set %v, want %v", snap.Retiring, want)
		}
		wantErr(t, "a bad retiring unit", r.SetRetiring(ctx, topo, []string{"x"}), ErrInvalid)
		var he *HeldError
		if _, err := r.Claim(ctx, y.MemberRef, e2, "0.3"); !errors.As(err, &he) || he.Reason != HeldOwnerGrace {
			t.Fatalf("claim of retiring 0.3 within x's grace: %v", err)
		}
		// A free retiring unit is claimable at once.
		free, err := r.Claim(ctx, y.MemberRef, e2, "0.2")
		must(t, err)
		if free.Adopted || free.Epoch != c2.Epoch+1 {
			t.Fatalf("claim of free retiring 0.2: %+v", free)
		}
		must(t, r.ShiftClock(ctx, topo, 20*time.Second)) // past the grace

		adopt, err := r.Claim(ctx, y.MemberRef, e2, "0.3")
		must(t, err)
		if !adopt.Adopted || adopt.From != "x" {
			t.Fatalf("claim of retiring 0.3 held by lapsed x: %+v", adopt)
		}
		if _, err := r.Claim(ctx, y.MemberRef, e2, "0.5"); err != nil {
			t.Fatalf("claim of a never-claimed retiring unit: %v", err)
		}
		// Leaving the set stops new claims, not the ones held.
		must(t, r.SetRetiring(ctx, topo, nil))
		must(t, r.CheckToken(ctx, adopt.Token))
		must(t, r.Release(ctx, free.Token))
		_, err = r.Claim(ctx, y.MemberRef, e2, "0.2")
		wantErr(t, "claim after the unit left the retiring set", err, ErrUnitOutOfRange)
	})
}

// Defect 3, the grace part: a retiring unit is adoptable only under P5.
func TestRetiringUnitOfALiveOwnerIsNotAdopted(t *testing.T) { // checks P5
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		x, _ := r.Join(ctx, topo, "x")
		y, _ := r.Join(ctx, topo, "y")
		_, err := r.Claim(ctx, x.MemberRef, 1, "0.3")
		must(t, err)
		e2, _ := r.CreatePending(ctx, topo, 1, 2)
		must(t, r.AckFreeze(ctx, x.MemberRef, e2))
		must(t, r.AckFreeze(ctx, y.MemberRef, e2))
		must(t, r.Activate(ctx, topo, e2))
		must(t, r.SetRetiring(ctx, topo, []string{"0.3"}))
		var he *HeldError
		if _, err := r.Claim(ctx, y.MemberRef, e2, "0.3"); !errors.As(err, &he) || he.Reason != HeldOwnerLive {
			t.Fatalf("claim of a live owner's retiring unit: %v", err)
		}
	})
}

// Defect 9: the reply to an adopting Claim is lost; the repeat must still
// say it was an adoption, and from whom, or the new owner never lifts the
// old owner's pin.
func TestRepeatedClaimReportsTheDecisionItRepeats(t *testing.T) { // checks P5
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		_, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		for i := 0; i < 5; i++ {
			must(t, r.ShiftClock(ctx, topo, 20*time.Second))
			_, err := r.Renew(ctx, b.MemberRef)
			must(t, err)
		}
		first, err := r.Claim(ctx, b.MemberRef, 1, "0.0")
		must(t, err)
		if !first.Adopted || first.From != "a" {
			t.Fatalf("adoption %+v", first)
		}
		repeat, err := r.Claim(ctx, b.MemberRef, 1, "0.0")
		must(t, err)
		if repeat.Token != first.Token || !repeat.Adopted || repeat.From != "a" || repeat.Rehomed {
			t.Fatalf("repeat after a lost reply %+v, first %+v", repeat, first)
		}
		outs, err := r.ClaimMany(ctx, b.MemberRef, 1, []string{"0.0"})
		must(t, err)
		if c := outs[0].Claim; !c.Adopted || c.From != "a" {
			t.Fatalf("batch repeat %+v", outs[0])
		}
		// Any other transition clears the record.
		must(t, r.Handover(ctx, first.Token, ""))
		again, err := r.Claim(ctx, b.MemberRef, 1, "0.0")
		must(t, err)
		if again.Adopted || again.From != "" {
			t.Fatalf("repeat after a handover still reports the adoption: %+v", again)
		}
	})
}

// The issue's "a second live process with the same pod name keeps pulling
// for up to a TTL": a crash-restarted member may not re-home its units
// until the old incarnation's lease and the grace have passed. checks P1, P5
func TestCrashRestartRehomesOnlyAfterTheOldLeaseAndGrace(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		old, err := r.Join(ctx, topo, "a")
		must(t, err)
		held, err := r.Claim(ctx, old.MemberRef, 1, "0.0")
		must(t, err)
		_, err = r.Claim(ctx, old.MemberRef, 1, "0.1")
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, 10*time.Second))
		// The process restarts and joins while its old lease is live.
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		oldExpiry := old.ExpiresAt
		_, err = r.Claim(ctx, a.MemberRef, 1, "0.0")
		var he *HeldError
		if !errors.As(err, &he) || he.Reason != HeldPreviousIncarnation || he.Owner != "a" ||
			!he.AdoptableAt.Equal(oldExpiry.Add(testParams.Grace)) {
			t.Fatalf("re-home while the old lease is live: %v (old expiry %v)", err, oldExpiry)
		}
		conf, err := r.ConfirmOwned(ctx, a.MemberRef, map[string]int64{"0.0": 1, "0.1": 1})
		must(t, err)
		if len(conf.Held) != 0 || len(conf.Moved) != 0 || !equalStrings(conf.Waiting, []string{"0.0", "0.1"}) {
			t.Fatalf("confirm while the old lease is live: %+v", conf)
		}
		// The old expiry plus the grace is 80s away; keep a renewed.
		must(t, r.ShiftClock(ctx, topo, 45*time.Second))
		_, err = r.Renew(ctx, a.MemberRef)
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, 34*time.Second)) // 1s short
		if _, err := r.Claim(ctx, a.MemberRef, 1, "0.0"); !errors.As(err, &he) || he.Reason != HeldPreviousIncarnation {
			t.Fatalf("re-home 1s before the grace ends: %v", err)
		}
		must(t, r.ShiftClock(ctx, topo, time.Second))
		c, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		if !c.Rehomed || c.Adopted || c.From != "a" || c.Epoch != held.Epoch+1 {
			t.Fatalf("re-home after the grace: %+v", c)
		}
		wantErr(t, "old incarnation's token", r.CheckToken(ctx, held.Token), ErrStaleEpoch)
		conf, err = r.ConfirmOwned(ctx, a.MemberRef, nil)
		must(t, err)
		if len(conf.Held) != 2 || len(conf.Waiting) != 0 || conf.Held["0.1"].Epoch != 2 {
			t.Fatalf("confirm after the grace: %+v", conf)
		}
	})
}

// The registry-outage recovery path: a member whose lease lapsed long ago
// rejoins and re-homes everything at once, in ConfirmOwned's one statement.
func TestRejoinAfterALongLapseRehomesAtOnce(t *testing.T) { // checks P1
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		old, _ := r.Join(ctx, topo, "a")
		for _, u := range []string{"0.0", "0.1"} {
			_, err := r.Claim(ctx, old.MemberRef, 1, u)
			must(t, err)
		}
		must(t, r.ShiftClock(ctx, topo, 5*time.Minute))
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		conf, err := r.ConfirmOwned(ctx, a.MemberRef, map[string]int64{"0.0": 1, "0.1": 1})
		must(t, err)
		if len(conf.Held) != 2 || len(conf.Waiting) != 0 || conf.Held["0.0"].Epoch != 2 {
			t.Fatalf("confirm after a long lapse: %+v", conf)
		}
	})
}

// The "the first lease has no fence margin": Join and Renew carry
// the topology's parameters.
func TestEveryLeaseCarriesTheParameters(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 1)
		l, err := r.Join(ctx, topo, "a")
		must(t, err)
		if l.Params != testParams {
			t.Fatalf("join lease params %+v, want %+v", l.Params, testParams)
		}
		l, err = r.Renew(ctx, l.MemberRef)
		must(t, err)
		if l.Params != testParams {
			t.Fatalf("renewed lease params %+v, want %+v", l.Params, testParams)
		}
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAdoptionWaitsForTheOwnersLastPossibleLease: after a Recover the
// owner's lease row ends at Recover's instant while a renewal only the
// lost primary saw may run until that instant + TTL, kept as the earlier
// incarnations' expiry; an adoption waits for the later of both plus the
// grace. checks P5
func TestAdoptionWaitsForTheOwnersLastPossibleLease(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	grace := time.Second
	in := func(prev time.Time) claimInput {
		return claimInput{Now: now, Grace: grace, Claimer: &memberRow{Name: "b", Incarnation: 2, LeaseExpiresAt: now.Add(time.Minute)},
			Row:   &claimRow{Unit: "0.0", Owner: "a", OwnerIncarnation: 1, Epoch: 3, State: StateHeld},
			Owner: &memberRow{Name: "a", Incarnation: 1, LeaseExpiresAt: now.Add(-10 * time.Second), PrevLeaseExpiresAt: prev}}
	}
	tests := []struct {
		name    string
		prev    time.Time
		adopted bool
		at      time.Time
	}{
		{"no earlier incarnation: the lapsed lease and the grace decide", time.Time{}, true, time.Time{}},
		{"a lease believed live beyond the row's", now.Add(2 * time.Second), false, now.Add(3 * time.Second)},
		{"inside the grace after it", now.Add(-500 * time.Millisecond), false, now.Add(500 * time.Millisecond)},
		{"past it and the grace", now.Add(-2 * time.Second), true, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := decideAdoption("0.0", in(tt.prev))
			var he *HeldError
			switch {
			case tt.adopted && (err != nil || !d.Adopted):
				t.Fatalf("decision %+v, %v; want adopted", d, err)
			case !tt.adopted && (!errors.As(err, &he) || !he.AdoptableAt.Equal(tt.at)):
				t.Fatalf("decision %+v, %v; want held, adoptable at %v", d, err, tt.at)
			}
		})
	}
}

// TestAUnitNobodyTookSinceARecoverWaitsForTheLostPrimarysLeases: a
// promoted standby may show a unit free (or never claimed) that the lost
// primary gave to a member whose lease only that primary renewed; until
// Recover's instant + TTL (RecoveredUntil) plus the grace nobody gets it.
// A unit decided since the Recover is judged as before. checks P5
func TestAUnitNobodyTookSinceARecoverWaitsForTheLostPrimarysLeases(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	grace := time.Second
	claimer := &memberRow{Name: "b", Incarnation: 1029, LeaseExpiresAt: now.Add(time.Minute)}
	active := &epochRow{Number: 5, Partitions: 2, Shards: 8, State: EpochActive}
	free := func(op claimOp) *claimRow { return &claimRow{Unit: "1.0", Epoch: 2000, State: StateFree, LastOp: op} }
	tests := []struct {
		name      string
		row       *claimRow
		recovered time.Time
		wantAt    time.Time // zero: claimed
	}{
		{"never recovered: a free row is claimed", free(lastRelease), time.Time{}, time.Time{}},
		{"a row Recover moved, inside the lost leases", free(lastRecover), now.Add(-500 * time.Millisecond), now.Add(500 * time.Millisecond)},
		{"a row Recover moved, inside the lease itself", free(lastRecover), now.Add(2 * time.Second), now.Add(3 * time.Second)},
		{"a row Recover moved, past the lost leases and the grace", free(lastRecover), now.Add(-2 * time.Second), time.Time{}},
		{"a floor row CreatePending added (no op)", free(""), now, now.Add(grace)},
		{"a unit without a row", nil, now, now.Add(grace)},
		{"a row released since the Recover", free(lastRelease), now, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := claimInput{Now: now, Grace: grace, Claimer: claimer, Active: active, Row: tt.row, RecoveredUntil: tt.recovered}
			d, err := decideClaim(MemberRef{Member: "b", Incarnation: 1029}, 5, "1.0", in)
			var he *HeldError
			switch {
			case tt.wantAt.IsZero() && (err != nil || d.Op != lastClaim):
				t.Fatalf("decision %+v, %v; want a claim", d, err)
			case !tt.wantAt.IsZero() && (!errors.As(err, &he) || he.Reason != HeldRecovered || !he.AdoptableAt.Equal(tt.wantAt)):
				t.Fatalf("decision %+v, %v; want held (%s) until %v", d, err, HeldRecovered, tt.wantAt)
			}
		})
	}
}
