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

// Row c: what the SDK costs per row. Two twin unit consumers ("a" and
// "b": same stream, same filter, pinned priority group, as provisioned)
// each receive every published row. pkg/worker (no-op handler, no history
// recorder) drains one, and a plain nats.go pull consumer doing Fetch +
// Ack drains the other, one after the other, both with the SDK's batch
// size. A pair is one publish and both sides' drains of it; a round is
// three pairs, the side that goes first taking turns, so a drift in the
// load others put on this shared machine cancels within it, and the
// round's ratio is the median of its pairs' (pairsPerRound says why).
// Rounds swap the twins, and the stream is purged after each pair. A
// drain is 300,000 rows (3 to 5 s): at 100,000 single rounds ranged 0.86
// to 1.21 and 15 rounds could not settle the ratio. A side's rate is its
// rows over the time from its first row to its consumer's ack floor
// reaching the last. (Side by side would not do: both sides then share
// the server fairly and run at the same rate whatever the SDK costs.)
// One more pair of drains runs under the CPU profiler to name the
// per-row costs.

const (
	defaultDeliveryRows = 300_000
	deliveryBatch       = 64 // the SDK's default FetchBatch
	deliveryGoal        = 0.95
	payloadBytes        = 128
)

var twins = [2]string{"a", "b"}

// deliveryFixture is the twin consumers, the registry and a publisher.
type deliveryFixture struct {
	e    *env
	url  string
	nc   *nats.Conn
	js   jetstream.JetStream
	reg  *worker.Registry
	topo string
	// rows is how many rows each side drains per drain (-delivery-rows).
	rows int
	// cpu is each side's CPU over its drains (sampleCPU), and drains how
	// many each side ran.
	cpu    map[string]cpuByRole
	drains map[string]int
}

func runDelivery(ctx context.Context, e *env) ([]result, error) {
	f, err := newDeliveryFixture(ctx, e)
	if err != nil {
		return nil, err
	}
	defer f.close()
	var plain, sdk, ratios []float64
	for i := range e.o.rounds {
		p, s, q, err := f.round(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", i+1, err)
		}
		plain, sdk, ratios = append(plain, p), append(sdk, s), append(ratios, q)
		e.say("c: round %d: plain %.0f rows/s, SDK %.0f rows/s, median pair ratio %.3fx", i+1, p, s, q)
		if m, lo, hi, ok := ratioInterval(ratios); ok && len(ratios) >= minRounds && narrowEnough(m, lo, hi) {
			break
		}
	}
	prof, plainProf, err := f.profiledRound(ctx)
	if err != nil {
		return nil, fmt.Errorf("profiled round: %w", err)
	}
	r := deliveryResult(plain, sdk, ratios, e.o.rounds, f.rows, prof, plainProf)
	for _, k := range []string{"plain", "SDK"} {
		r.notes = append(r.notes, fmt.Sprintf("CPU per 100,000 rows, %s side (/proc, %d drains, start to last ack): %s",
			k, f.drains[k], f.cpu[k].perRows(f.rows, f.drains[k])))
	}
	return []result{r}, nil
}

// twinLayout is the one-unit layout of a twin consumer.
func twinLayout(name string) natsops.Layout {
	return natsops.Layout{SubjectPrefix: "delivery", ConsumerName: name, Partitions: 1, Shards: 1, Replicas: 1,
		PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}
}

func newDeliveryFixture(ctx context.Context, e *env) (*deliveryFixture, error) {
	srv, err := e.natsServer("delivery")
	if err != nil {
		return nil, err
	}
	f := &deliveryFixture{e: e, url: appURL(srv), topo: "bench/delivery", rows: e.o.deliveryRows,
		cpu: map[string]cpuByRole{}, drains: map[string]int{}}
	if f.nc, err = nats.Connect(f.url, nats.Name("bench publisher")); err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	if f.js, err = jetstream.New(f.nc); err != nil {
		f.close()
		return nil, err
	}
	for _, t := range twins {
		if _, err := natsops.Provision(ctx, f.nc, twinLayout(t)); err != nil {
			f.close()
			return nil, fmt.Errorf("provision twin %s: %w", t, err)
		}
	}
	dsn, err := e.database(ctx, "bench_delivery")
	if err != nil {
		f.close()
		return nil, err
	}
	direct, err := poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 2})
	if err != nil {
		f.close()
		return nil, fmt.Errorf("open registry: %w", err)
	}
	err = activateShape(ctx, direct, f.topo, poolctl.DefaultParams(), 1, 1)
	direct.Close()
	if err != nil {
		f.close()
		return nil, err
	}
	if f.reg, err = worker.OpenRegistry(ctx, worker.RegistryConfig{DSN: dsn, MaxConns: 4}); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *deliveryFixture) close() {
	if f.reg != nil {
		f.reg.Close()
	}
	f.nc.Close()
}

// consumer looks up twin t's consumer.
func (f *deliveryFixture) consumer(ctx context.Context, t string) (jetstream.Consumer, error) {
	l := twinLayout(t)
	return f.js.Consumer(ctx, l.StreamName(0), l.ConsumerDurable(0, 0))
}

// pairsPerRound is how many pairs of drains a round runs; the round's
// ratio is the median of its pairs' ratios. A burst of the host's load
// lands on one drain and moved a round's ratio by up to a fifth when a
// round was the mean of two pairs (full run of 2026-12-06: rounds 0.804
// and 1.113 among rounds near 0.98); the median of three leaves one such
// pair out, and with 300,000-row drains a round costs one pair more.
const pairsPerRound = 3

// round i runs pairsPerRound pairs of drains, each after one publish:
// the SDK drains one twin, the plain consumer the other (swapped every
// round), the side that goes first as sdkFirst says. It returns the
// median of each side's rates and of the pairs' ratios.
func (f *deliveryFixture) round(ctx context.Context, i int) (plain, sdk, ratio float64, err error) {
	var plains, sdks, ratios []float64
	for k := range pairsPerRound {
		p, s, err := f.pair(ctx, twins[i%2], twins[1-i%2], sdkFirst(i, k))
		if err != nil {
			return 0, 0, 0, fmt.Errorf("pair %d: %w", k+1, err)
		}
		f.e.say("c:   pair %d: plain %.0f rows/s, SDK %.0f rows/s (%.3fx)", k+1, p, s, s/p)
		plains, sdks, ratios = append(plains, p), append(sdks, s), append(ratios, s/p)
	}
	return medianFloat(plains), medianFloat(sdks), medianFloat(ratios), nil
}

// sdkFirst says whether pair k of round i starts with the SDK: the pairs
// of a round take turns, and each round starts with the side the one
// before did not, so over two rounds each side goes first as often.
func sdkFirst(i, k int) bool { return (i+k)%2 == 1 }

// pair publishes the rows, has both sides drain them (the SDK first when
// sdkGoesFirst) and purges the stream, so every pair starts from the same,
// empty stream.
func (f *deliveryFixture) pair(ctx context.Context, sdkTwin, plainTwin string, sdkGoesFirst bool) (plain, sdk float64, err error) {
	if err := f.publish(ctx); err != nil {
		return 0, 0, err
	}
	for i := range 2 {
		if (i == 0) == sdkGoesFirst {
			if sdk, err = f.drain(ctx, "SDK", sdkTwin, f.startSDK); err != nil {
				return 0, 0, fmt.Errorf("SDK: %w", err)
			}
			continue
		}
		if plain, err = f.drain(ctx, "plain", plainTwin, f.startPlain); err != nil {
			return 0, 0, fmt.Errorf("plain: %w", err)
		}
	}
	return plain, sdk, f.purge(ctx)
}

// purge empties the twins' stream once both drained it.
func (f *deliveryFixture) purge(ctx context.Context) error {
	s, err := f.js.Stream(ctx, twinLayout(twins[0]).StreamName(0))
	if err != nil {
		return err
	}
	if err := s.Purge(ctx); err != nil {
		return fmt.Errorf("purge the twins' stream: %w", err)
	}
	return nil
}

// drain has start drain twin t and returns its rate. The CPU every
// process used from the start to the last ack is added to kind's
// ("SDK", "plain"; "" counts nowhere).
func (f *deliveryFixture) drain(ctx context.Context, kind, t string, start func(string, *roundClock) (*side, error)) (float64, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	clk := newRoundClock()
	before, err := sampleCPU()
	if err != nil {
		return 0, err
	}
	s, err := start(t, clk)
	if err != nil {
		return 0, err
	}
	werr := f.waitAcked(rctx, t, clk)
	after, cerr := sampleCPU()
	if err := errors.Join(werr, cerr, s.stop(), f.unpin(ctx, t)); err != nil {
		return 0, err
	}
	if kind != "" {
		f.cpu[kind], f.drains[kind] = f.cpu[kind].plus(after.minus(before)), f.drains[kind]+1
	}
	return clk.rate(f.rows), nil
}

// profiledRound is one more round's pair of drains, each with this
// process's CPU profiled from after the publishing to the end of its
// delivery, so the two profiles can be set side by side (go tool pprof
// -diff_base).
func (f *deliveryFixture) profiledRound(ctx context.Context) (sdk, plain *profile, err error) {
	if err := f.publish(ctx); err != nil {
		return nil, nil, err
	}
	if sdk, err = f.profiledDrain(ctx, "c-delivery-sdk", twins[0], f.startSDK); err != nil {
		return nil, nil, err
	}
	plain, err = f.profiledDrain(ctx, "c-delivery-plain", twins[1], f.startPlain)
	return sdk, plain, err
}

func (f *deliveryFixture) profiledDrain(ctx context.Context, name, t string, start func(string, *roundClock) (*side, error)) (*profile, error) {
	prof, err := f.e.startProfile(name)
	if err != nil {
		return nil, err
	}
	_, err = f.drain(ctx, "", t, start)
	prof.stop()
	return prof, err
}

// publish stores f.rows rows in the unit (both twins get them), a
// window of async publishes at a time.
func (f *deliveryFixture) publish(ctx context.Context) error {
	const window = 2000
	payload := []byte(strings.Repeat("r", payloadBytes))
	l := twinLayout(twins[0])
	for i := range f.rows {
		if _, err := f.js.PublishAsync(l.ShardSubject(0, 0, fmt.Sprint(i)), payload); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		if (i+1)%window != 0 && i+1 != f.rows {
			continue
		}
		select {
		case <-f.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// roundClock times one side: from its first row handed to the
// consumer's code to its ack floor reaching the last row.
type roundClock struct {
	first   atomic.Int64 // unix nanoseconds; 0 until the first row
	handled atomic.Int64
	end     time.Time
}

func newRoundClock() *roundClock { return &roundClock{} }

func (c *roundClock) row() {
	if c.handled.Add(1) == 1 {
		c.first.Store(time.Now().UnixNano())
	}
}

func (c *roundClock) rate(rows int) float64 {
	return float64(rows) / c.end.Sub(time.Unix(0, c.first.Load())).Seconds()
}

// waitAcked waits until the side handled all its rows and twin t's
// consumer has nothing pending or unacknowledged, polling every
// millisecond (the same for both sides), and stamps the side's end.
func (f *deliveryFixture) waitAcked(ctx context.Context, t string, clk *roundClock) error {
	cons, err := f.consumer(ctx, t)
	if err != nil {
		return err
	}
	for {
		if clk.handled.Load() >= int64(f.rows) {
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumAckPending == 0 && info.NumPending == 0 {
				clk.end = time.Now()
				return nil
			}
		}
		if err := pause(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("%d of %d rows handled: %w", clk.handled.Load(), f.rows, err)
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

// side is a running consumer of a round.
type side struct {
	cancel context.CancelFunc
	done   chan error
	close  func()
}

func (s *side) stop() error {
	s.cancel()
	err := <-s.done
	s.close()
	return err
}

// startPlain drains twin t as a fleet without the SDK would: Fetch in
// the priority group, Ack each row, until stopped. Like the SDK's puller
// it keeps pulling while the end is observed, so the last, partial
// batch's wait for rows that never come is not counted against it.
func (f *deliveryFixture) startPlain(t string, clk *roundClock) (*side, error) {
	nc, err := nats.Connect(f.url, nats.Name("bench plain consumer"))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := twinLayout(t)
	cons, err := js.Consumer(ctx, l.StreamName(0), l.ConsumerDurable(0, 0))
	if err != nil {
		cancel()
		nc.Close()
		return nil, err
	}
	s := &side{cancel: cancel, done: make(chan error, 1), close: nc.Close}
	go func() { s.done <- pullPlain(ctx, cons, clk) }()
	return s, nil
}

// pullPlain fetches and acks until ctx ends.
func pullPlain(ctx context.Context, cons jetstream.Consumer, clk *roundClock) error {
	for ctx.Err() == nil {
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
	return nil
}

// unpin lifts twin t's pin, so whoever pulls it next is served at once.
func (f *deliveryFixture) unpin(ctx context.Context, t string) error {
	l := twinLayout(t)
	s, err := f.js.Stream(ctx, l.StreamName(0))
	if err != nil {
		return err
	}
	return s.UnpinConsumer(ctx, l.ConsumerDurable(0, 0), natsops.PriorityGroup)
}

// startSDK runs pkg/worker on twin t: it joins, claims the unit, pulls
// and hands each row to a handler that only counts it. Stopping it hands
// the unit over and leaves.
func (f *deliveryFixture) startSDK(t string, clk *roundClock) (*side, error) {
	nc, err := nats.Connect(f.url, nats.Name("bench SDK worker"))
	if err != nil {
		return nil, err
	}
	w, err := worker.New(worker.Options{Topology: f.topo, Member: "worker-0", Registry: f.reg, NATS: nc,
		SubjectPrefix: "delivery", ConsumerName: t, FetchBatch: deliveryBatch,
		Handler: func(context.Context, worker.Row) worker.Settlement { clk.row(); return worker.Ack }})
	if err != nil {
		nc.Close()
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	s := &side{cancel: cancel, done: make(chan error, 1), close: nc.Close}
	go func() { s.done <- w.Run(wctx) }()
	return s, nil
}

func deliveryResult(plain, sdk, ratios []float64, maxRounds, rows int, prof, plainProf *profile) result {
	ratio, lo, hi, ok := ratioInterval(ratios)
	r := result{
		row: "c", what: "SDK delivery, no-op handler, no history (rows/s)",
		measured: fmt.Sprintf("SDK %.0f rows/s", medianFloat(sdk)),
		baseline: fmt.Sprintf("plain Fetch+Ack %.0f rows/s", medianFloat(plain)),
		ratio:    fmt.Sprintf("%.3fx [%.3f, %.3f]", ratio, lo, hi),
		goal: fmt.Sprintf("95%% interval's lower bound >= %.2fx (geometric mean of %d alternating rounds, until the interval is within +/-%.0f%% or %d rounds)",
			deliveryGoal, len(ratios), intervalGoal*100, maxRounds),
		verdict: judge(ok && lo >= deliveryGoal),
	}
	if ok && !narrowEnough(ratio, lo, hi) {
		r.notes = append(r.notes, fmt.Sprintf("the interval [%.3f, %.3f] is still wider than +/-%.0f%% after %d rounds: the machine's load varied more than the SDK's cost",
			lo, hi, intervalGoal*100, len(ratios)))
	}
	r.notes = append(r.notes, fmt.Sprintf("each side drains %d rows of %d bytes %d times per round, in pairs after one publish (the side that goes first alternates), from twin R1 consumers of one stream (pinned priority group), batch %d, one nats-server process; twins swapped every round; a round's ratio is the median of its pairs' ratios",
		rows, payloadBytes, pairsPerRound, deliveryBatch))
	for i := range ratios {
		r.notes = append(r.notes, fmt.Sprintf("round %d: plain %.0f rows/s, SDK %.0f rows/s (medians of its pairs), ratio %.3f (median of its pairs')", i+1, plain[i], sdk[i], ratios[i]))
	}
	r.notes = append(r.notes, "this process's CPU in an extra round's SDK drain under the profiler, delivery only (go tool pprof -top):")
	for _, l := range prof.top(20) {
		r.notes = append(r.notes, "  "+l)
	}
	r.notes = append(r.notes, "the SDK's own per-row path in the same profile (go tool pprof -top -cum -focus=pkg/worker):")
	for _, l := range prof.top(20, "-cum", "-focus=shardkeeper/pkg/worker") {
		r.notes = append(r.notes, "  "+l)
	}
	r.notes = append(r.notes, fmt.Sprintf("the same SDK drain less the plain drain after it (go tool pprof -top -diff_base=%s):", plainProf.path))
	for _, l := range prof.top(20, "-diff_base="+plainProf.path) {
		r.notes = append(r.notes, "  "+l)
	}
	if r.verdict == missed {
		r.why = []string{fmt.Sprintf("the 95%% interval of the ratio is [%.3f, %.3f], its lower bound below %.2f; the profile above shows where this process's CPU went",
			lo, hi, deliveryGoal)}
	}
	return r
}
