package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestBackendsAgreeOnRandomOperations applies random operation sequences
// to the twin and to PostgreSQL and requires the same answer to every call,
// the same final state and the same claim history. (Its name leaves out
// "Twin": go test -run Twin runs what needs no PostgreSQL.)
func TestBackendsAgreeOnRandomOperations(t *testing.T) {
	pg, _ := newPG(t)
	ctx := context.Background()
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		topo := fmt.Sprintf("prop/%d", run.Add(1))
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		tw := NewTwin(func() time.Time { return t0 })
		regs := []testRegistry{tw, pg}
		for _, r := range regs {
			must(rt, r.EnsureTopology(ctx, topo, testParams))
			e, err := r.CreatePending(ctx, topo, 1, 4)
			must(rt, err)
			must(rt, r.Activate(ctx, topo, e))
		}
		leases := map[string]MemberRef{}
		tokens := map[string]Token{} // last token per unit
		active, pending := int64(1), int64(0)
		members := []string{"a", "b", "c"}
		units := []string{"0.0", "0.1", "0.2", "0.3", "0.4"}
		steps := rapid.IntRange(5, 40).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			m := rapid.SampledFrom(members).Draw(rt, "member")
			u := rapid.SampledFrom(units).Draw(rt, "unit")
			ref, joined := leases[m]
			if !joined {
				ref = MemberRef{Topology: topo, Member: m, Incarnation: 99}
			}
			tok := tokens[u]
			if tok.Topology == "" {
				tok = Token{Topology: topo, Unit: u, Member: m, Epoch: 1}
			}
			op := rapid.SampledFrom([]string{"join", "renew", "leave", "fence", "unfence", "claim", "claim", "claim-many",
				"handover", "release", "release-many", "confirm", "checkpoint", "shift", "shift", "pending", "ack",
				"activate", "retire", "retiring", "drain", "report", "reset"}).Draw(rt, "op")
			to := rapid.SampledFrom(append([]string{""}, members...)).Draw(rt, "to")
			shift := rapid.SampledFrom([]time.Duration{5 * time.Second, 20 * time.Second, 45 * time.Second}).Draw(rt, "shift")
			shards := rapid.IntRange(3, 6).Draw(rt, "shards")
			gen := rapid.Int64Range(0, 3).Draw(rt, "gen")
			some := rapid.SliceOfN(rapid.SampledFrom(units), 0, 4).Draw(rt, "units")
			flag := rapid.Bool().Draw(rt, "flag")
			var someTokens []Token
			for _, su := range some {
				st := tokens[su]
				if st.Topology == "" {
					st = Token{Topology: topo, Unit: su, Member: m, Epoch: 1}
				}
				someTokens = append(someTokens, st)
			}
			var outs [2]string
			for k, r := range regs {
				var (
					res any
					err error
				)
				switch op {
				case "join":
					var l Lease
					l, err = r.Join(ctx, topo, m)
					res = [4]any{l.MemberRef, l.Slot, l.TTL, l.Params}
					if err == nil && k == 0 {
						leases[m] = l.MemberRef
					}
				case "renew":
					var l Lease
					l, err = r.Renew(ctx, ref)
					res = [3]any{l.Slot, l.TTL, l.Params}
				case "leave":
					err = r.Leave(ctx, ref)
				case "fence":
					err = r.Fence(ctx, ref, gen)
				case "unfence":
					err = r.Unfence(ctx, ref, gen)
				case "claim":
					var c Claim
					c, err = r.Claim(ctx, ref, active, u)
					res = claimResult(c)
					if err == nil && k == 0 {
						tokens[u] = c.Token
					}
				case "claim-many":
					var cs []ClaimOutcome
					cs, err = r.ClaimMany(ctx, ref, active, some)
					var per []string
					for _, o := range cs {
						per = append(per, fmt.Sprintf("%s:%v:%s", o.Unit, claimResult(o.Claim), errClass(o.Err)))
						if o.Err == nil && k == 0 {
							tokens[o.Unit] = o.Claim.Token
						}
					}
					res = per
				case "handover":
					err = r.Handover(ctx, tok, to)
				case "release":
					err = r.Release(ctx, tok)
				case "release-many":
					var errs []error
					errs, err = r.ReleaseMany(ctx, someTokens)
					var per []string
					for _, e := range errs {
						per = append(per, errClass(e))
					}
					res = per
				case "confirm":
					var c Confirmation
					c, err = r.ConfirmOwned(ctx, ref, map[string]int64{u: tok.Epoch})
					res = [4]any{c.Held, c.Handover, c.Moved, c.Waiting}
				case "checkpoint":
					err = r.Checkpoint(ctx, tok, int64(i))
				case "shift":
					err = r.ShiftClock(ctx, topo, shift)
				case "pending":
					var e int64
					e, err = r.CreatePending(ctx, topo, 1, shards)
					res = e
					if err == nil && k == 0 {
						pending = e
					}
				case "ack":
					err = r.AckFreeze(ctx, ref, pending)
				case "activate":
					err = r.Activate(ctx, topo, pending)
					if err == nil && k == 0 && pending != 0 {
						active = pending
					}
				case "retire":
					err = r.Retire(ctx, topo, pending)
				case "retiring":
					err = r.SetRetiring(ctx, topo, some)
				case "drain":
					err = r.SetDraining(ctx, topo, m, flag)
				case "report":
					var rep []UnitActivity
					for j, su := range distinctUnits(some) {
						rep = append(rep, UnitActivity{Unit: su, Epoch: int64(j), SinceFetch: time.Duration(j-1) * time.Second,
							SinceRows: time.Duration(j-2) * time.Second, SincePullStart: time.Duration(j-1) * time.Second})
					}
					err = r.ReportActivity(ctx, ref, rep)
				case "reset":
					err = r.PublishResetPermission(ctx, topo, ResetPermission{Allowed: flag, Floor: "2.14.0",
						Servers: map[string]string{"n1": "2.14.9", m: ""}, Reason: "census"})
				}
				outs[k] = fmt.Sprintf("%v %s", res, errClass(err))
			}
			if outs[0] != outs[1] {
				rt.Fatalf("step %d %s by %s on %s %v: twin %s, postgres %s", i, op, m, u, some, outs[0], outs[1])
			}
		}
		var sums [2]string
		for k, r := range regs {
			w := &world{ctx: ctx, be: staticBackend{r}, topo: topo}
			sums[k] = w.summarize() + " " + newStateSummary(ctx, rt, r, topo)
		}
		if sums[0] != sums[1] {
			rt.Fatalf("final states differ:\n twin %s\n   pg %s", sums[0], sums[1])
		}
	})
}

// claimResult is what both backends must agree on in a Claim (its time
// is each backend's own clock).
func claimResult(c Claim) [6]any {
	return [6]any{c.Token, c.Adopted, c.Settled, c.Rehomed, c.From, c.CheckpointSeq}
}

// newStateSummary is the state the later operations left: the retiring
// set, the RESET detail, drains and fence generations as snapshots show
// them, activity reports without their times, and each unit's claim
// history without times (the order across units within one statement is
// not defined; within a unit it is).
func newStateSummary(ctx context.Context, t fataler, r testRegistry, topo string) string {
	s, err := r.Snapshot(ctx, topo)
	must(t, err)
	acts, err := r.Activity(ctx, topo)
	must(t, err)
	hist, err := r.(HistoryReader).ClaimHistory(ctx, topo)
	must(t, err)
	var b strings.Builder
	fmt.Fprintf(&b, "retiring=%v reset=%v/%s/%v ", s.Retiring, s.Reset.Allowed, s.Reset.Floor, s.Reset.Servers)
	for _, m := range s.Members {
		fmt.Fprintf(&b, "%s draining=%v lifted=%v ", m.Name, m.Draining, !m.FenceLiftedAt.IsZero())
	}
	for _, a := range acts {
		fmt.Fprintf(&b, "act %s/%s#%d@%d fetch=%v rows=%v pulling=%v ", a.Unit, a.Member, a.Incarnation, a.Epoch,
			!a.LastFetch.IsZero(), !a.LastRows.IsZero(), !a.PullingSince.IsZero())
	}
	perUnit := map[string][]string{}
	for _, e := range hist {
		perUnit[e.Unit] = append(perUnit[e.Unit], fmt.Sprintf("%s:%s#%d@%d/%s^%d", e.Op, e.Owner, e.Incarnation, e.Epoch, e.State, e.Under))
	}
	for _, u := range sortedKeys(perUnit) {
		fmt.Fprintf(&b, "hist %s %v ", u, perUnit[u])
	}
	return b.String()
}

// staticBackend lets summarize read one registry.
type staticBackend struct{ r testRegistry }

func (s staticBackend) name() string         { return "static" }
func (s staticBackend) link(string) Registry { return s.r }
func (s staticBackend) raw() testRegistry    { return s.r }
func (s staticBackend) cut(string)           {}
func (s staticBackend) heal(string)          {}
func (s staticBackend) linkDown(string) bool { return false }
func (s staticBackend) wire(string, faultKind, string, func(Registry) error) (error, bool) {
	return nil, false
}

func TestConcurrentClaimsOfOneUnitHaveOneWinner(t *testing.T) { // checks P1
	pg, _ := newPG(t)
	ctx := context.Background()
	topo := newTopology(t, pg, testParams, 1, 1)
	const n = 8
	refs := make([]MemberRef, n)
	for i := range refs {
		l, err := pg.Join(ctx, topo, fmt.Sprintf("m%d", i))
		must(t, err)
		refs[i] = l.MemberRef
	}
	for round := 0; round < 5; round++ {
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			winners atomic.Int64
			won     = make([]Claim, n)
		)
		for i := range refs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, err := pg.Claim(ctx, refs[i], 1, "0.0")
				switch {
				case err == nil:
					winners.Add(1)
					won[i] = c
				case errors.Is(err, ErrHeld), errors.Is(err, ErrConflict):
				default:
					t.Errorf("claim by %s: %v", refs[i].Member, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if winners.Load() != 1 {
			t.Fatalf("round %d: %d winners", round, winners.Load())
		}
		for _, c := range won {
			if c.Epoch != 0 {
				if c.Epoch != int64(round+1) {
					t.Fatalf("round %d: winner at epoch %d", round, c.Epoch)
				}
				must(t, pg.Release(ctx, c.Token))
			}
		}
	}
}

func TestIsConnectionErrorSeparatesRulesFromTheNetwork(t *testing.T) {
	cases := map[string]struct {
		err  error
		want bool
	}{
		"held":     {&HeldError{Unit: "0.0"}, false},
		"stale":    {fmt.Errorf("checkpoint: %w", &StaleEpochError{}), false},
		"expired":  {fmt.Errorf("renew: %w", ErrLeaseExpired), false},
		"network":  {errors.New("read tcp: connection reset by peer"), true},
		"deadline": {context.DeadlineExceeded, true},
		"nil":      {nil, false},
	}
	for name, c := range cases {
		if got := IsConnectionError(c.err); got != c.want {
			t.Errorf("%s: IsConnectionError(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
}
