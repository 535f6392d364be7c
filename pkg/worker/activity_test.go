package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// The pull windows the SDK reports (issue 21) are what the operator's
// multiplyOwned count rests on: in a handover the old owner's windows end
// before the new owner's begin, on the registry's clock, and the new
// owner's window opens only after its claim committed. Two real workers on
// the fleet's PostgreSQL and NATS; the reports are sampled from the
// registry throughout the handover.
// checks P1, checks P7
func TestAHandoversPullWindowsAreSequential(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1, DrainTimeout: time.Second})
	ctx := context.Background()

	type token struct {
		member      string
		incarnation int64
		epoch       int64
	}
	type window struct{ from, to time.Time }
	var (
		mu      sync.Mutex
		windows = map[token]window{}
	)
	sample := func() error {
		acts, err := f.Registry.Activity(ctx, f.Topology)
		if err != nil {
			return fmt.Errorf("read activity: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, a := range acts {
			if a.Unit != "0.0" {
				continue
			}
			if a.PullingSince.IsZero() {
				return fmt.Errorf("%s reports 0.0 without its pull window's start: %+v", a.Member, a)
			}
			k := token{a.Member, a.Incarnation, a.Epoch}
			w, ok := windows[k]
			if !ok || a.PullingSince.Before(w.from) {
				w.from = a.PullingSince
			}
			if a.ReportedAt.After(w.to) {
				w.to = a.ReportedAt
			}
			windows[k] = w
		}
		return nil
	}
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan error, 1)
	go func() {
		for {
			if err := sample(); err != nil || sctx.Err() != nil {
				sampled <- err
				return
			}
			select {
			case <-sctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	a := startSDK(t, f, "a", nil, nil)
	waitHolding(t, a, 30*time.Second, "0.0")
	// a reported its window at least once before it hands over.
	fleettest.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(windows) == 0 {
			return errors.New("no report of 0.0 yet")
		}
		return nil
	})
	b := startSDK(t, f, "b", nil, nil)
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatalf("a's graceful stop: %v", err)
	}
	waitHolding(t, b, 30*time.Second, "0.0")
	tb := b.token(t, "0.0")
	var bw window
	fleettest.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for k, w := range windows {
			if k.member == "b" && k.epoch == tb.Epoch {
				bw = w
				return nil
			}
		}
		return errors.New("no report of b's window on 0.0 yet")
	})
	stopSampling()
	if err := <-sampled; err != nil {
		t.Fatal(err)
	}

	// b's window opens after its claim committed (the registry's time of
	// the claim event), and after every window of a.
	hist, err := f.Registry.ClaimHistory(ctx, f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	var claimed time.Time
	for _, e := range hist {
		if e.Unit == "0.0" && e.Owner == "b" && e.Epoch == tb.Epoch {
			claimed = e.At
		}
	}
	if claimed.IsZero() {
		t.Fatalf("no claim event of b's token %s in %+v", tb, hist)
	}
	if bw.from.Before(claimed) {
		t.Fatalf("b's window opens at %s, before its claim committed at %s", bw.from.Format(time.StampMicro), claimed.Format(time.StampMicro))
	}
	slack := f.Opts.Params.QueryBound
	if slack == 0 {
		slack = fleettest.FastParams().QueryBound
	}
	mu.Lock()
	defer mu.Unlock()
	for k, w := range windows {
		if k.member != "a" {
			continue
		}
		// Each time lands late by at most the query bound (the report's
		// own delay); on this machine the reports are far quicker.
		if overlap := w.to.Sub(bw.from); overlap > slack {
			t.Fatalf("a's window %s..%s under epoch %d overlaps b's from %s by %s", w.from.Format(time.StampMicro),
				w.to.Format(time.StampMicro), k.epoch, bw.from.Format(time.StampMicro), overlap)
		}
		t.Logf("a's window under epoch %d ended %s before b's opened (b claimed %s after a's last report)",
			k.epoch, bw.from.Sub(w.to), claimed.Sub(w.to))
	}
}

// A slow handler is progress, not a stall: a worker whose handler takes
// 150 ms a row works through a batch of 20 rows for 3 s, longer than the
// operator's stall bound (three renew intervals, 1.2 s here), and its
// activity reports must show its pulls progressing throughout, or the
// operator calls the unit stalled and Ready never comes while a slow sink
// drains a backlog (seen in a cold make test's change of V 32 -> 48).
// The fault took effect: one pull's batch took longer than the bound.
func TestASlowHandlersUnitReportsPullProgressWithinTheStallBound(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1})
	ctx := context.Background()
	const rows, batch, perRow = 40, 20, 150 * time.Millisecond
	bound := 3 * f.Opts.Params.RenewInterval
	var handled atomic.Int64
	slow := func(ctx context.Context, _ worker.Row) worker.Settlement {
		select {
		case <-time.After(perRow):
		case <-ctx.Done():
		}
		handled.Add(1)
		return worker.Ack
	}
	a := startSDK(t, f, "a", slow, func(o *worker.Options) { o.FetchBatch = batch })
	waitHolding(t, a, 30*time.Second, "0.0")
	f.PublishBurst([]ownership.Unit{{Partition: 0, Shard: 0}}, rows)

	// Every report made while rows are handled, judged as the operator
	// does: how long before the report the pull last progressed.
	var worst time.Duration
	reports := map[time.Time]bool{}
	fleettest.Eventually(t, time.Minute, func() error {
		busy := handled.Load() < rows
		acts, err := f.Registry.Activity(ctx, f.Topology)
		if err != nil {
			return err
		}
		for _, r := range acts {
			if r.Unit != "0.0" || r.Member != "a" || r.LastFetch.IsZero() || !busy || handled.Load() == 0 {
				continue
			}
			reports[r.ReportedAt] = true
			worst = max(worst, r.ReportedAt.Sub(r.LastFetch))
		}
		if busy {
			return fmt.Errorf("%d of %d rows handled", handled.Load(), rows)
		}
		return nil
	})
	var longest time.Duration
	for _, r := range a.records(history.KindFetch, "0.0") {
		if r.Rows > 0 {
			longest = max(longest, time.Duration(r.End-r.Start))
		}
	}
	if longest <= bound {
		t.Fatalf("the longest pull with rows took %s, not longer than the stall bound %s: the handler was not slow enough to show anything", longest, bound)
	}
	if len(reports) < 3 {
		t.Fatalf("%d activity reports sampled while rows were handled, want several", len(reports))
	}
	t.Logf("a pull took %s to handle; %d reports sampled meanwhile, the pulls' progress at most %s old (stall bound %s)", longest, len(reports), worst, bound)
	if worst >= bound {
		t.Fatalf("a report said the pull last progressed %s before it, not within the stall bound %s: the operator would call a slow but moving unit stalled", worst, bound)
	}
}

// A quiet unit is not a stalled one: an idle pull completes only when its
// wait runs out, so a FetchWait near or above the operator's stall bound
// (three renew intervals) made every unit without traffic look stalled,
// and Ready never came (a change of V 32 -> 48 under CI load, with 1 s
// pulls against a 1.2 s bound, stalled 4 to 43 units of 192 for five
// minutes). The worker asked for pulls of 2.5 times the bound here; the
// reports sampled over longer than that wait must show pulls completing
// within the bound. The fault took effect: the option's wait exceeds the
// bound and the sampling spans more than one such wait.
func TestAnIdleUnitReportsPullProgressWithinTheStallBound(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1})
	ctx := context.Background()
	bound := 3 * f.Opts.Params.RenewInterval
	wait := bound * 5 / 2
	idle := func(context.Context, worker.Row) worker.Settlement { return worker.Ack }
	a := startSDK(t, f, "a", idle, func(o *worker.Options) { o.FetchWait = wait })
	waitHolding(t, a, 30*time.Second, "0.0")

	var first, last time.Time
	var worst time.Duration
	fleettest.Eventually(t, time.Minute, func() error {
		acts, err := f.Registry.Activity(ctx, f.Topology)
		if err != nil {
			return err
		}
		for _, r := range acts {
			if r.Unit != "0.0" || r.Member != "a" || r.LastFetch.IsZero() {
				continue
			}
			if first.IsZero() {
				first = r.ReportedAt
			}
			last = r.ReportedAt
			worst = max(worst, r.ReportedAt.Sub(r.LastFetch))
		}
		if span := last.Sub(first); span < wait+bound {
			return fmt.Errorf("reports sampled over %s, want %s", span, wait+bound)
		}
		return nil
	})
	var pulls int
	for _, r := range a.records(history.KindFetch, "0.0") {
		if r.Rows == 0 {
			pulls++
		}
	}
	t.Logf("%d empty pulls; reports over %s say the last pull completed at most %s before (FetchWait %s, stall bound %s)", pulls, last.Sub(first), worst, wait, bound)
	if worst >= bound {
		t.Fatalf("a report said the idle unit's pull last completed %s before it, not within the stall bound %s: the operator would call a quiet unit stalled", worst, bound)
	}
}
