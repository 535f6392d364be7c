package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// Row c: what the SDK costs per row. The same unit consumer (pinned
// priority group, as provisioned) is drained of the same number of rows,
// in alternating rounds, by a plain nats.go pull consumer doing Fetch +
// Ack and by pkg/worker with a no-op handler and no history recorder,
// both with the SDK's batch size. A round's rate is rows over the time
// from the first row handed over to the consumer's ack floor reaching the
// last row. One more SDK round runs under the CPU profiler, apart from
// the measured ones, to name the per-row costs.

const (
	deliveryRows  = 50_000
	deliveryBatch = 64 // the SDK's default FetchBatch
	deliveryGoal  = 0.95
	payloadBytes  = 128
)

// deliveryFixture is the unit, its registry and the connections rounds use.
type deliveryFixture struct {
	e      *env
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	layout natsops.Layout
	reg    *poolctl.PG
	topo   string
	cons   jetstream.Consumer
}

func runDelivery(ctx context.Context, e *env) ([]result, error) {
	f, err := newDeliveryFixture(ctx, e)
	if err != nil {
		return nil, err
	}
	defer f.close()
	var plain, sdk, ratios []float64
	for i := range e.o.rounds {
		p, err := f.round(ctx, f.plain)
		if err != nil {
			return nil, fmt.Errorf("plain round %d: %w", i+1, err)
		}
		s, err := f.round(ctx, f.sdk)
		if err != nil {
			return nil, fmt.Errorf("SDK round %d: %w", i+1, err)
		}
		plain, sdk, ratios = append(plain, p), append(sdk, s), append(ratios, s/p)
		e.say("c: round %d: plain %.0f rows/s, SDK %.0f rows/s (%.3fx)", i+1, p, s, s/p)
	}
	prof, err := e.startProfile("c-delivery-sdk")
	if err != nil {
		return nil, err
	}
	_, err = f.round(ctx, f.sdk)
	prof.stop()
	if err != nil {
		return nil, fmt.Errorf("profiled SDK round: %w", err)
	}
	return []result{deliveryResult(plain, sdk, ratios, prof)}, nil
}

func newDeliveryFixture(ctx context.Context, e *env) (*deliveryFixture, error) {
	srv, err := e.natsServer("delivery")
	if err != nil {
		return nil, err
	}
	f := &deliveryFixture{e: e, url: appURL(srv), topo: "bench/delivery", layout: natsops.Layout{SubjectPrefix: "delivery",
		ConsumerName: "ingest", Partitions: 1, Shards: 1, Replicas: 1, PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}}
	if f.nc, err = nats.Connect(f.url, nats.Name("bench publisher")); err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	if f.js, err = jetstream.New(f.nc); err != nil {
		f.close()
		return nil, err
	}
	if _, err := natsops.Provision(ctx, f.nc, f.layout); err != nil {
		f.close()
		return nil, fmt.Errorf("provision the unit: %w", err)
	}
	if f.cons, err = f.js.Consumer(ctx, f.layout.StreamName(0), f.layout.ConsumerDurable(0, 0)); err != nil {
		f.close()
		return nil, fmt.Errorf("look up the unit consumer: %w", err)
	}
	dsn, err := e.database(ctx, "bench_delivery")
	if err != nil {
		f.close()
		return nil, err
	}
	if f.reg, err = poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 4}); err != nil {
		f.close()
		return nil, fmt.Errorf("open registry: %w", err)
	}
	return f, activateShape(ctx, f.reg, f.topo, poolctl.DefaultParams(), 1, 1)
}

func (f *deliveryFixture) close() {
	if f.reg != nil {
		f.reg.Close()
	}
	f.nc.Close()
}

// round publishes deliveryRows rows, has consume drain them and returns
// the rate.
func (f *deliveryFixture) round(ctx context.Context, consume func(context.Context, *roundClock) error) (float64, error) {
	if err := f.publish(ctx); err != nil {
		return 0, err
	}
	clk := &roundClock{}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := consume(rctx, clk); err != nil {
		return 0, err
	}
	return clk.rate(deliveryRows), nil
}

// publish stores deliveryRows rows in the unit.
func (f *deliveryFixture) publish(ctx context.Context) error {
	payload := []byte(strings.Repeat("r", payloadBytes))
	for i := range deliveryRows {
		if _, err := f.js.PublishAsync(f.layout.ShardSubject(0, 0, fmt.Sprint(i)), payload); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-f.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// roundClock times a round: from the first row handed to the consumer's
// code to the ack floor reaching the last row.
type roundClock struct {
	first   atomic.Int64 // unix nanoseconds; 0 until the first row
	handled atomic.Int64
	end     time.Time
}

func (c *roundClock) row() {
	if c.handled.Add(1) == 1 {
		c.first.Store(time.Now().UnixNano())
	}
}

func (c *roundClock) rate(rows int) float64 {
	d := c.end.Sub(time.Unix(0, c.first.Load()))
	return float64(rows) / d.Seconds()
}

// waitAcked waits until every row of the round was handled and the
// consumer's ack floor reached the end of the stream, polling every
// millisecond (the same for both sides).
func (f *deliveryFixture) waitAcked(ctx context.Context, clk *roundClock) error {
	for clk.handled.Load() < deliveryRows {
		if err := pause(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("%d of %d rows handled: %w", clk.handled.Load(), deliveryRows, err)
		}
	}
	for {
		info, err := f.cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			clk.end = time.Now()
			return nil
		}
		if err := pause(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("ack floor at %d: %w", info.AckFloor.Stream, err)
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// plain drains the unit as a fleet without the SDK would: Fetch in the
// priority group, Ack each row.
func (f *deliveryFixture) plain(ctx context.Context, clk *roundClock) error {
	nc, err := nats.Connect(f.url, nats.Name("bench plain consumer"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, f.layout.StreamName(0), f.layout.ConsumerDurable(0, 0))
	if err != nil {
		return err
	}
	for clk.handled.Load() < deliveryRows {
		batch, err := cons.Fetch(deliveryBatch, jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(natsops.PriorityGroup))
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		for msg := range batch.Messages() {
			clk.row()
			if err := msg.Ack(); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("fetch: %w", err)
		}
	}
	if err := f.waitAcked(ctx, clk); err != nil {
		return err
	}
	// The next side starts unpinned, as a new holder does after UNPIN.
	return f.unpin(ctx)
}

func (f *deliveryFixture) unpin(ctx context.Context) error {
	s, err := f.js.Stream(ctx, f.layout.StreamName(0))
	if err != nil {
		return err
	}
	return s.UnpinConsumer(ctx, f.layout.ConsumerDurable(0, 0), natsops.PriorityGroup)
}

// sdk drains the unit with pkg/worker: it joins, claims the unit, pulls
// and hands each row to a handler that only counts it.
func (f *deliveryFixture) sdk(ctx context.Context, clk *roundClock) error {
	nc, err := nats.Connect(f.url, nats.Name("bench SDK worker"))
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := worker.New(worker.Options{Topology: f.topo, Member: "worker-0", Registry: f.reg, NATS: nc,
		SubjectPrefix: f.layout.SubjectPrefix, ConsumerName: f.layout.ConsumerName, FetchBatch: deliveryBatch,
		Handler: func(context.Context, worker.Row) worker.Settlement { clk.row(); return worker.Ack }})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	werr := f.waitAcked(ctx, clk)
	cancel()
	if err := <-done; err != nil {
		return fmt.Errorf("worker shutdown: %w", err)
	}
	return werr
}

func deliveryResult(plain, sdk, ratios []float64, prof *profile) result {
	ratio := medianFloat(ratios)
	r := result{
		row: "c", what: "SDK delivery, no-op handler, no history (rows/s)",
		measured: fmt.Sprintf("SDK %.0f rows/s", medianFloat(sdk)),
		baseline: fmt.Sprintf("plain Fetch+Ack %.0f rows/s", medianFloat(plain)),
		ratio:    fmt.Sprintf("%.3fx", ratio), goal: fmt.Sprintf(">= %.2fx (median of %d alternating rounds)", deliveryGoal, len(ratios)),
		verdict: judge(ratio >= deliveryGoal),
	}
	r.notes = append(r.notes, fmt.Sprintf("%d rows of %d bytes per round, one R1 unit consumer in the pinned priority group, batch %d, on one nats-server process",
		deliveryRows, payloadBytes, deliveryBatch))
	for i := range ratios {
		r.notes = append(r.notes, fmt.Sprintf("round %d: plain %.0f rows/s, SDK %.0f rows/s, ratio %.3f", i+1, plain[i], sdk[i], ratios[i]))
	}
	r.notes = append(r.notes, "top per-row costs in an extra SDK round under the profiler (go tool pprof -top):")
	for _, l := range prof.top(25) {
		r.notes = append(r.notes, "  "+l)
	}
	if r.verdict == missed {
		r.why = []string{fmt.Sprintf("the median round ratio is %.3f, below %.2f; the profile above shows where this process's CPU went", ratio, deliveryGoal)}
	}
	return r
}
