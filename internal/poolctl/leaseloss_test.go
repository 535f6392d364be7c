package poolctl

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
)

// The lease-loss hazard (issue 5, item 4), against PostgreSQL in real time:
// member A keeps delivering while its renewals are blocked and its lease
// lapses without a handover.

// leaseParams are short so the tests are quick, with room for a loaded
// machine: a 2s lease renewed every 300ms, queries bounded at 500ms, an
// 800ms grace. A worker fences itself 300ms before its deadline.
var (
	leaseParams = Params{LeaseTTL: 2 * time.Second, RenewInterval: 300 * time.Millisecond,
		QueryBound: 500 * time.Millisecond, Grace: 800 * time.Millisecond}
	leaseMargin = 300 * time.Millisecond
)

// delivery is one row the simulated worker delivered to the sink.
type delivery struct {
	tok        Token
	start, end time.Time
	err        error
}

// simWorker is member A's worker loop as design.md section 7 describes it:
// renew every interval, measure the lease from when each renewal was sent
// on its own monotonic clock, fence itself at sent+TTL-margin, and on
// recovery rejoin if needed and confirm every claim in one statement
// before delivering again. Delivering writes a row to a sink in the
// registry's database through GuardedExec, over a connection that is not
// blocked (the sink is reachable; the registry is not).
type simWorker struct {
	reg    *PG
	sink   *pgxpool.Pool
	rejoin bool // recover from a lost lease by joining again

	mu         sync.Mutex
	lease      Lease
	deadline   time.Time
	fenced     bool
	fencedAt   time.Time // when the deadline passed (first time)
	tokens     map[string]Token
	waiting    int // units ConfirmOwned left for the re-home grace
	deliveries []delivery
	renewErrs  []error
	rejoins    []Lease

	stop chan struct{}
	wg   sync.WaitGroup
}

func startWorker(t *testing.T, reg *PG, sink *pgxpool.Pool, lease Lease, sent time.Time, tokens map[string]Token, rejoin bool) *simWorker {
	w := &simWorker{reg: reg, sink: sink, rejoin: rejoin, lease: lease, deadline: sent.Add(lease.TTL - leaseMargin),
		tokens: tokens, stop: make(chan struct{})}
	w.wg.Add(2)
	go w.renewLoop()
	go w.deliverLoop()
	t.Cleanup(w.halt)
	return w
}

func (w *simWorker) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *simWorker) renewLoop() {
	defer w.wg.Done()
	tick := time.NewTicker(leaseParams.RenewInterval)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		w.mu.Lock()
		ref := w.lease.MemberRef
		w.mu.Unlock()
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), leaseParams.QueryBound)
		l, err := w.reg.Renew(ctx, ref)
		cancel()
		w.mu.Lock()
		switch {
		case err == nil:
			w.deadline = sent.Add(l.TTL - leaseMargin)
			if w.fenced || w.waiting > 0 {
				w.mu.Unlock()
				w.confirm()
				continue
			}
		case isLeaseLoss(err):
			w.renewErrs = append(w.renewErrs, err)
			if w.rejoin {
				w.mu.Unlock()
				w.join()
				continue
			}
		default:
			w.renewErrs = append(w.renewErrs, err)
		}
		w.mu.Unlock()
	}
}

// join rejoins after a lost lease: a new incarnation, then ConfirmOwned.
func (w *simWorker) join() {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), leaseParams.QueryBound)
	l, err := w.reg.Join(ctx, w.lease.Topology, w.lease.Member)
	cancel()
	if err != nil {
		return
	}
	w.mu.Lock()
	w.lease, w.deadline = l, sent.Add(l.TTL-leaseMargin)
	w.rejoins = append(w.rejoins, l)
	w.mu.Unlock()
	w.confirm()
}

// confirm is the batch path after a fence lifts.
func (w *simWorker) confirm() {
	w.mu.Lock()
	ref := w.lease.MemberRef
	expected := map[string]int64{}
	for u, t := range w.tokens {
		expected[u] = t.Epoch
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), leaseParams.QueryBound)
	c, err := w.reg.ConfirmOwned(ctx, ref, expected)
	cancel()
	if err != nil {
		return
	}
	w.mu.Lock()
	w.tokens, w.fenced, w.waiting = c.Held, false, len(c.Waiting)
	w.mu.Unlock()
}

func (w *simWorker) deliverLoop() {
	defer w.wg.Done()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		w.mu.Lock()
		if !now.Before(w.deadline) && !w.fenced {
			w.fenced = true
			if w.fencedAt.IsZero() {
				w.fencedAt = w.deadline
			}
		}
		if w.fenced {
			w.mu.Unlock()
			continue
		}
		toks := make([]Token, 0, len(w.tokens))
		for _, t := range w.tokens {
			toks = append(toks, t)
		}
		w.mu.Unlock()
		for _, t := range toks {
			d := delivery{tok: t, start: time.Now()}
			d.err = sinkWrite(w.sink, t)
			d.end = time.Now()
			w.mu.Lock()
			w.deliveries = append(w.deliveries, d)
			w.mu.Unlock()
		}
	}
}

// sinkWrite writes one row under the guard.
func sinkWrite(sink *pgxpool.Pool, t Token) error {
	return pgx.BeginFunc(context.Background(), sink, func(tx pgx.Tx) error {
		_, err := GuardedExec(context.Background(), tx, t, "INSERT INTO sink (unit, epoch, member) VALUES ($1, $2, $3)",
			t.Unit, t.Epoch, t.Member)
		return err
	})
}

func (w *simWorker) snapshot() (fencedAt time.Time, deliveries []delivery, lease Lease, tokens map[string]Token) {
	w.mu.Lock()
	defer w.mu.Unlock()
	toks := map[string]Token{}
	for u, t := range w.tokens {
		toks[u] = t
	}
	return w.fencedAt, append([]delivery(nil), w.deliveries...), w.lease, toks
}

// leaseFixture is a topology with A joined through a fault proxy and its
// units claimed, B joined directly, and a sink table.
type leaseFixture struct {
	direct *PG
	viaA   *PG
	proxyA *faultproxy.Proxy
	topo   string
	a      Lease
	aSent  time.Time
	b      Lease
	tokens map[string]Token
	units  []string
}

func newLeaseFixture(t *testing.T) *leaseFixture {
	ctx := context.Background()
	direct, dsn := newPG(t)
	_, err := direct.Pool().Exec(ctx, "CREATE TABLE sink (unit text, epoch bigint, member text, at timestamptz DEFAULT clock_timestamp())")
	must(t, err)
	f := &leaseFixture{direct: direct, proxyA: faultproxy.New(t, pgAddr(t))}
	f.viaA = New(newPool(t, viaAddr(t, dsn, f.proxyA.Addr()), 4))
	t.Cleanup(func() { f.proxyA.Hold(false); f.proxyA.Refuse(false) }) // before the pool closes
	f.topo = newTopology(t, direct, leaseParams, 2, 4)
	f.aSent = time.Now()
	f.a, err = f.viaA.Join(ctx, f.topo, "a")
	must(t, err)
	f.b, err = direct.Join(ctx, f.topo, "b")
	must(t, err)
	keepAlive(t, direct, f.b)
	f.tokens = map[string]Token{}
	for _, u := range []string{"0.0", "0.1", "1.0", "1.1"} {
		c, err := f.viaA.Claim(ctx, f.a.MemberRef, 1, u)
		must(t, err)
		f.tokens[u] = c.Token
		f.units = append(f.units, u)
	}
	return f
}

// keepAlive renews l every renew interval until the test ends.
func keepAlive(t *testing.T, reg Registry, l Lease) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(leaseParams.RenewInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_, _ = reg.Renew(context.Background(), l.MemberRef)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// waitFor polls cond every 20ms until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLeaseLossBlocksAdoptionUntilP5AllowsIt(t *testing.T) { // checks P1, P5
	blocks := []struct {
		name  string
		block func(p *faultproxy.Proxy)
	}{
		{"renewals-time-out-in-a-partition", func(p *faultproxy.Proxy) { p.Hold(true) }},
		{"connections-cut-and-refused", func(p *faultproxy.Proxy) { p.Refuse(true); p.CutAll() }},
	}
	for _, bl := range blocks {
		t.Run(bl.name, func(t *testing.T) {
			ctx := context.Background()
			f := newLeaseFixture(t)
			w := startWorker(t, f.viaA, f.direct.Pool(), f.a, f.aSent, f.tokens, false)
			waitFor(t, 5*time.Second, "A to deliver", func() bool { _, d, _, _ := w.snapshot(); return len(d) >= 8 })

			bl.block(f.proxyA)
			blockedAt := time.Now()

			// B tries to adopt A's units as fast as it can.
			type adoption struct {
				sent time.Time
				c    Claim
			}
			adopted := map[string]adoption{}
			reasons := map[HeldReason]int{}
			waitFor(t, leaseParams.LeaseTTL+leaseParams.Grace+5*time.Second, "B to adopt A's units", func() bool {
				for _, u := range f.units {
					if _, ok := adopted[u]; ok {
						continue
					}
					sent := time.Now()
					c, err := f.direct.Claim(ctx, f.b.MemberRef, 1, u)
					var he *HeldError
					switch {
					case err == nil:
						adopted[u] = adoption{sent: sent, c: c}
					case errors.As(err, &he):
						reasons[he.Reason]++
					default:
						t.Fatalf("B's claim of %s: %v", u, err)
					}
				}
				return len(adopted) == len(f.units)
			})
			fencedAt, deliveries, _, _ := w.snapshot()

			snap, err := f.direct.Snapshot(ctx, f.topo)
			must(t, err)
			aRow := snap.Member("a")
			if aRow.Live {
				t.Fatalf("A still live after B adopted: %+v", aRow)
			}
			first := time.Time{}
			for u, ad := range adopted {
				// P5: no adoption before A's expiry plus the grace, on the
				// registry's clock.
				if !ad.c.Adopted || ad.c.From != "a" || ad.c.Epoch != f.tokens[u].Epoch+1 {
					t.Fatalf("B's claim of %s: %+v", u, ad.c)
				}
				if early := aRow.LeaseExpiresAt.Add(leaseParams.Grace).Sub(ad.c.At); early > 0 {
					t.Fatalf("B adopted %s %v before A's expiry plus grace", u, early)
				}
				if first.IsZero() || ad.sent.Before(first) {
					first = ad.sent
				}
			}
			if reasons[HeldOwnerLive] == 0 {
				t.Fatalf("B's refused attempts by reason %v: want some while A was live", reasons)
			}
			// A fenced itself, on its own clock, before B's first adoption was
			// even sent, and delivered nothing after.
			if fencedAt.IsZero() || !fencedAt.Before(first) {
				t.Fatalf("A fenced at %v, B's first adoption sent at %v", fencedAt, first)
			}
			var (
				last    time.Time
				written int
			)
			for _, d := range deliveries {
				switch {
				case d.err == nil:
					written++
				case !errors.Is(d.err, ErrStaleEpoch):
					t.Fatalf("A's delivery: %v", d.err)
				}
				last = d.end
			}
			if !last.Before(first) {
				t.Fatalf("A's last delivery ended at %v, after B's adoption was sent at %v", last, first)
			}
			// P1 on the database's own timeline: every row A wrote committed
			// before B's first adoption.
			var lastRowA time.Time
			must(t, f.direct.Pool().QueryRow(ctx, "SELECT max(at) FROM sink WHERE member = 'a'").Scan(&lastRowA))
			for u, ad := range adopted {
				if !lastRowA.Before(ad.c.At) {
					t.Fatalf("A's last sink row at %v, B adopted %s at %v", lastRowA, u, ad.c.At)
				}
			}

			// A's later write with its old epoch is refused.
			for _, u := range f.units {
				err := sinkWrite(f.direct.Pool(), f.tokens[u])
				var se *StaleEpochError
				if !errors.As(err, &se) || se.Reason != StaleMoved || se.Owner != "b" {
					t.Fatalf("A's write to %s after adoption: %v", u, err)
				}
				wantErr(t, "A's checkpoint after adoption", f.direct.Checkpoint(ctx, f.tokens[u], 99), ErrStaleEpoch)
			}
			var rowsA int
			must(t, f.direct.Pool().QueryRow(ctx, "SELECT count(*) FROM sink WHERE member = 'a'").Scan(&rowsA))
			if rowsA != written {
				t.Fatalf("sink has %d rows from A, A made %d deliveries", rowsA, written)
			}
			// Healed, A cannot renew its lapsed lease back into validity.
			f.proxyA.Hold(false)
			f.proxyA.Refuse(false)
			f.viaA.Pool().Reset()
			_, err = f.viaA.Renew(ctx, f.a.MemberRef)
			wantErr(t, "A's renewal after the lapse", err, ErrLeaseExpired)
			t.Logf("renewals blocked at 0; A fenced itself at +%v and delivered last at +%v (%d rows, %d refused); "+
				"B's first adoption sent at +%v, %v after A's lease expired on the registry's clock (grace %v); "+
				"B's claims refused before: %v",
				fencedAt.Sub(blockedAt).Round(time.Millisecond), last.Sub(blockedAt).Round(time.Millisecond), written,
				len(deliveries)-written, first.Sub(blockedAt).Round(time.Millisecond),
				adopted[f.units[0]].c.At.Sub(aRow.LeaseExpiresAt).Round(time.Millisecond), leaseParams.Grace, reasons)
		})
	}
}

func TestLeaseLossRejoinAtAnotherSlotKeepsUnitsFromAdoption(t *testing.T) { // checks P1, P5
	ctx := context.Background()
	f := newLeaseFixture(t)
	w := startWorker(t, f.viaA, f.direct.Pool(), f.a, f.aSent, f.tokens, true)
	waitFor(t, 5*time.Second, "A to deliver", func() bool { _, d, _, _ := w.snapshot(); return len(d) >= 8 })
	if f.a.Slot != 0 {
		t.Fatalf("A joined at slot %d", f.a.Slot)
	}

	// A's renewals are blocked until its lease lapses; B does nothing yet.
	f.proxyA.Refuse(true)
	f.proxyA.CutAll()
	waitFor(t, leaseParams.LeaseTTL+2*time.Second, "A's lease to lapse", func() bool {
		s, err := f.direct.Snapshot(ctx, f.topo)
		must(t, err)
		return !s.Member("a").Live
	})
	// C joins and takes A's slot, which no live member holds.
	c, err := f.direct.Join(ctx, f.topo, "c")
	must(t, err)
	if c.Slot != 0 {
		t.Fatalf("C joined at slot %d, want A's slot 0", c.Slot)
	}
	keepAlive(t, f.direct, c)
	f.proxyA.Refuse(false)
	waitFor(t, 5*time.Second, "A to rejoin and confirm", func() bool {
		_, _, lease, toks := w.snapshot()
		return lease.Incarnation != f.a.Incarnation && len(toks) == len(f.units) && toks[f.units[0]].Epoch > f.tokens[f.units[0]].Epoch
	})
	_, _, rejoined, newTokens := w.snapshot()
	if rejoined.Slot == f.a.Slot {
		t.Fatalf("A rejoined at its old slot %d", rejoined.Slot)
	}

	// Now B acts, for longer than a lease plus grace: while A delivers, none
	// of its units may be adopted, and its old epochs are refused.
	_, before, _, _ := w.snapshot()
	end := time.Now().Add(leaseParams.LeaseTTL + leaseParams.Grace + 500*time.Millisecond)
	attempts := 0
	for time.Now().Before(end) {
		for _, u := range f.units {
			attempts++
			_, err := f.direct.Claim(ctx, f.b.MemberRef, 1, u)
			var he *HeldError
			if !errors.As(err, &he) || he.Reason != HeldOwnerLive || he.Owner != "a" {
				t.Fatalf("B's claim of %s while A delivers: %v", u, err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, after, _, _ := w.snapshot()
	fresh := 0
	for _, d := range after[len(before):] {
		if d.err != nil {
			t.Fatalf("A's delivery under its re-homed claim refused: %v", d.err)
		}
		if d.tok.Epoch > f.tokens[d.tok.Unit].Epoch {
			fresh++
		}
	}
	if fresh == 0 {
		t.Fatal("A did not deliver under its re-homed claims while B was trying")
	}
	for _, u := range f.units {
		if err := sinkWrite(f.direct.Pool(), f.tokens[u]); !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("A's write to %s with its pre-rejoin epoch: %v", u, err)
		}
		must(t, f.direct.CheckToken(ctx, newTokens[u]))
	}
	units := make([]string, 0, len(newTokens))
	for u := range newTokens {
		units = append(units, u)
	}
	sort.Strings(units)
	t.Logf("A rejoined at slot %d (was %d; C took it); B's %d attempts over %v all refused; A delivered %d rows under %v",
		rejoined.Slot, f.a.Slot, attempts, leaseParams.LeaseTTL+leaseParams.Grace+500*time.Millisecond, fresh, units)
}
