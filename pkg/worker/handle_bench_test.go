package worker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// benchMsg is a delivered row whose settlement costs nothing, so that
// BenchmarkHandleRow times only what the SDK adds to a plain consumer's
// Ack per row (make bench row c's gap).
type benchMsg struct {
	jetstream.Msg
	subject, reply string
	data           []byte
}

func (m *benchMsg) Subject() string      { return m.subject }
func (m *benchMsg) Reply() string        { return m.reply }
func (m *benchMsg) Data() []byte         { return m.data }
func (m *benchMsg) Headers() nats.Header { return nil }
func (m *benchMsg) Ack() error           { return nil }

// BenchmarkHandleRow is the SDK's per-row path (the P1 checks, the row,
// the handler call, the settlement's bookkeeping and the progress count)
// with a no-op handler and an Ack that does nothing.
func BenchmarkHandleRow(b *testing.B) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	unit := ownership.Unit{Partition: 0, Shard: 0}
	token := poolctl.Token{Topology: "bench/t", Unit: "0.0", Member: "w", Epoch: 7}
	w := &Worker{opts: Options{Handler: func(context.Context, Row) Settlement { return Ack }}, metrics: m,
		inbox: make(chan member.Event, 1024), loopDone: make(chan struct{})}
	w.perm.Store(&member.Permission{Units: map[ownership.Unit]poolctl.Token{unit: token}, FenceDue: time.Duration(1 << 62)})
	go func() {
		for range w.inbox {
		}
	}()
	defer close(w.inbox)
	p := &puller{w: w, unit: unit, token: token, ctx: context.Background(), heldKeys: map[string]int{}}
	msg := &benchMsg{subject: "delivery.ingest.0.0.12345", data: make([]byte, 128),
		reply: "$JS.ACK.delivery-0.a-0-0.1.123456.123456.1764770000000000000.42"}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.handle(msg, 0)
		p.progress(1, false)
	}
}
