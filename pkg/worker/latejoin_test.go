package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// heldFirstJoin is the real registry whose first join reports a timeout
// at once and reaches the registry only when the test lets it: a request
// that arrives long after its caller gave up on it and joined again.
type heldFirstJoin struct {
	poolctl.Registry

	mu    sync.Mutex
	armed bool
	run   chan struct{} // closed: the held join runs
	ran   chan struct{} // closed once it ran
	late  poolctl.Lease
	err   error
	wg    sync.WaitGroup
}

func (r *heldFirstJoin) Rejoin(ctx context.Context, m poolctl.MemberRef, process string) (poolctl.Lease, error) {
	r.mu.Lock()
	held := r.armed
	r.armed = false
	r.mu.Unlock()
	if !held {
		return r.Registry.Rejoin(ctx, m, process)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.ran)
		<-r.run
		l, err := r.Registry.Rejoin(context.Background(), m, process)
		r.mu.Lock()
		r.late, r.err = l, err
		r.mu.Unlock()
	}()
	return poolctl.Lease{}, fmt.Errorf("join held by the test: %w", context.DeadlineExceeded)
}

// Issue 20 (the worker called Join, not Rejoin), the case the registry's
// renewal of a live own incarnation does not cover: the worker's first
// join times out, it joins again, and the first join reaches the registry
// only after the worker's lease lapsed. It then starts a later
// incarnation for the worker's own process, and the worker's renewal is
// refused as stale. The worker must ask the registry (Rejoin naming the
// incarnation it held and its process), which finds the later
// incarnation its own, and carry on under it; taking it for another
// process's and giving up (Run returns an error) leaves the member's units
// to nobody until its lease and the grace pass, and the pod without a
// worker.
//
// checks P3 (liveness)
func TestAWorkersOwnJoinLandingAfterItsLeaseLapsedDoesNotDisplaceIt(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1})
	ctx := context.Background()
	lj := &heldFirstJoin{armed: true, run: make(chan struct{}), ran: make(chan struct{})}
	s := startArmedSDK(t, f, "w-0", nil, func(r *faultyRegistry) {
		lj.Registry = r.Registry
		r.Registry = lj
	}, nil)
	t.Cleanup(func() { lj.wg.Wait() })
	t.Cleanup(func() {
		lj.mu.Lock()
		defer lj.mu.Unlock()
		select {
		case <-lj.run:
		default:
			close(lj.run)
		}
	})
	waitHolding(t, s, 30*time.Second, "0.0")
	first := s.w.Status().Incarnation

	// The worker's lease lapses (renewals held), then its first join
	// lands.
	s.reg.holdRenewals()
	t.Cleanup(s.reg.releaseRenewals)
	fleettest.Eventually(t, 30*time.Second, func() error {
		snap, err := f.Registry.Snapshot(ctx, f.Topology)
		if err != nil {
			return err
		}
		if m := snap.Member("w-0"); m == nil || m.Live {
			return fmt.Errorf("w-0's lease has not lapsed yet")
		}
		return nil
	})
	lj.mu.Lock()
	close(lj.run)
	lj.mu.Unlock()
	select {
	case <-lj.ran:
	case <-time.After(30 * time.Second):
		t.Fatal("setup: the held first join did not return")
	}
	lj.mu.Lock()
	late, lateErr := lj.late, lj.err
	lj.mu.Unlock()
	// The fault took effect: the late join started a later incarnation
	// while the worker still runs under the lapsed one.
	if lateErr != nil || late.Incarnation <= first {
		t.Fatalf("setup: the late join answered %+v, %v; want an incarnation above the worker's %d", late, lateErr, first)
	}
	if st := s.w.Status(); st.Incarnation != first {
		t.Fatalf("setup: the worker left incarnation %d before its renewal was refused (now %d)", first, st.Incarnation)
	}

	t.Logf("the worker's first join landed after incarnation %d lapsed and started incarnation %d for the same process; renewals resume", first, late.Incarnation)
	s.reg.releaseRenewals()
	fleettest.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("Run returned after its own late join superseded its incarnation: %v", err)
		default:
		}
		st := s.w.Status()
		if st.Incarnation == first || st.Fenced || len(st.Held) != 1 {
			return fmt.Errorf("incarnation %d (late join's %d), fenced %v, holding %v", st.Incarnation, late.Incarnation, st.Fenced, st.Held)
		}
		return nil
	})
	select {
	case err := <-s.done:
		t.Fatalf("Run returned by itself: %v", err)
	default:
	}
}
