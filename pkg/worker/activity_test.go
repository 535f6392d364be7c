package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
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
