package poolctl

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The append-only history is the evidence the history checker judges
// deliveries against: every claim transition in order, none for a
// checkpoint, on the wall clock. checks P1
func TestHistoryRecordsEveryClaimTransitionInOrder(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		h := r.(HistoryReader)
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		c1, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		must(t, r.Checkpoint(ctx, c1.Token, 10))
		must(t, r.Handover(ctx, c1.Token, "b"))
		c2, err := r.Claim(ctx, b.MemberRef, 1, "0.0") // settles
		must(t, err)
		for i := 0; i < 5; i++ { // b lapses; a stays live
			must(t, r.ShiftClock(ctx, topo, 20*time.Second))
			_, err := r.Renew(ctx, a.MemberRef)
			must(t, err)
		}
		c3, err := r.Claim(ctx, a.MemberRef, 1, "0.0") // adopts
		must(t, err)
		a2, _ := r.Join(ctx, topo, "a")
		for i := 0; i < 5; i++ { // the old incarnation's lease and the grace pass
			must(t, r.ShiftClock(ctx, topo, 20*time.Second))
			_, err := r.Renew(ctx, a2.MemberRef)
			must(t, err)
		}
		c4, err := r.Claim(ctx, a2.MemberRef, 1, "0.0") // re-homes
		must(t, err)
		must(t, r.Checkpoint(ctx, c4.Token, 20))
		must(t, r.Release(ctx, c4.Token))

		got, err := h.ClaimHistory(ctx, topo)
		must(t, err)
		want := []string{
			fmt.Sprintf("claim a#%d@1 held under 1", a.Incarnation),
			fmt.Sprintf("handover a#%d@1 handover under 0", a.Incarnation),
			fmt.Sprintf("settle b#%d@%d held under 1", b.Incarnation, c2.Epoch),
			fmt.Sprintf("adopt a#%d@%d held under 1", a.Incarnation, c3.Epoch),
			fmt.Sprintf("rehome a#%d@%d held under 1", a2.Incarnation, c4.Epoch),
			fmt.Sprintf("release #0@%d free under 0", c4.Epoch),
		}
		if len(got) != len(want) {
			t.Fatalf("claim history %+v, want %v", got, want)
		}
		for i, e := range got {
			if s := fmt.Sprintf("%s %s#%d@%d %s under %d", e.Op, e.Owner, e.Incarnation, e.Epoch, e.State, e.Under); s != want[i] || e.Unit != "0.0" {
				t.Fatalf("event %d: %s, want %s", i, s, want[i])
			}
			if i > 0 && e.At.Before(got[i-1].At) {
				t.Fatalf("event %d at %v, before event %d at %v", i, e.At, i-1, got[i-1].At)
			}
			// The history's clock is the wall clock: the test's shifts of the
			// registry clock (200s so far) do not show. (The twin's test
			// clock rises by at least 1µs a call, so it may run a few µs
			// ahead of the wall clock.)
			if d := time.Since(e.At); d < -time.Second || d > time.Minute {
				t.Fatalf("event %d at %v, %v from the wall clock", i, e.At, d)
			}
		}
	})
}

func TestLeaseAndEpochHistoryAreOnTheWallClock(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		h := r.(HistoryReader)
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		must(t, r.ShiftClock(ctx, topo, time.Hour))
		_, err := r.Renew(ctx, a.MemberRef)
		wantErr(t, "renew an hour later", err, ErrLeaseExpired)
		a2, _ := r.Join(ctx, topo, "a")
		_, err = r.Renew(ctx, a2.MemberRef)
		must(t, err)
		must(t, r.Leave(ctx, a2.MemberRef))
		leases, err := h.LeaseHistory(ctx, topo)
		must(t, err)
		if len(leases) != 4 {
			t.Fatalf("lease history %+v, want join, rejoin, renew, leave", leases)
		}
		for i, e := range leases {
			wantInc, wantLeft := a2.Incarnation, i == 3
			if i == 0 {
				wantInc = a.Incarnation
			}
			if e.Member != "a" || e.Incarnation != wantInc || e.Left != wantLeft {
				t.Fatalf("lease event %d: %+v", i, e)
			}
			if ttl := e.ExpiresAt.Sub(e.At); i < 3 && (ttl < testParams.LeaseTTL-time.Second || ttl > testParams.LeaseTTL) {
				t.Fatalf("lease event %d expires %v after it, want the TTL on one clock", i, ttl)
			}
		}

		e2, err := r.CreatePending(ctx, topo, 1, 8)
		must(t, err)
		must(t, r.Activate(ctx, topo, e2))
		e3, err := r.CreatePending(ctx, topo, 1, 2)
		must(t, err)
		must(t, r.Retire(ctx, topo, e3))
		spans, err := h.EpochHistory(ctx, topo)
		must(t, err)
		if len(spans) != 3 {
			t.Fatalf("epoch history %+v", spans)
		}
		s1, s2, s3 := spans[0], spans[1], spans[2]
		switch {
		case s1.State != EpochRetired || s1.ActivatedAt.IsZero() || s1.RetiredAt.Before(s1.ActivatedAt):
			t.Fatalf("epoch 1: %+v", s1)
		case s2.State != EpochActive || s2.Shards != 8 || s2.ActivatedAt.Before(s1.RetiredAt) || !s2.RetiredAt.IsZero():
			t.Fatalf("epoch 2: %+v (epoch 1 retired at %v)", s2, s1.RetiredAt)
		case s3.State != EpochRetired || !s3.ActivatedAt.IsZero() || s3.RetiredAt.IsZero():
			t.Fatalf("abandoned epoch 3: %+v", s3)
		case time.Since(s2.ActivatedAt) > time.Minute:
			t.Fatalf("epoch 2 activated at %v: not the wall clock", s2.ActivatedAt)
		}
	})
}

func TestPruneHistoryDeletesOnlyOlderEvents(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		h := r.(HistoryReader)
		topo := newTopology(t, r, testParams, 1, 8)
		a, _ := r.Join(ctx, topo, "a")
		for i := 0; i < 8; i++ {
			c, err := r.Claim(ctx, a.MemberRef, 1, fmt.Sprintf("0.%d", i))
			must(t, err)
			must(t, r.Release(ctx, c.Token))
		}
		before, err := h.ClaimHistory(ctx, topo)
		must(t, err)
		leasesBefore, err := h.LeaseHistory(ctx, topo)
		must(t, err)
		cut := before[len(before)/2].At
		must(t, h.PruneHistory(ctx, topo, cut))
		after, err := h.ClaimHistory(ctx, topo)
		must(t, err)
		var want []ClaimEvent
		for _, e := range before {
			if !e.At.Before(cut) {
				want = append(want, e)
			}
		}
		if len(after) != len(want) || len(after) == len(before) || after[0] != want[0] {
			t.Fatalf("after pruning before %v: %d events (first %+v), want %d of %d", cut, len(after), after[0], len(want), len(before))
		}
		leases, err := h.LeaseHistory(ctx, topo)
		must(t, err)
		if len(leases) != 0 || len(leasesBefore) != 1 {
			t.Fatalf("lease events before the cut survive: %+v (had %+v)", leases, leasesBefore)
		}
	})
}

// The lease history records every fence and unfence with when the fence
// last lifted, on the wall clock, so the history checker can judge P5's
// "never adopts while fenced nor within the grace after its fence lifts"
// from the registry's own history. A no-op Fence (an older generation)
// records nothing. checks P5
func TestLeaseHistoryRecordsFencesAndTheirLift(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		h := r.(HistoryReader)
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, time.Hour)) // the lift must not carry the test offset
		must(t, r.Fence(ctx, a.MemberRef, 2))
		must(t, r.Fence(ctx, a.MemberRef, 1)) // older generation: no-op
		must(t, r.Unfence(ctx, a.MemberRef, 2))
		leases, err := h.LeaseHistory(ctx, topo)
		must(t, err)
		if len(leases) != 3 {
			t.Fatalf("lease history %+v, want join, fence, unfence", leases)
		}
		join, fence, unfence := leases[0], leases[1], leases[2]
		switch {
		case join.Fenced || !join.FenceLiftedAt.IsZero():
			t.Fatalf("join %+v: fenced or lifted", join)
		// The shift moved the registry clock an hour on: on the wall
		// clock the unchanged expiry lies an hour earlier.
		case !fence.Fenced || !fence.FenceLiftedAt.IsZero() || !fence.ExpiresAt.Equal(join.ExpiresAt.Add(-time.Hour)):
			t.Fatalf("fence %+v after join %+v", fence, join)
		case unfence.Fenced || unfence.FenceLiftedAt.Before(fence.At) || unfence.FenceLiftedAt.After(unfence.At.Add(time.Second)):
			t.Fatalf("unfence %+v after fence %+v: want the lift between them on the wall clock", unfence, fence)
		}
	})
}
