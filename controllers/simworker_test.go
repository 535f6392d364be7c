package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// simWorker is a worker member driven straight against the real registry:
// it joins, renews, acknowledges freezes (unless told to hold them), places
// the active epoch's units over the members that are not draining, releases
// what it should no longer hold and claims what it should. It pulls no
// rows; the tests that need rows drained do it themselves. It follows the
// worker protocol of design.md section 7 the way pkg/worker does, in a form
// the tests can hold back step by step.
type simWorker struct {
	reg      poolctl.Registry
	topology string
	name     string
	// holdAcks keeps the worker from acknowledging a pending epoch.
	holdAcks atomic.Bool

	mu     sync.Mutex
	ref    poolctl.MemberRef
	joined bool
	acked  int64
	held   map[string]poolctl.Token
	// pulling is since when each held unit is "pulled": from its claim,
	// as a worker's puller starts after the claim committed.
	pulling map[string]time.Time
	lastErr error

	cancel context.CancelFunc
	done   chan struct{}
}

const simTick = 200 * time.Millisecond

func newSimWorker(reg poolctl.Registry, topology, name string) *simWorker {
	return &simWorker{reg: reg, topology: topology, name: name, held: map[string]poolctl.Token{}, pulling: map[string]time.Time{}}
}

// startSimWorker runs a simWorker until the test ends or stop is called.
func startSimWorker(t *testing.T, reg poolctl.Registry, topology, name string, holdAcks bool) *simWorker {
	t.Helper()
	w := newSimWorker(reg, topology, name)
	w.holdAcks.Store(holdAcks)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() { defer close(w.done); w.run(ctx) }()
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *simWorker) run(ctx context.Context) {
	for {
		if err := w.tick(ctx); err != nil && ctx.Err() == nil {
			w.mu.Lock()
			w.lastErr = err
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(simTick):
		}
	}
}

// stop ends the loop, releases everything and leaves.
func (w *simWorker) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	w.cancel = nil
	_ = w.leave(context.Background())
}

func (w *simWorker) leave(ctx context.Context) error {
	w.releaseAll(ctx)
	w.mu.Lock()
	ref, joined := w.ref, w.joined
	w.mu.Unlock()
	if !joined {
		return nil
	}
	return w.reg.Leave(ctx, ref)
}

func (w *simWorker) releaseAll(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for u, tok := range w.held {
		_ = w.reg.Release(ctx, tok)
		delete(w.held, u)
	}
}

func (w *simWorker) holds() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}

func (w *simWorker) isJoined() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.joined
}

func (w *simWorker) join(ctx context.Context) error {
	l, err := w.reg.Join(ctx, w.topology, w.name)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.ref, w.joined, w.acked = l.MemberRef, true, 0
	w.held, w.pulling = map[string]poolctl.Token{}, map[string]time.Time{}
	w.mu.Unlock()
	return nil
}

func (w *simWorker) tick(ctx context.Context) error {
	w.mu.Lock()
	joined, ref := w.joined, w.ref
	w.mu.Unlock()
	if !joined {
		return w.join(ctx)
	}
	if _, err := w.reg.Renew(ctx, ref); err != nil {
		if errors.Is(err, poolctl.ErrLeaseExpired) || errors.Is(err, poolctl.ErrStaleIncarnation) || errors.Is(err, poolctl.ErrNotMember) {
			return w.join(ctx)
		}
		return fmt.Errorf("renew: %w", err)
	}
	snap, err := w.reg.Snapshot(ctx, w.topology)
	if err != nil {
		return err
	}
	frozen := false
	if p := snap.Pending; p != nil {
		frozen = true
		w.mu.Lock()
		acked := w.acked == p.Number
		w.mu.Unlock()
		if !acked && !w.holdAcks.Load() {
			if err := w.reg.AckFreeze(ctx, ref, p.Number); err != nil {
				return fmt.Errorf("ack freeze: %w", err)
			}
			w.mu.Lock()
			w.acked = p.Number
			w.mu.Unlock()
		}
	}
	mine := map[string]bool{}
	me := snap.Member(w.name)
	if a := snap.Active; a != nil && me != nil && me.Live && me.Incarnation == ref.Incarnation && !me.Draining && me.Slot >= 0 {
		var slots []ownership.Slot
		for _, s := range snap.PlacementSlots() {
			slots = append(slots, ownership.Slot(s))
		}
		top := ownership.Topology{Partitions: a.Partitions, Shards: a.Shards}
		for _, u := range ownership.Place(top.Units(), slots).UnitsOf(ownership.Slot(me.Slot)) {
			mine[u.String()] = true
		}
	}
	w.mu.Lock()
	for u, tok := range w.held {
		if !mine[u] {
			if err := w.reg.Release(ctx, tok); err != nil && !errors.Is(err, poolctl.ErrStaleEpoch) {
				w.mu.Unlock()
				return fmt.Errorf("release %s: %w", u, err)
			}
			delete(w.held, u)
			delete(w.pulling, u)
		}
	}
	w.mu.Unlock()
	if err := w.reportActivity(ctx, ref); err != nil {
		return err
	}
	if frozen || snap.Active == nil {
		return nil
	}
	units := make([]string, 0, len(mine))
	for u := range mine {
		units = append(units, u)
	}
	sort.Strings(units)
	for _, u := range units {
		w.mu.Lock()
		_, have := w.held[u]
		w.mu.Unlock()
		if have {
			continue
		}
		c, err := w.reg.Claim(ctx, ref, snap.Active.Number, u)
		switch {
		case errors.Is(err, poolctl.ErrHeld), errors.Is(err, poolctl.ErrFrozen), errors.Is(err, poolctl.ErrEpochMoved):
			continue
		case err != nil:
			return fmt.Errorf("claim %s: %w", u, err)
		}
		w.mu.Lock()
		w.held[u] = c.Token
		w.pulling[u] = time.Now()
		w.mu.Unlock()
	}
	return nil
}

// reportActivity reports every held unit as pulled, with a row, just now,
// under its token since its claim: a simWorker pulls nothing, but plays a
// worker whose units flow.
func (w *simWorker) reportActivity(ctx context.Context, ref poolctl.MemberRef) error {
	w.mu.Lock()
	units := make([]poolctl.UnitActivity, 0, len(w.held))
	for u, tok := range w.held {
		units = append(units, poolctl.UnitActivity{Unit: u, Epoch: tok.Epoch, SincePullStart: time.Since(w.pulling[u])})
	}
	w.mu.Unlock()
	if err := w.reg.ReportActivity(ctx, ref, units); err != nil {
		return fmt.Errorf("report activity: %w", err)
	}
	return nil
}

// Environment of a simWorker process started by the test kubelet.
const (
	simWorkerEnv   = "SHARDKEEPER_SIM_WORKER"
	simDSNEnv      = "SHARDKEEPER_SIM_DSN"
	simTopologyEnv = "SHARDKEEPER_SIM_TOPOLOGY"
	simProbeEnv    = "SHARDKEEPER_SIM_PROBE_ADDR"
)

// runSimWorkerProcess is the pod program of the pod-roll test: a simWorker
// named after its pod, Ready once joined. On SIGTERM it reports how many
// units it held (the roll must have drained it to zero), then hands
// everything over and leaves.
func runSimWorkerProcess() int {
	pod := os.Getenv("POD_NAME")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: os.Getenv(simDSNEnv), SkipMigrate: true, MaxConns: 2})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim worker:", err)
		return 1
	}
	defer reg.Close()
	w := newSimWorker(reg, os.Getenv(simTopologyEnv), pod)
	http.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.isJoined() {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(rw, "ok")
	})
	go func() { _ = http.ListenAndServe(os.Getenv(simProbeEnv), nil) }()

	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); w.run(ctx) }()
	<-term
	cancel()
	<-loopDone
	w.mu.Lock()
	held, inc := len(w.held), w.ref.Incarnation
	w.mu.Unlock()
	fmt.Printf("sim-worker %s incarnation %d held %d units at SIGTERM\n", pod, inc, held)
	if err := w.leave(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "sim worker leave:", err)
	}
	return 0
}
