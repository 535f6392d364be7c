package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// lines keeps the log lines written at the default level (V(0)).
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, prefix+" "+args)
}

// newLines keeps a worker's default-level lines, and prints them when t
// fails.
func newLines(t *testing.T) *lines {
	l := &lines{}
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Logf("the worker's default-level lines:\n%s", strings.Join(l.all, "\n"))
		}
	})
	return l
}

// matching returns the lines that contain every one of subs.
func (l *lines) matching(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, s := range l.all {
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// labelled reads one child of a worker counter vector.
func (s *sdkWorker) labelled(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Issue 21 (walkthrough): a worker whose consumer vanished said nothing at
// the default log level, counted nothing, and stayed ready. The consumer
// of a held unit is deleted under a running worker: the failure is logged
// at the default level (at a bounded rate), counted, and turns readiness
// off once it has lasted FetchFailureBound; when the consumer is
// provisioned again (as the operator does), pulls, deliveries and
// readiness come back. The other unit keeps delivering throughout.
func TestAVanishedConsumerIsLoggedCountedAndMakesTheWorkerNotReady(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	logs := newLines(t)
	const bound = 3 * time.Second
	s := startSDK(t, f, "w-0", nil, func(o *worker.Options) {
		o.Logger = funcr.New(logs.add, funcr.Options{Verbosity: 0})
		o.FetchFailureBound = bound
	})
	waitHolding(t, s, 30*time.Second, "0.0", "0.1")
	fleettest.Eventually(t, 10*time.Second, s.w.Readiness)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		t.Fatal(err)
	}
	ref := f.Layout.ConsumerRef(natsops.Unit{Partition: 0, Shard: 1})
	// Taken before the deletion: the worker's first failed fetch can come
	// before the check below returns, and the bound runs from that failure.
	deleted := time.Now()
	if err := js.DeleteConsumer(ctx, ref.Stream, ref.Name); err != nil {
		t.Fatalf("delete the consumer of 0.1: %v", err)
	}
	// The fault took effect: the consumer is gone.
	if _, err := js.Consumer(ctx, ref.Stream, ref.Name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("setup: the consumer of 0.1 after its deletion: %v, want not found", err)
	}

	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(logs.matching("failed", `"unit"="0.1"`, `"reason"="consumer_missing"`)) == 0 {
			return errors.New("no default-level line about 0.1's missing consumer yet")
		}
		if n := s.labelled(t, "shardkeeper_worker_fetch_errors_total", "reason", "consumer_missing"); n == 0 {
			return errors.New("fetch_errors_total{reason=consumer_missing} is 0")
		}
		return nil
	})
	fleettest.Eventually(t, bound+30*time.Second, func() error {
		err := s.w.Readiness()
		if err == nil || !strings.Contains(err.Error(), "0.1") {
			return fmt.Errorf("readiness %v, want not ready naming 0.1", err)
		}
		return nil
	})
	notReadyAfter := time.Since(deleted)
	if notReadyAfter < bound {
		t.Fatalf("not ready %s after the deletion, before the bound %s", notReadyAfter, bound)
	}
	// The unit whose consumer is fine keeps delivering.
	rows := f.PublishBurstAs("fine", []ownership.Unit{{Partition: 0, Shard: 0}}, 20)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(s.records(history.KindAck, "0.0")); n < len(rows) {
			return fmt.Errorf("0.0 acked %d of %d rows", n, len(rows))
		}
		return nil
	})
	// Rate-limited: more failures than lines, and at most one line per
	// 30s of failing (plus the first).
	failures := s.labelled(t, "shardkeeper_worker_fetch_errors_total", "reason", "consumer_missing")
	logged := len(logs.matching("failed", `"unit"="0.1"`))
	if max := 1 + int(time.Since(deleted)/(30*time.Second)); logged > max || float64(logged) >= failures {
		t.Fatalf("%d default-level lines for %v failures in %s: want at most %d and fewer than the failures",
			logged, failures, time.Since(deleted).Round(time.Millisecond), max)
	}
	t.Logf("not ready %s after the deletion; %v failures, %d lines logged", notReadyAfter.Round(time.Millisecond), failures, logged)

	// The consumer comes back as the operator provisions it.
	if _, err := f.Provision(ctx, f.Layout); err != nil {
		t.Fatalf("provision again: %v", err)
	}
	fleettest.Eventually(t, 30*time.Second, s.w.Readiness)
	if len(logs.matching("Fetch recovered", `"unit"="0.1"`)) == 0 {
		t.Fatal("ready again without a line saying 0.1's pulls recovered")
	}
	rows = f.PublishBurstAs("back", []ownership.Unit{{Partition: 0, Shard: 1}}, 20)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(s.records(history.KindAck, "0.1")); n < len(rows) {
			return fmt.Errorf("0.1 acked %d of %d rows after its consumer came back", n, len(rows))
		}
		return nil
	})
}

// A puller that starts while its unit's consumer is missing (a worker
// restarted after the consumer was deleted; a new claim after a fence)
// fails the UNPIN every new holder sends before its first pull, for as
// long as the consumer is gone. It stalled there silently: nothing
// logged at the default level, nothing counted, ready. Now those
// failures are logged, counted and judged by readiness as failed pulls
// are, and the unit delivers once the consumer is provisioned again.
func TestAConsumerMissingWhenItsPullerStartsIsLoggedCountedAndMakesTheWorkerNotReady(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		t.Fatal(err)
	}
	ref := f.Layout.ConsumerRef(natsops.Unit{Partition: 0, Shard: 1})
	if err := js.DeleteConsumer(ctx, ref.Stream, ref.Name); err != nil {
		t.Fatalf("delete the consumer of 0.1: %v", err)
	}
	if _, err := js.Consumer(ctx, ref.Stream, ref.Name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("setup: the consumer of 0.1 after its deletion: %v, want not found", err)
	}

	logs := newLines(t)
	const bound = 3 * time.Second
	s := startSDK(t, f, "w-0", nil, func(o *worker.Options) {
		o.Logger = funcr.New(logs.add, funcr.Options{Verbosity: 0})
		o.FetchFailureBound = bound
	})
	// The fault took effect: the worker holds 0.1, whose consumer is gone.
	waitHolding(t, s, 30*time.Second, "0.0", "0.1")

	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(logs.matching("UNPIN", "failed", `"unit"="0.1"`, `"reason"="consumer_missing"`)) == 0 {
			return errors.New("no default-level line about 0.1's failing UNPIN yet")
		}
		if n := s.labelled(t, "shardkeeper_worker_fetch_errors_total", "reason", "consumer_missing"); n == 0 {
			return errors.New("fetch_errors_total{reason=consumer_missing} is 0")
		}
		return nil
	})
	fleettest.Eventually(t, bound+30*time.Second, func() error {
		err := s.w.Readiness()
		if err == nil || !strings.Contains(err.Error(), "0.1") {
			return fmt.Errorf("readiness %v, want not ready naming 0.1", err)
		}
		return nil
	})

	if _, err := f.Provision(ctx, f.Layout); err != nil {
		t.Fatalf("provision again: %v", err)
	}
	fleettest.Eventually(t, 30*time.Second, s.w.Readiness)
	if len(logs.matching("recovered", `"unit"="0.1"`)) == 0 {
		t.Fatal("ready again without a line saying 0.1 recovered")
	}
	rows := f.PublishBurstAs("back", []ownership.Unit{{Partition: 0, Shard: 1}}, 20)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := len(s.records(history.KindAck, "0.1")); n < len(rows) {
			return fmt.Errorf("0.1 acked %d of %d rows after its consumer came back", n, len(rows))
		}
		return nil
	})
}
