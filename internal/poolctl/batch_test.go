package poolctl

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Issue 13: a tick's claims and releases go in batches, each unit decided
// by the same rules as a single Claim, each with its own outcome.
func TestClaimManyDecidesEachUnitByTheClaimRules(t *testing.T) { // checks P1, P2
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		b, _ := r.Join(ctx, topo, "b")
		held, err := r.Claim(ctx, b.MemberRef, 1, "0.1")
		must(t, err)
		free, err := r.Claim(ctx, b.MemberRef, 1, "0.2")
		must(t, err)
		must(t, r.Release(ctx, free.Token))

		units := []string{"0.3", "0.1", "0.2", "0.7", "x", "0.3", "0.0"}
		outs, err := r.ClaimMany(ctx, a.MemberRef, 1, units)
		must(t, err)
		want := []struct {
			err   error
			epoch int64
		}{{nil, 1}, {ErrHeld, 0}, {nil, free.Epoch + 1}, {ErrUnitOutOfRange, 0}, {ErrInvalid, 0}, {nil, 1}, {nil, 1}}
		if len(outs) != len(units) {
			t.Fatalf("%d outcomes for %d units", len(outs), len(units))
		}
		for i, o := range outs {
			if o.Unit != units[i] {
				t.Fatalf("outcome %d is for %s, want %s", i, o.Unit, units[i])
			}
			wantErr(t, "batch claim of "+o.Unit, o.Err, want[i].err)
			if o.Err == nil && (o.Claim.Epoch != want[i].epoch || o.Claim.Member != "a" || o.Claim.Unit != o.Unit) {
				t.Fatalf("outcome %d: %+v, want epoch %d", i, o, want[i].epoch)
			}
		}
		var he *HeldError
		if !errors.As(outs[1].Err, &he) || he.Owner != "b" || he.Epoch != held.Epoch {
			t.Fatalf("held unit's refusal: %v", outs[1].Err)
		}
		// A unit named twice gets the same outcome twice.
		if outs[0].Claim != outs[5].Claim {
			t.Fatalf("repeated unit: %+v and %+v", outs[0], outs[5])
		}
		// The whole batch fails only for what concerns all of it.
		_, err = r.ClaimMany(ctx, MemberRef{"ns/none", "a", 1}, 1, []string{"0.0"})
		wantErr(t, "batch in an unknown topology", err, ErrUnknownTopology)
		empty, err := r.ClaimMany(ctx, a.MemberRef, 1, nil)
		must(t, err)
		if len(empty) != 0 {
			t.Fatalf("empty batch: %+v", empty)
		}
		must(t, r.Fence(ctx, a.MemberRef, 1))
		outs, err = r.ClaimMany(ctx, a.MemberRef, 1, []string{"0.0", "0.3"})
		must(t, err)
		for _, o := range outs {
			wantErr(t, "batch claim while fenced", o.Err, ErrFenced)
		}
	})
}

func TestReleaseManyJudgesEachTokenOnItsOwn(t *testing.T) { // checks P1, P6
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, _ := r.Join(ctx, topo, "a")
		outs, err := r.ClaimMany(ctx, a.MemberRef, 1, []string{"0.0", "0.1", "0.2"})
		must(t, err)
		tok := func(i int) Token { return outs[i].Claim.Token }
		stale := tok(1)
		stale.Epoch++
		tokens := []Token{tok(0), stale, tok(2), tok(0), {Topology: topo, Unit: "0.3", Member: "a", Epoch: 1},
			{Topology: "ns/none", Unit: "0.0", Member: "a", Epoch: 1}}
		errs, err := r.ReleaseMany(ctx, tokens)
		must(t, err)
		want := []error{nil, ErrStaleEpoch, nil, nil, ErrStaleEpoch, ErrUnknownTopology}
		for i, e := range errs {
			wantErr(t, fmt.Sprintf("release of token %d (%s)", i, tokens[i]), e, want[i])
		}
		var se *StaleEpochError
		if !errors.As(errs[1], &se) || se.Reason != StaleMoved || se.Epoch != tok(1).Epoch {
			t.Fatalf("stale token's refusal: %v", errs[1])
		}
		if !errors.As(errs[4], &se) || se.Reason != StaleAbsent {
			t.Fatalf("never-claimed unit's refusal: %v", errs[4])
		}
		cl, err := r.Claims(ctx, topo)
		must(t, err)
		for _, c := range cl {
			if wantFree := c.Unit != "0.1"; (c.State == StateFree) != wantFree {
				t.Fatalf("after the batch release: %+v", cl)
			}
		}
		// Released rows keep their epochs: a new claim goes one above.
		again, err := r.Claim(ctx, a.MemberRef, 1, "0.0")
		must(t, err)
		if again.Epoch != tok(0).Epoch+1 {
			t.Fatalf("claim after release at epoch %d", again.Epoch)
		}
	})
}

// Concurrent batches over the same units, in different orders, neither
// deadlock nor give a unit two owners: both lock claim rows in unit order.
func TestConcurrentClaimBatchesDoNotDeadlock(t *testing.T) { // checks P1
	pg, _ := newPG(t)
	ctx := context.Background()
	const n = 64
	topo := newTopology(t, pg, testParams, 1, n)
	units := make([]string, n)
	for i := range units {
		units[i] = fmt.Sprintf("0.%d", i)
	}
	refs := make([]MemberRef, 4)
	for i := range refs {
		l, err := pg.Join(ctx, topo, fmt.Sprintf("m%d", i))
		must(t, err)
		refs[i] = l.MemberRef
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		owner = map[string]string{}
	)
	for i, ref := range refs {
		order := append([]string(nil), units...)
		rand.New(rand.NewPCG(uint64(i), 7)).Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs, err := pg.ClaimMany(ctx, ref, 1, order)
			if err != nil {
				t.Errorf("batch of %s: %v", ref.Member, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range outs {
				switch {
				case o.Err == nil:
					if prev, ok := owner[o.Unit]; ok {
						t.Errorf("unit %s claimed by %s and %s", o.Unit, prev, ref.Member)
					}
					owner[o.Unit] = ref.Member
				case !errors.Is(o.Err, ErrHeld) && !errors.Is(o.Err, ErrConflict):
					t.Errorf("claim of %s by %s: %v", o.Unit, ref.Member, o.Err)
				}
			}
		}()
	}
	wg.Wait()
	if len(owner) != n {
		t.Fatalf("%d of %d units claimed", len(owner), n)
	}
}

// claimManyFixture: a member of a topology of partitions x shards units, and a
// one-connection pool that reaches PostgreSQL through a proxy adding
// latency each way (a round trip is counted as a flight).
type claimManyFixture struct {
	f      *confirmFixture
	direct *PG
	units  []string
}

func newClaimManyFixture(tb testing.TB, partitions, shards int, latency time.Duration) *claimManyFixture {
	ctx := context.Background()
	direct, dsn := newPG(tb)
	p := Params{LeaseTTL: time.Hour, RenewInterval: time.Minute, QueryBound: time.Minute, Grace: 2 * time.Minute}
	topo := newTopology(tb, direct, p, partitions, shards)
	l, err := direct.Join(ctx, topo, "a")
	must(tb, err)
	fx := &claimManyFixture{f: &confirmFixture{dsn: dsn, member: l.MemberRef}, direct: direct}
	for i := 0; i < partitions*shards; i++ {
		fx.units = append(fx.units, fmt.Sprintf("%d.%d", i/shards, i%shards))
	}
	fx.f.proxy = newProxy(tb, latency)
	fx.f.slow = New(newPool(tb, viaAddr(tb, dsn, fx.f.proxy.Addr()), 1))
	return fx
}

// releaseAll frees every unit again (directly, not through the proxy).
func (fx *claimManyFixture) releaseAll(tb testing.TB) {
	cl, err := fx.direct.Claims(context.Background(), fx.f.member.Topology)
	must(tb, err)
	var toks []Token
	for _, c := range cl {
		if c.State != StateFree {
			toks = append(toks, Token{Topology: fx.f.member.Topology, Unit: c.Unit, Member: c.Owner, Epoch: c.Epoch})
		}
	}
	if len(toks) == 0 {
		return
	}
	errs, err := fx.direct.ReleaseMany(context.Background(), toks)
	must(tb, err)
	for _, e := range errs {
		must(tb, e)
	}
}

func (fx *claimManyFixture) claimMany(tb testing.TB, units []string) {
	outs, err := fx.f.slow.ClaimMany(context.Background(), fx.f.member, 1, units)
	must(tb, err)
	for _, o := range outs {
		must(tb, o.Err)
	}
}

func (fx *claimManyFixture) claimEach(tb testing.TB, units []string) {
	for _, u := range units {
		_, err := fx.f.slow.Claim(context.Background(), fx.f.member, 1, u)
		must(tb, err)
	}
}

// Issue 13: a batch costs the same round trips whatever its size.
func TestClaimManyTakesAConstantNumberOfRoundTrips(t *testing.T) {
	fx := newClaimManyFixture(t, 1, benchClaims, 0)
	must(t, fx.f.slow.Pool().Ping(context.Background()))
	measure := func(name string, fn func()) int64 {
		_, trips := fx.f.measure(fn)
		t.Logf("%s: %d round trips", name, trips)
		return trips
	}
	cold := measure("ClaimMany of 1000 units, statements not yet prepared", func() { fx.claimMany(t, fx.units) })
	fx.releaseAll(t)
	warm := measure("ClaimMany of 1000 units", func() { fx.claimMany(t, fx.units) })
	fx.releaseAll(t)
	small := measure("ClaimMany of 10 units", func() { fx.claimMany(t, fx.units[:10]) })
	one := measure("Claim of 1 unit", func() { fx.claimEach(t, fx.units[10:11]) })
	var toks []Token
	cl, err := fx.direct.Claims(context.Background(), fx.f.member.Topology)
	must(t, err)
	for _, c := range cl {
		if c.State != StateFree {
			toks = append(toks, Token{Topology: fx.f.member.Topology, Unit: c.Unit, Member: c.Owner, Epoch: c.Epoch})
		}
	}
	release := measure("ReleaseMany of 11 tokens", func() {
		errs, err := fx.f.slow.ReleaseMany(context.Background(), toks)
		must(t, err)
		for _, e := range errs {
			must(t, e)
		}
	})
	// The proxy counts a flight each time the client writes after the
	// server wrote: a 1000-unit pipeline still being written when the
	// server answers its first statement counts one flight more (a cold
	// make test under load saw 3 against 2), though the client waited for
	// nothing. So one flight of slack; a per-unit cost would show hundreds.
	if cold > 5 || warm > 5 || warm > small+1 || one > small+1 {
		t.Errorf("ClaimMany round trips: cold %d, warm %d (1000 units), %d (10 units), Claim %d; want at most 5, the same for any size (one flight of slack)",
			cold, warm, small, one)
	}
	if release > 2 {
		t.Errorf("ReleaseMany took %d round trips, want at most 2", release)
	}
	fmt.Printf("ClaimMany of %d units: %d round trips (%d with statements not yet prepared); Claim: %d; ReleaseMany: %d\n",
		benchClaims, warm, cold, one, release)
}

// BenchmarkClaimManyVsClaim claims benchBatch units at 10ms each way, in
// one batch and one Claim at a time, and reports the ratio (issue 13's
// target is at least 100x). The per-unit side alone takes minutes.
func BenchmarkClaimManyVsClaim(b *testing.B) {
	const benchBatch = 4 * 1024 // shards per partition are at most 1024
	fx := newClaimManyFixture(b, 4, 1024, benchLatency)
	fx.claimMany(b, fx.units[:1]) // prepare the statements
	fx.releaseAll(b)
	var batch, each time.Duration
	for i := 0; i < b.N; i++ {
		d, trips := fx.f.measure(func() { fx.claimMany(b, fx.units) })
		batch += d
		b.ReportMetric(float64(trips), "batch-round-trips")
		fx.releaseAll(b)
		d, trips = fx.f.measure(func() { fx.claimEach(b, fx.units) })
		each += d
		b.ReportMetric(float64(trips), "per-unit-round-trips")
		fx.releaseAll(b)
	}
	b.ReportMetric(float64(batch.Milliseconds())/float64(b.N), "batch-ms")
	b.ReportMetric(float64(each.Milliseconds())/float64(b.N), "per-unit-ms")
	b.ReportMetric(float64(each)/float64(batch), "ratio")
	fmt.Printf("claiming %d units at %v each way: ClaimMany %v, one Claim at a time %v, ratio %.0fx\n",
		benchBatch, benchLatency, (batch / time.Duration(b.N)).Round(time.Millisecond),
		(each / time.Duration(b.N)).Round(time.Millisecond), float64(each)/float64(batch))
}
