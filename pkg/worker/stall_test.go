package worker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// stall holds the goroutine that logs one message, once armed. Logged
// from the worker's Run goroutine, it stalls the member's core (no timer,
// no reply handled, no action performed) while the pullers go on: the
// in-process form of a process resumed from a pause whose pullers run
// before its core's timer fires.
type stall struct {
	mu   sync.Mutex
	msg  string        // the message that stalls; "" when disarmed
	gate chan struct{} // closed: the stall ends
	at   int64         // history.Now() when it stalled; 0 until then
}

func (s *stall) arm(msg string, gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msg, s.gate = msg, gate
}

func (s *stall) stalledAt() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

// stallSink is a logr sink that logs through the test's and stalls on
// the armed message.
type stallSink struct {
	logr.LogSink
	st *stall
}

func (s stallSink) Info(level int, msg string, kv ...any) {
	s.GetCallStackHelper()() // the worker's line, not this one, heads the log line
	s.LogSink.Info(level, msg, kv...)
	s.st.mu.Lock()
	hit := s.st.msg != "" && msg == s.st.msg
	gate := s.st.gate
	if hit {
		s.st.msg, s.st.at = "", history.Now()
	}
	s.st.mu.Unlock()
	if hit {
		<-gate
	}
}

// GetCallStackHelper is the test sink's, so log lines name the worker's
// files: mutate-real takes the last line a test file printed for the
// failure's message.
func (s stallSink) GetCallStackHelper() func() {
	if h, ok := s.LogSink.(logr.CallStackHelperLogSink); ok {
		return h.GetCallStackHelper()
	}
	return func() {}
}

func (s stallSink) WithValues(kv ...any) logr.LogSink {
	return stallSink{LogSink: s.LogSink.WithValues(kv...), st: s.st}
}

func (s stallSink) WithName(name string) logr.LogSink {
	return stallSink{LogSink: s.LogSink.WithName(name), st: s.st}
}

// Issue 19 (the lazy fence check): a member stops delivering at its fence
// deadline on its own clock whatever its core is doing, because every
// puller checks the deadline the core published before each delivery, not
// only the core's timer. Here the core stalls just after a renewal failed
// (the test's logger holds Run's goroutine inside the log call) while the
// puller goes on with rows published past the deadline. Without the lazy
// check the puller delivers them, after the registry may already have let
// another member adopt the unit.
//
// checks P1, P5
func TestAStalledCoreStillStopsDeliveryAtTheFenceDeadline(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 1})
	ttl := f.Opts.Params.LeaseTTL
	st := &stall{}
	a := startSDK(t, f, "w-0", nil, func(o *worker.Options) {
		o.Logger = logr.New(stallSink{LogSink: o.Logger.GetSink(), st: st})
	})
	waitHolding(t, a, 30*time.Second, "0.0")
	pub := f.StartPublisher(ownership.Topology{Partitions: 1, Shards: 1}, 20)
	t.Cleanup(func() { pub.Stop() })
	fleettest.Eventually(t, 30*time.Second, func() error {
		if len(a.records(history.KindDeliver, "0.0")) == 0 {
			return fmt.Errorf("no row delivered yet")
		}
		return nil
	})

	// The next renewal fails; the core stalls as it logs that.
	end, endStall := gate(t)
	st.arm("Renewal failed", end)
	a.reg.holdRenewals()
	t.Cleanup(a.reg.releaseRenewals)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if st.stalledAt() == 0 {
			return fmt.Errorf("the core has not stalled yet")
		}
		return nil
	})
	lane := len(a.reg.laneLog())
	// The member's fence deadline is at most a lease after its last
	// renewal that succeeded, sent before the stall.
	deadline := st.stalledAt() + int64(ttl)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if now := history.Now(); now <= deadline {
			return fmt.Errorf("%s before the fence deadline", time.Duration(deadline-now))
		}
		return nil
	})
	// The observation: 40 rows published past the deadline (2s at the
	// publisher's rate), and two pulls' wait, while the core stays
	// stalled.
	from := pub.Published()
	fleettest.Eventually(t, 60*time.Second, func() error {
		if n := pub.Published() - from; n < 40 {
			return fmt.Errorf("%d rows published past the deadline", n)
		}
		if past := time.Duration(history.Now() - deadline); past < 2*time.Second {
			return fmt.Errorf("only %s past the deadline", past)
		}
		return nil
	})
	// The fault took effect: the core made no lease call since it
	// stalled, so nothing but the pullers' own check could stop delivery.
	if n := len(a.reg.laneLog()); n != lane {
		t.Fatalf("setup: the core made %d lease calls during the stall: it did not stall", n-lane)
	}
	var late []history.Record
	for _, r := range a.records(history.KindDeliver, "0.0") {
		if r.Start > deadline {
			late = append(late, r)
		}
	}
	if len(late) > 0 {
		t.Fatalf("w-0 delivered %d rows past its fence deadline while its core stalled (the first %s after it, the last %s)",
			len(late), time.Duration(late[0].Start-deadline).Round(time.Millisecond), time.Duration(late[len(late)-1].Start-deadline).Round(time.Millisecond))
	}
	if !a.w.Status().Fenced {
		t.Fatalf("w-0 reports itself unfenced %s past its fence deadline", time.Duration(history.Now()-deadline).Round(time.Millisecond))
	}

	// Once the core runs again the member recovers (its lease lapsed: it
	// joins again) and holds the unit again.
	endStall()
	a.reg.releaseRenewals()
	waitHolding(t, a, 30*time.Second, "0.0")
}
