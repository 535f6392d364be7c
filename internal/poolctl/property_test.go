package poolctl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestTwinAndPostgresAgreeOnRandomOperations applies random operation
// sequences to the twin and to PostgreSQL and requires the same answer to
// every call and the same final state.
func TestTwinAndPostgresAgreeOnRandomOperations(t *testing.T) {
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
			op := rapid.SampledFrom([]string{"join", "renew", "leave", "fence", "unfence", "claim", "claim", "handover",
				"release", "confirm", "checkpoint", "shift", "shift", "pending", "ack", "activate", "retire"}).Draw(rt, "op")
			to := rapid.SampledFrom(append([]string{""}, members...)).Draw(rt, "to")
			shift := rapid.SampledFrom([]time.Duration{5 * time.Second, 20 * time.Second, 45 * time.Second}).Draw(rt, "shift")
			shards := rapid.IntRange(3, 6).Draw(rt, "shards")
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
					res = [3]any{l.MemberRef, l.Slot, l.TTL}
					if err == nil && k == 0 {
						leases[m] = l.MemberRef
					}
				case "renew":
					var l Lease
					l, err = r.Renew(ctx, ref)
					res = [2]any{l.Slot, l.TTL}
				case "leave":
					err = r.Leave(ctx, ref)
				case "fence":
					err = r.Fence(ctx, ref)
				case "unfence":
					err = r.Unfence(ctx, ref)
				case "claim":
					var c Claim
					c, err = r.Claim(ctx, ref, active, u)
					res = [5]any{c.Token, c.Adopted, c.Settled, c.From, c.CheckpointSeq}
					if err == nil && k == 0 {
						tokens[u] = c.Token
					}
				case "handover":
					err = r.Handover(ctx, tok, to)
				case "release":
					err = r.Release(ctx, tok)
				case "confirm":
					var c Confirmation
					c, err = r.ConfirmOwned(ctx, ref, map[string]int64{u: tok.Epoch})
					res = [3]any{c.Held, c.Handover, c.Moved}
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
				}
				outs[k] = fmt.Sprintf("%v %s", res, errClass(err))
			}
			if outs[0] != outs[1] {
				rt.Fatalf("step %d %s by %s on %s: twin %s, postgres %s", i, op, m, u, outs[0], outs[1])
			}
		}
		var sums [2]string
		for k, r := range regs {
			w := &world{ctx: ctx, be: staticBackend{r}, topo: topo}
			sums[k] = w.summarize()
		}
		if sums[0] != sums[1] {
			rt.Fatalf("final states differ:\n twin %s\n   pg %s", sums[0], sums[1])
		}
	})
}

// staticBackend lets summarize read one registry.
type staticBackend struct{ r testRegistry }

func (s staticBackend) name() string         { return "static" }
func (s staticBackend) link(string) Registry { return s.r }
func (s staticBackend) raw() testRegistry    { return s.r }
func (s staticBackend) cut(string)           {}
func (s staticBackend) heal(string)          {}
func (s staticBackend) linkDown(string) bool { return false }

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
