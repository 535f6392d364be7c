package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// lateFirstJoin is the real registry whose first join reports a timeout
// at once and reaches the registry only after a later join was granted:
// a request that arrived after its caller had given up on it and joined
// again.
type lateFirstJoin struct {
	poolctl.Registry

	mu      sync.Mutex
	armed   bool
	granted chan poolctl.Lease // the first join granted after the late one was held
	// late is the late join's outcome once it ran.
	late    poolctl.Lease
	lateErr error
	ran     chan struct{}
	wg      sync.WaitGroup
}

func (r *lateFirstJoin) Rejoin(ctx context.Context, m poolctl.MemberRef, process string) (poolctl.Lease, error) {
	r.mu.Lock()
	held := r.armed
	r.armed = false
	r.mu.Unlock()
	if !held {
		l, err := r.Registry.Rejoin(ctx, m, process)
		if err == nil {
			select {
			case r.granted <- l:
			default:
			}
		}
		return l, err
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.ran)
		select {
		case <-r.granted:
		case <-time.After(time.Minute):
		}
		l, err := r.Registry.Rejoin(context.Background(), m, process)
		r.mu.Lock()
		r.late, r.lateErr = l, err
		r.mu.Unlock()
	}()
	return poolctl.Lease{}, fmt.Errorf("join held by the test: %w", context.DeadlineExceeded)
}

// Issue 20: the worker's first join times out and it joins again; the
// first join then reaches the registry. It names the same process, whose
// incarnation is live: the registry renews that incarnation instead of
// starting a later one, and the worker is never superseded. Before, the
// worker joined with Join, the late join took a later incarnation, the
// worker's next renewal was refused as stale, and it took itself for
// displaced by another process: Run returned an error. checks P3
func TestAWorkersOwnLateJoinDoesNotDisplaceIt(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	lj := &lateFirstJoin{armed: true, granted: make(chan poolctl.Lease, 1), ran: make(chan struct{})}
	s := startArmedSDK(t, f, "w-0", nil, func(r *faultyRegistry) {
		lj.Registry = r.Registry
		r.Registry = lj
	}, nil)
	t.Cleanup(lj.wg.Wait)
	select {
	case <-lj.ran:
	case <-time.After(90 * time.Second):
		t.Fatal("setup: the held first join never ran")
	}
	lj.mu.Lock()
	late, lateErr := lj.late, lj.lateErr
	lj.mu.Unlock()
	// The fault took effect: the late join reached the registry after the
	// retry was granted, and was answered with that incarnation.
	if lateErr != nil || late.Incarnation == 0 {
		t.Fatalf("setup: the late join failed: %+v, %v", late, lateErr)
	}
	rows := f.PublishBurst([]ownership.Unit{{Partition: 0, Shard: 0}, {Partition: 0, Shard: 1}}, 50)
	fleettest.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("Run returned: %w", err)
		default:
		}
		st := s.w.Status()
		if st.Fenced || len(st.Held) != 2 {
			return fmt.Errorf("incarnation %d, fenced %v, holding %v", st.Incarnation, st.Fenced, st.Held)
		}
		if n := len(s.records(history.KindAck, "")); n < len(rows) {
			return fmt.Errorf("acked %d of %d rows", n, len(rows))
		}
		return nil
	})
	if st := s.w.Status(); st.Incarnation != late.Incarnation {
		t.Fatalf("the worker's incarnation is %d; the late join was answered with %d, want the same (renewed, not superseded)",
			st.Incarnation, late.Incarnation)
	}
	if n := s.counter(t, "shardkeeper_worker_joins_total"); n != 1 {
		t.Fatalf("joins_total %v, want 1: the late join superseded the worker's incarnation", n)
	}
	if n := s.counter(t, "shardkeeper_worker_fences_total"); n != 0 {
		t.Fatalf("fences_total %v, want 0", n)
	}
	select {
	case err := <-s.done:
		t.Fatalf("Run returned by itself: %v", err)
	default:
	}
}
