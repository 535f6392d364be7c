package worker

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// A handover's UNPINs and the first UNPIN or RESET of new holders' pullers
// take the same slots, so TakeoverConcurrency bounds them together.
func TestHandoverAndTakeoverRequestsShareOneBound(t *testing.T) {
	const bound, each = 3, 10
	w := &Worker{opts: Options{TakeoverConcurrency: bound}, slots: make(chan struct{}, bound)}
	var inFlight, peak, done atomic.Int64
	gate := make(chan struct{})
	request := func() {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-gate
		inFlight.Add(-1)
		done.Add(1)
	}
	units := make([]ownership.Unit, each)
	for i := range units {
		units[i] = ownership.Unit{Partition: 0, Shard: i}
	}
	var wg sync.WaitGroup
	wg.Go(func() { w.forEachBounded(units, func(ownership.Unit) { request() }) })
	for range each {
		// What puller.prepare does around its UNPIN and RESET.
		wg.Go(func() {
			slots := w.takeoverSlots()
			slots <- struct{}{}
			defer func() { <-slots }()
			request()
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight.Load() < bound {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests in flight after 10s, want %d", inFlight.Load(), bound)
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	if peak.Load() != bound || done.Load() != 2*each {
		t.Fatalf("peak %d requests in flight (bound %d), %d of %d done", peak.Load(), bound, done.Load(), 2*each)
	}
}

func TestInBatchesSplitsOnlyWhenAsked(t *testing.T) {
	xs := []int{1, 2, 3, 4, 5}
	tests := []struct {
		size int
		want [][]int
	}{
		{0, [][]int{{1, 2, 3, 4, 5}}},
		{1, [][]int{{1}, {2}, {3}, {4}, {5}}},
		{2, [][]int{{1, 2}, {3, 4}, {5}}},
		{5, [][]int{{1, 2, 3, 4, 5}}},
		{9, [][]int{{1, 2, 3, 4, 5}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("size %d", tt.size), func(t *testing.T) {
			got := inBatches(xs, tt.size)
			if !slices.EqualFunc(got, tt.want, slices.Equal[[]int]) {
				t.Fatalf("inBatches(%v, %d) = %v, want %v", xs, tt.size, got, tt.want)
			}
		})
	}
}
