package poolctl

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
)

// continueAfter runs the continuation after the fault hit step s.
func (w *world) continueAfter(c continuation, s step) {
	a := w.actors[s.actor]
	target := a
	if !a.member {
		target = w.actors["a"]
	}
	switch c {
	case contHeal:
		w.be.heal(a.name)
		if a.alive {
			w.runStep(s, false) // the caller retries
		}
	case contLapse:
		w.lapse(target)
	case contRestart:
		w.be.heal(a.name)
		a.alive = true
		a.wipe()
		if a.member {
			w.recover(a)
		} else {
			w.operatorReload(a)
		}
	case contRelease:
		w.releaseAll(target)
	}
	w.observe("after " + string(c))
}

// lapse cuts target off (it keeps running and believes what it believed)
// until its lease and the grace have passed, while the probe tries to adopt
// its units at every renewal interval; then target comes back.
func (w *world) lapse(target *actor) {
	target.stalled = true
	z := w.probe()
	for i := 0; i < 6; i++ {
		w.advance(tickChunk)
		claims, err := w.be.raw().Claims(w.ctx, w.topo)
		if err != nil {
			w.violate("claims: %v", err)
			return
		}
		for _, c := range claims {
			if c.Owner == target.name && c.State != StateFree {
				w.claimAs(z, c.Unit, false)
			}
		}
		w.observe(fmt.Sprintf("lapse t=%v", w.now))
	}
	target.stalled = false
	w.recover(target)
}

// releaseAll brings target back and releases all it holds; a released unit
// must be claimable at once by another member (unless claims are frozen).
func (w *world) releaseAll(target *actor) {
	w.be.heal(target.name)
	if !target.alive {
		target.alive = true
		target.wipe()
	}
	w.recover(target)
	units := make([]string, 0, len(target.held))
	for u := range target.held {
		units = append(units, u)
	}
	sort.Strings(units)
	var released []string
	for _, u := range units {
		if w.releaseAs(target, u, false) == nil {
			released = append(released, u)
		}
	}
	if s, err := w.be.raw().Snapshot(w.ctx, w.topo); err != nil || s.Pending != nil {
		return
	}
	z := w.probe()
	claimable := w.claimableUnits()
	for _, u := range released {
		if !claimable(u) {
			continue
		}
		if err := w.claimAs(z, u, false); err != nil {
			w.violate("released unit %s not adoptable: %s", u, errClass(err))
			continue
		}
		w.releaseAs(z, u, false)
	}
}

// finish settles the world and runs the end checks.
func (w *world) finish() {
	r := w.be.raw()
	op := w.actors["op"]
	for _, a := range w.sortedActors() {
		w.be.heal(a.name)
		a.stalled = false
	}
	// The operator is restarted if it died, and completes a pending change.
	if !op.alive {
		op.alive = true
		op.wipe()
	}
	w.completeTopologyChange()
	for _, a := range w.sortedActors() {
		w.recover(a)
	}
	w.observe("settled")
	w.summary = w.summarize()

	claims, err := r.Claims(w.ctx, w.topo)
	if err != nil {
		w.violate("claims: %v", err)
		return
	}
	rows := map[string]ClaimInfo{}
	for _, c := range claims {
		rows[c.Unit] = c
	}
	// No claim lost: every unit ever claimed has its row (P6), and every
	// live caller's beliefs are exactly what the registry says it holds.
	for u := range w.committed {
		if _, ok := rows[u]; !ok {
			w.violate("P6: unit %s was claimed but its row is absent", u)
		}
	}
	for _, a := range w.sortedActors() {
		if !a.member || !a.alive || a.left || a.lease == nil {
			continue
		}
		got, gotWaiting := map[string]int64{}, map[string]bool{}
		for u, h := range a.held {
			got[u] = h.tok.Epoch
		}
		for u := range a.waiting {
			gotWaiting[u] = true
		}
		want, wantWaiting := map[string]int64{}, map[string]bool{}
		for _, c := range claims {
			switch {
			case c.Owner != a.name || c.State == StateFree:
			case c.OwnerIncarnation == a.lease.Incarnation:
				want[c.Unit] = c.Epoch
			default:
				wantWaiting[c.Unit] = true // an earlier incarnation's, within the re-home grace
			}
		}
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotWaiting, wantWaiting) {
			w.violate("claim lost: %s believes it holds %v and waits for %v, registry says %v and %v",
				a.name, got, gotWaiting, want, wantWaiting)
		}
	}
	w.checkTokens("settled")

	// A released unit is adoptable at once, if it is in the active epoch's
	// shape or retiring.
	z := w.probe()
	claimable := w.claimableUnits()
	for _, c := range claims {
		if c.State == StateFree && claimable(c.Unit) {
			if err := w.claimAs(z, c.Unit, false); err != nil {
				w.violate("released unit %s not adoptable: %s", c.Unit, errClass(err))
			}
		}
	}
	// Units of callers that are gone are adoptable after lease and grace
	// (and after the operator completed a change their death held up).
	w.advance(6 * tickChunk)
	w.completeTopologyChange()
	snap, err := r.Snapshot(w.ctx, w.topo)
	if err != nil {
		w.violate("snapshot: %v", err)
		return
	}
	claims, _ = r.Claims(w.ctx, w.topo)
	for _, c := range claims {
		if c.State == StateFree || c.Owner == "z" {
			continue
		}
		if m := snap.Member(c.Owner); m != nil && !m.Live && claimable(c.Unit) {
			if err := w.claimAs(z, c.Unit, false); err != nil {
				w.violate("claim lost: %s of departed %s not adoptable: %s", c.Unit, c.Owner, errClass(err))
			}
		}
	}
	w.observe("swept")
	w.checkTokens("swept")
	claims, _ = r.Claims(w.ctx, w.topo)
	w.finalClaims = fmt.Sprint(claims)
}

// claimableUnits says which units a claim under the active epoch may
// take: those of its shape and the retiring set.
func (w *world) claimableUnits() func(string) bool {
	snap, err := w.be.raw().Snapshot(w.ctx, w.topo)
	if err != nil || snap.Active == nil {
		return func(string) bool { return false }
	}
	return func(unit string) bool {
		p, s, err := parseUnit(unit)
		return err == nil && ((p < snap.Active.Partitions && s < snap.Active.Shards) || slices.Contains(snap.Retiring, unit))
	}
}

// completeTopologyChange is the operator finishing a pending change: live
// members acknowledge the freeze, and the operator activates.
func (w *world) completeTopologyChange() {
	op := w.actors["op"]
	w.operatorReload(op)
	if op.pending == 0 {
		return
	}
	for _, a := range w.sortedActors() {
		if a.member && a.alive && a.joined && !a.left {
			w.recover(a)
			if a.lease != nil {
				w.do(a, "ack-freeze", false, func(r Registry) error { return r.AckFreeze(w.ctx, a.ref(), op.pending) })
			}
		}
	}
	if err, _ := w.do(op, "activate", false, func(r Registry) error { return r.Activate(w.ctx, w.topo, op.pending) }); err == nil {
		op.pending = 0
	}
}

// checkTokens: every token ever issued that is not the unit's current
// valid one is refused, for checks and for writes; current ones pass.
func (w *world) checkTokens(where string) {
	r := w.be.raw()
	claims, err := r.Claims(w.ctx, w.topo)
	if err != nil {
		w.violate("claims: %v", err)
		return
	}
	snap, err := r.Snapshot(w.ctx, w.topo)
	if err != nil {
		w.violate("snapshot: %v", err)
		return
	}
	current := map[Token]bool{}
	for _, c := range claims {
		if m := snap.Member(c.Owner); c.State != StateFree && m != nil && m.Live && m.Incarnation == c.OwnerIncarnation {
			current[Token{Topology: w.topo, Unit: c.Unit, Member: c.Owner, Epoch: c.Epoch}] = true
		}
	}
	seen := map[Token]bool{}
	for _, t := range w.tokens {
		if seen[t] {
			continue
		}
		seen[t] = true
		err := r.CheckToken(w.ctx, t)
		if current[t] {
			if err != nil {
				w.violate("%s: current token %s refused: %s", where, t, errClass(err))
			}
			continue
		}
		if !isStale(err) {
			w.violate("%s: stale token %s accepted by CheckToken: %s", where, t, errClass(err))
		}
		if err := r.Checkpoint(w.ctx, t, 1<<40); !isStale(err) {
			w.violate("%s: write with stale token %s not refused: %s", where, t, errClass(err))
		}
	}
}

func isStale(err error) bool { return errors.Is(err, ErrStaleEpoch) }

// summarize is the outcome both backends must agree on.
func (w *world) summarize() string {
	r := w.be.raw()
	claims, _ := r.Claims(w.ctx, w.topo)
	snap, _ := r.Snapshot(w.ctx, w.topo)
	var b strings.Builder
	for _, c := range claims {
		fmt.Fprintf(&b, "%s:%s#%d@%d/%s->%s cp%d ", c.Unit, c.Owner, c.OwnerIncarnation, c.Epoch, c.State, c.HandoverTo, c.CheckpointSeq)
	}
	for _, m := range snap.Members {
		fmt.Fprintf(&b, "%s#%d slot%d live=%v left=%v fenced=%v holds=%d ", m.Name, m.Incarnation, m.Slot, m.Live, m.Left, m.Fenced, m.Holds)
	}
	if snap.Active != nil {
		fmt.Fprintf(&b, "active=%d(%dx%d)", snap.Active.Number, snap.Active.Partitions, snap.Active.Shards)
	}
	return b.String()
}

// combination is one cell of the matrix.
type combination struct {
	scenario scenario
	stepIdx  int // index into scenario.steps of the faulted durable step
	durable  int // its number among the durable steps
	fault    faultKind
	cont     continuation
}

func (c combination) String() string {
	return fmt.Sprintf("%s/step%d(%s)/%s/%s", c.scenario.name, c.durable, c.scenario.steps[c.stepIdx], c.fault, c.cont)
}

func matrixCombinations() []combination {
	var out []combination
	for _, sc := range matrixScenarios {
		n := 0
		for i, s := range sc.steps {
			if !s.op.durable() {
				continue
			}
			for _, f := range matrixFaults {
				for _, c := range matrixContinuations {
					out = append(out, combination{scenario: sc, stepIdx: i, durable: n, fault: f, cont: c})
				}
			}
			n++
		}
	}
	return out
}

// outcome is what one combination produced on one backend.
type outcome struct {
	trace       []string
	summary     string
	finalClaims string
	violations  []string
	applied     bool
}

func runCombination(ctx context.Context, be matrixBackend, topo string, c combination) outcome {
	w, err := newWorld(ctx, be, topo, c.scenario)
	if err != nil {
		return outcome{violations: []string{"setup: " + err.Error()}}
	}
	w.fault = c.fault
	for i, s := range c.scenario.steps {
		w.runStep(s, i == c.stepIdx)
		if i == c.stepIdx {
			w.continueAfter(c.cont, s)
		}
		w.observe(s.String())
	}
	w.finish()
	return outcome{trace: w.trace, summary: w.summary, finalClaims: w.finalClaims, violations: w.violations, applied: w.faultApplied}
}

// twinBackend: one twin on a fixed clock; a cut link fails calls at once.
type twinBackend struct {
	tw   *Twin
	down map[string]bool
}

func newTwinBackend() *twinBackend {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &twinBackend{tw: NewTwin(func() time.Time { return t0 }), down: map[string]bool{}}
}

func (b *twinBackend) name() string           { return "twin" }
func (b *twinBackend) link(string) Registry   { return b.tw }
func (b *twinBackend) raw() testRegistry      { return b.tw }
func (b *twinBackend) cut(a string)           { b.down[a] = true }
func (b *twinBackend) heal(a string)          { b.down[a] = false }
func (b *twinBackend) linkDown(a string) bool { return b.down[a] }

// wire simulates PG's outcome: a cut at the first reply finds a call of
// several round trips not done (the reply is its read's) and a single
// statement or pipeline committed; a lost final reply finds the call done.
// The caller sees a cut either way (a call of several round trips that
// writes nothing, a claim refused or repeated, ends with its read, and it
// is that reply that is lost).
func (b *twinBackend) wire(_ string, kind faultKind, what string, f func(Registry) error) (error, bool) {
	if kind == faultWireCut && multiTrip(what) {
		return errWire, true
	}
	_ = f(b.tw)
	return errWire, true
}

// pgBackend: every caller reaches PostgreSQL through its own fault proxy
// and pool; a cut closes its connections and refuses new ones. A call
// under a wire fault goes through a second pool on the same proxy (see
// newWirePool); the others use prepared statements, as workers do.
type pgBackend struct {
	direct    *PG
	links     map[string]*PG
	wireLinks map[string]*PG
	proxies   map[string]*faultproxy.Proxy
	isCut     map[string]bool
}

func newPGBackend(t testing.TB) *pgBackend {
	pg, dsn := newPG(t)
	b := &pgBackend{direct: pg, links: map[string]*PG{}, wireLinks: map[string]*PG{}, proxies: map[string]*faultproxy.Proxy{},
		isCut: map[string]bool{}}
	target := pgAddr(t)
	for _, a := range []string{"a", "b", "z", "op"} {
		p := faultproxy.New(t, target)
		b.proxies[a] = p
		b.links[a] = New(newPool(t, viaAddr(t, dsn, p.Addr()), 2))
		b.wireLinks[a] = New(newWirePool(t, viaAddr(t, dsn, p.Addr())))
	}
	return b
}

// newWirePool is a caller's pool as wire faults need it: statements are
// sent without a separate prepare round trip, so a call's first reply is
// its first statement's, and the pool never pings a connection before
// using it, so a fault strikes the call and not a ping.
func newWirePool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// readyIdle is PostgreSQL's ReadyForQuery message outside a transaction:
// the end of the reply that finishes a call's transaction, sent after it
// committed (or rolled back).
var readyIdle = []byte{'Z', 0, 0, 0, 5, 'I'}

// commitIdle ends the reply to a pipelined transaction's COMMIT: the
// COMMIT's CommandComplete and the ReadyForQuery after it. A call of
// several round trips (a read, then a write pipeline) ends its write's
// reply with it; its read's reply ends with readyIdle alone.
var commitIdle = append([]byte("COMMIT\x00"), readyIdle...)

// wire cuts the actor's connection at the call's first reply (a few bytes
// of it get through), or drops the reply that ends its transaction.
func (b *pgBackend) wire(a string, kind faultKind, what string, f func(Registry) error) (error, bool) {
	link := b.wireLinks[a]
	// A connection is open before the fault is armed, so the fault strikes
	// the call rather than a connection's start-up (which also ends with
	// ReadyForQuery).
	_ = link.Pool().Ping(context.Background())
	p := b.proxies[a]
	switch {
	case kind == faultWireLost && multiTrip(what):
		p.CutReply(commitIdle, 0)
	case kind == faultWireLost:
		p.CutReply(readyIdle, 0)
	default:
		p.CutReply(nil, 5)
	}
	err := f(link)
	struck := p.Disarm()
	if !struck && kind == faultWireLost && multiTrip(what) {
		// The call wrote nothing, so its last reply was its read's, which
		// carries no COMMIT: that is the reply lost. Nothing changed; the
		// call's connection is gone (the caller's other links are not).
		link.Pool().Reset()
		return errWire, true
	}
	return err, struck
}

func (b *pgBackend) name() string           { return "postgres" }
func (b *pgBackend) link(a string) Registry { return b.links[a] }
func (b *pgBackend) raw() testRegistry      { return b.direct }
func (b *pgBackend) linkDown(string) bool   { return false }

func (b *pgBackend) cut(a string) {
	b.isCut[a] = true
	b.proxies[a].Refuse(true)
	b.proxies[a].CutAll()
	b.links[a].Pool().Reset()
	b.wireLinks[a].Pool().Reset()
}

// heal lets connections through again and drops the pool's dead ones, as a
// worker does on its next tick after connection errors.
func (b *pgBackend) heal(a string) {
	if !b.isCut[a] {
		return
	}
	b.isCut[a] = false
	b.proxies[a].Refuse(false)
	b.links[a].Pool().Reset()
	b.wireLinks[a].Pool().Reset()
}

// TestFaultMatrixTwin runs every combination against the twin alone and
// checks the four properties after each; it needs no PostgreSQL.
// checks P1, P5, P6
func TestFaultMatrixTwin(t *testing.T) {
	combos := matrixCombinations()
	if len(combos) < 1000 {
		t.Fatalf("only %d combinations", len(combos))
	}
	violations := 0
	for i, c := range combos {
		tw := runCombination(context.Background(), newTwinBackend(), fmt.Sprintf("matrix/%d", i), c)
		if !tw.applied {
			t.Errorf("%s: fault not applied", c)
		}
		for _, v := range tw.violations {
			violations++
			t.Errorf("twin %s: %s", c, v)
		}
	}
	fmt.Printf("fault matrix, twin alone: combinations: %d violations: %d\n", len(combos), violations)
}

// matrixPGWorkers run the PostgreSQL half of the matrix side by side, each
// with its own database, proxies and pools: a combination mostly waits on
// round trips.
const matrixPGWorkers = 3

// TestFaultMatrix runs every scenario x durable step x fault x continuation
// against the twin and against PostgreSQL, checks the four properties after
// each, and requires both backends to agree. checks P1, P5, P6
func TestFaultMatrix(t *testing.T) {
	t.Parallel() // with the benchmark, which mostly waits on latency
	combos := matrixCombinations()
	if len(combos) < 1000 {
		t.Fatalf("only %d combinations", len(combos))
	}
	start := time.Now()
	twins, twinTime := runMatrixOn(combos, 1, func(int) matrixBackend { return newTwinBackend() })
	pgbs := make([]*pgBackend, matrixPGWorkers)
	for i := range pgbs {
		pgbs[i] = newPGBackend(t)
	}
	pgs, pgTime := runMatrixOn(combos, matrixPGWorkers, func(worker int) matrixBackend { return pgbs[worker] })
	var twinViolations, pgViolations, mismatches, notApplied int
	for i, c := range combos {
		tw, pg := twins[i], pgs[i]
		if !tw.applied || !pg.applied {
			notApplied++
			t.Errorf("%s: fault not applied (twin %v, postgres %v)", c, tw.applied, pg.applied)
		}
		for _, v := range tw.violations {
			twinViolations++
			t.Errorf("twin %s: %s", c, v)
		}
		for _, v := range pg.violations {
			pgViolations++
			t.Errorf("postgres %s: %s", c, v)
		}
		if !reflect.DeepEqual(tw.trace, pg.trace) || tw.summary != pg.summary || tw.finalClaims != pg.finalClaims {
			mismatches++
			if mismatches <= 5 {
				t.Errorf("%s: backends disagree\n twin trace: %v\n   pg trace: %v\n twin: %s\n   pg: %s\n twin final: %s\n   pg final: %s",
					c, tw.trace, pg.trace, tw.summary, pg.summary, tw.finalClaims, pg.finalClaims)
			}
		}
	}
	fmt.Printf("fault matrix: %d scenarios, faults %v, continuations %v; twin %v, postgres %v (%d workers), total %v\n",
		len(matrixScenarios), matrixFaults, matrixContinuations, twinTime.Round(time.Millisecond), pgTime.Round(time.Millisecond),
		matrixPGWorkers, time.Since(start).Round(time.Millisecond))
	fmt.Printf("twin:     combinations: %d violations: %d\n", len(combos), twinViolations)
	fmt.Printf("postgres: combinations: %d violations: %d\n", len(combos), pgViolations)
	fmt.Printf("twin and postgres disagree on %d, fault not applied in %d\n", mismatches, notApplied)
	fmt.Printf("combinations: %d violations: %d\n", len(combos), twinViolations+pgViolations+mismatches+notApplied)
	if mismatches > 0 {
		t.Errorf("%d combinations gave different outcomes on the twin and on PostgreSQL", mismatches)
	}
}

// runMatrixOn runs every combination with workers goroutines, worker w on
// backend(w) (called per combination: the twin's is fresh each time, a PG
// worker's is its own), each combination in its own topology, and returns the
// outcomes in combination order and the wall time taken.
func runMatrixOn(combos []combination, workers int, backend func(worker int) matrixBackend) ([]outcome, time.Duration) {
	start := time.Now()
	out := make([]outcome, len(combos))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = runCombination(context.Background(), backend(w), fmt.Sprintf("matrix/%d", i), combos[i])
			}
		}()
	}
	for i := range combos {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, time.Since(start)
}
