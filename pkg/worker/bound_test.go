package worker

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	var wg sync.WaitGroup
	for range each {
		// What a handover's UNPIN does.
		wg.Go(func() { w.bounded(request) })
	}
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

// A handler returning a value outside the Settlement constants is counted
// as abandon, as settle treats it, instead of indexing past the counters.
func TestUnknownSettlementCountsAsAbandon(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []Settlement{-1, Abandon + 1, 42} {
		if m.settledCounter(v) != m.settledCounter(Abandon) {
			t.Fatalf("settlement %d is not counted as abandon", v)
		}
	}
	if m.settledCounter(Ack) == m.settledCounter(Nak) {
		t.Fatal("ack and nak share a counter")
	}
}

// The row's sequences and the pending count are read from the ack subject
// at nats.go's token positions (internal/parser), for every subject shape
// servers send.
func TestAckMetadataReadsEveryAckSubjectShape(t *testing.T) {
	tests := []struct {
		name, subject string
		want          ackFields
	}{
		{"before domains", "$JS.ACK.S_INGEST_0.ingest_0_3.2.1017.998.1700000000000000000.5", ackFields{1017, 2, 5}},
		{"domain and random token", "$JS.ACK._.ACCHASH.S_INGEST_0.ingest_0_3.1.42.40.1700000000000000000.0.RANDOM", ackFields{42, 1, 0}},
		{"without the random token", "$JS.ACK.hub.ACCHASH.S_INGEST_0.ingest_0_3.7.18446744073709551615.3.1700000.12", ackFields{18446744073709551615, 7, 12}},
		{"a token more", "$JS.ACK.hub.ACCHASH.S_INGEST_0.ingest_0_3.7.9.3.1700000.4.RANDOM.FUTURE", ackFields{9, 7, 4}},
		{"nineteen digits", "$JS.ACK.S.C.9999999999999999999.1.2.3.0", ackFields{1, 9999999999999999999, 0}},
		{"leading zeros", "$JS.ACK.S.C.00000000000000000000001.02.3.4.05", ackFields{2, 1, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ackMetadata(tt.subject)
			if !ok || got != tt.want {
				t.Fatalf("ackMetadata = %+v, %v; want %+v", got, ok, tt.want)
			}
			// The second parse reads the tail behind the head the
			// first one cached.
			var acks ackSubjects
			for i := range 2 {
				if got, ok := acks.parse(tt.subject); !ok || got != tt.want {
					t.Fatalf("parse %d = %+v, %v; want %+v", i+1, got, ok, tt.want)
				}
			}
			if acks.head == "" || !strings.HasPrefix(tt.subject, acks.head) {
				t.Fatalf("cached head %q is not the head of %q", acks.head, tt.subject)
			}
		})
	}
	for _, s := range []string{"", "_INBOX.x", "$JS.ACK.a.b.c", "$JS.ACK.S.C.x.1.2.3.4", "$JS.ACK.a.b.c.d.e.f.g.h.i.j",
		"$JS.ACK.S.C.1.18446744073709551616.2.3.4", "$JS.ACK.S.C.1..2.3.4", "$JS.ACK.S.C.1.2.3.4.", "$JS.ACK.S.C.+1.2.3.4.5",
		"$JS.ACK.S.C.1.-2.3.4.5", "$JS.ACK.S.C.1.2.3.4.5x"} {
		if _, ok := ackMetadata(s); ok {
			t.Fatalf("ackMetadata(%q) accepted a subject of another shape", s)
		}
	}
}

// A subject that starts with the cached head but is of the other form
// (its domain and account hash spelled like the head's stream and
// consumer, or the other way round) is read in full, as without the
// cache; one of another consumer replaces the head.
func TestAckSubjectsCacheNeverChangesAnAnswer(t *testing.T) {
	tests := []struct {
		name, first, then string
	}{
		{"old head, newer subject", "$JS.ACK.S.C.1.2.3.4.5", "$JS.ACK.S.C.7.8.1.42.40.1700000000000000000.3.RANDOM"},
		{"newer head, old subject", "$JS.ACK.D.H.1.2.1.2.3.4.5", "$JS.ACK.D.H.1.2.9.8.7"},
		{"newer head, old subject of one token more", "$JS.ACK.D.H.1.2.1.2.3.4.5", "$JS.ACK.D.H.1.2.9.8.7.6"},
		{"another consumer", "$JS.ACK.S.C.1.2.3.4.5", "$JS.ACK.S.D.1.9.3.4.5"},
		{"old head, a token more", "$JS.ACK.S.C.1.2.3.4.5", "$JS.ACK.S.C.1.2.3.4.5.6"},
		{"old head, short tail", "$JS.ACK.S.C.1.2.3.4.5", "$JS.ACK.S.C.1.2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var acks ackSubjects
			if _, ok := acks.parse(tt.first); !ok {
				t.Fatalf("parse(%q) refused it", tt.first)
			}
			want, wantOK := ackMetadata(tt.then)
			if got, ok := acks.parse(tt.then); got != want || ok != wantOK {
				t.Fatalf("with head %q: parse(%q) = %+v, %v; the full parse says %+v, %v", acks.head, tt.then, got, ok, want, wantOK)
			}
		})
	}
}
