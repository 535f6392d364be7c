package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// orderLog records, per key, when each row (by its per-key sequence, the
// row's data) was first delivered and when it was acknowledged.
type orderLog struct {
	mu        sync.Mutex
	delivered map[string]map[int]time.Time // key -> seq -> first delivery
	acked     map[string]map[int]time.Time
	units     map[string]map[int]string // key -> seq -> unit delivered in
}

func newOrderLog() *orderLog {
	return &orderLog{delivered: map[string]map[int]time.Time{}, acked: map[string]map[int]time.Time{}, units: map[string]map[int]string{}}
}

func (l *orderLog) deliver(key string, seq int, unit string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.delivered[key] == nil {
		l.delivered[key], l.units[key] = map[int]time.Time{}, map[int]string{}
	}
	if _, ok := l.delivered[key][seq]; !ok {
		l.delivered[key][seq], l.units[key][seq] = time.Now(), unit
	}
}

func (l *orderLog) ack(key string, seq int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.acked[key] == nil {
		l.acked[key] = map[int]time.Time{}
	}
	if _, ok := l.acked[key][seq]; !ok {
		l.acked[key][seq] = time.Now()
	}
}

// gatedHandler records each row's delivery and acknowledgement in l (its
// key from the subject, its per-key sequence from the data); rows of
// shard gated wait for gate before they are acknowledged.
func (l *orderLog) gatedHandler(gated int, gate <-chan struct{}) worker.Handler {
	return func(ctx context.Context, row worker.Row) worker.Settlement {
		key := row.Subject[strings.LastIndexByte(row.Subject, '.')+1:]
		var seq int
		fmt.Sscanf(string(row.Data), "%d", &seq)
		l.deliver(key, seq, row.Unit.String())
		if row.Unit.Shard == gated {
			select {
			case <-gate:
			case <-ctx.Done():
				return worker.Nak
			}
		}
		l.ack(key, seq)
		return worker.Ack
	}
}

func (l *orderLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.acked {
		n += len(m)
	}
	return n
}

// countDelivered counts the rows delivered at least once.
func (l *orderLog) countDelivered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.delivered {
		n += len(m)
	}
	return n
}

// countOf counts the acknowledged rows of keys.
func (l *orderLog) countOf(keys []string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, k := range keys {
		n += len(l.acked[k])
	}
	return n
}

// inversions lists rows first delivered in another unit than an earlier
// row of their key before that earlier row was acknowledged.
func (l *orderLog) inversions() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for key, ds := range l.delivered {
		for seq, at := range ds {
			for earlier := 0; earlier < seq; earlier++ {
				if l.units[key][earlier] == l.units[key][seq] {
					continue
				}
				if acked, ok := l.acked[key][earlier]; !ok || acked.After(at) {
					out = append(out, fmt.Sprintf("%s#%d in %s before %s#%d (in %s) was acknowledged", key, seq, l.units[key][seq], key, earlier, l.units[key][earlier]))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// A change of V from 8 to 16 under per-key order, on pkg/worker and the
// real parts: old unit 0.3 holds a backlog it cannot acknowledge (its
// handler is gated) while the keys it fed move to 0.11 and get newer rows
// there. With the barrier the worker holds those rows in 0.11 until 0.3
// drained to the switch, and delivers keys moved from the other old units
// meanwhile; without it (the same run, no barrier written) the new rows
// are delivered first, which shows the check can fail.
func TestPerKeyBarrierHoldsMovedKeysUntilTheirOldUnitDrained(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(map[bool]string{true: "PerKey", false: "None"}[ordered], func(t *testing.T) {
			runOrderBarrier(t, ordered)
		})
	}
}

func runOrderBarrier(t *testing.T, ordered bool) {
	ctx := context.Background()
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 8, Servers: 1, AckWait: 3 * time.Second, Assignment: natsops.AssignByTransform})
	nc := f.NATS.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const gated = 3 // old unit whose handler waits for the gate
	gate := make(chan struct{})
	log := newOrderLog()
	handler := log.gatedHandler(gated, gate)
	s := startSDK(t, f, "w-0", handler, func(o *worker.Options) { o.FetchWait = 200 * time.Millisecond })
	waitHolding(t, s, 30*time.Second, unitNames(8)...)

	// Keys, each with 5 rows before the switch and 5 after.
	keys := map[string]bool{}
	var moved3, movedOther []string
	for i := 0; len(moved3) < 6 || len(movedOther) < 6; i++ {
		k := fmt.Sprintf("acct%d", i)
		o, n := ownership.PartitionShard(k, 8), ownership.PartitionShard(k, 16)
		switch {
		case o == gated && n != o && len(moved3) < 6:
			moved3 = append(moved3, k)
		case o != gated && n != o && len(movedOther) < 6:
			movedOther = append(movedOther, k)
		default:
			continue
		}
		keys[k] = true
	}
	publish := func(from, to int) {
		t.Helper()
		for seq := from; seq < to; seq++ {
			for k := range keys {
				if _, err := js.Publish(ctx, f.Layout.RowSubject(0, k), []byte(fmt.Sprint(seq))); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	publish(0, 5)
	// The other old units drain their backlog; 0.3 is stuck in its
	// first row.
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := log.count(); n != 5*len(movedOther) {
			return fmt.Errorf("%d rows acknowledged, want the %d of keys outside 0.%d", n, 5*len(movedOther), gated)
		}
		return nil
	})

	// The change, as the operator makes it.
	reg := f.Registry
	wide := f.Layout
	wide.Shards, wide.TransformShards = 16, 8
	if _, err := f.Provision(ctx, wide); err != nil {
		t.Fatal(err)
	}
	var epoch int64
	if ordered {
		pos, err := natsops.StreamPositions(ctx, nc, f.Layout)
		if err != nil {
			t.Fatal(err)
		}
		epoch, err = reg.CreateOrderedPending(ctx, f.Topology, 1, 16, poolctl.BarrierStart{FromShards: 8,
			Before: map[int]uint64{0: pos[0].LastSeq}, Predecessors: []int{0, 1, 2, 3, 4, 5, 6, 7}})
		if err != nil {
			t.Fatal(err)
		}
	} else if epoch, err = reg.CreatePending(ctx, f.Topology, 1, 16); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error { return reg.Activate(ctx, f.Topology, epoch) })
	wide.TransformShards = 0
	if _, err := f.Provision(ctx, wide); err != nil {
		t.Fatal(err)
	}
	f.Layout = wide
	if ordered {
		recordSwitch(t, nc, reg, f, epoch, 8, 16)
		// The operator's lifting loop: old units drained to the switch.
		stop := make(chan struct{})
		defer close(stop)
		go liftLoop(nc, reg, f, epoch, stop)
	}
	publish(5, 10)
	waitHolding(t, s, 30*time.Second, unitNames(16)...)

	// Every row of keys moved from the other old units is delivered
	// while 0.3 is stuck: the barrier holds only what needs holding
	// (without it, the new rows of keys moved from 0.3 are too).
	want := 10 * len(movedOther)
	if !ordered {
		want += 5 * len(moved3)
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := log.count(); n != want {
			return fmt.Errorf("%d rows acknowledged, want %d: every row of the %d keys moved from old units other than 0.%d", n, want, len(movedOther), gated)
		}
		return nil
	})
	if ordered {
		// The rows moved from 0.3 reached their new units and are held
		// there, not delivered.
		fleettest.Eventually(t, 30*time.Second, func() error {
			if n := s.counter(t, "shardkeeper_worker_rows_held_total"); n < float64(5*len(moved3)) {
				return fmt.Errorf("%v rows held, want the %d new rows of keys moved from 0.%d", n, 5*len(moved3), gated)
			}
			return nil
		})
		if inv := log.inversions(); len(inv) > 0 {
			t.Fatalf("%d inversions while 0.%d was stuck: %v", len(inv), gated, inv[:min(5, len(inv))])
		}
	} else {
		fleettest.Eventually(t, 30*time.Second, func() error {
			if inv := log.inversions(); len(inv) == 0 {
				return fmt.Errorf("no inversion yet")
			}
			return nil
		})
	}
	close(gate)
	fleettest.Eventually(t, 60*time.Second, func() error {
		if n := log.count(); n != 10*len(keys) {
			return fmt.Errorf("%d of %d rows acknowledged", n, 10*len(keys))
		}
		return nil
	})
	inv := log.inversions()
	switch {
	case ordered && len(inv) > 0:
		t.Fatalf("%d cross-unit per-key inversions under the barrier: %v", len(inv), inv[:min(5, len(inv))])
	case !ordered && len(inv) == 0:
		t.Fatal("no inversion without the barrier: the check cannot tell")
	}
	t.Logf("ordered=%v: %d rows, %d inversions, %v rows held", ordered, log.count(), len(inv), s.counter(t, "shardkeeper_worker_rows_held_total"))
}

type natsConn = *nats.Conn

// unitNames are units 0.0 to 0.(v-1).
func unitNames(v int) []string {
	out := make([]string, v)
	for i := range out {
		out[i] = fmt.Sprintf("0.%d", i)
	}
	return out
}

// recordSwitch finds and records the stream's switch, as the operator's
// OrderBarrier step does.
func recordSwitch(t *testing.T, nc natsConn, reg *poolctl.PG, f *fleettest.Fleet, epoch int64, from, to int) {
	t.Helper()
	ctx := context.Background()
	b, err := reg.OrderBarrier(ctx, f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	pos, err := natsops.StreamPositions(ctx, nc, f.Layout)
	if err != nil || !pos[0].Routed {
		t.Fatalf("stream positions %+v, %v: want the transform on %d shards", pos, err, to)
	}
	pb, _ := b.Partition(0)
	seq, err := ownership.FindSwitch(pb.BeforeSeq, pos[0].LastSeq, func(seq uint64) (ownership.Routing, error) {
		row, ok, err := natsops.RowAt(ctx, nc, f.Layout, 0, seq)
		if err != nil || !ok {
			return ownership.RoutedEither, err
		}
		return ownership.RoutedBy(row.Key, row.Shard, from, to), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.RecordSwitch(ctx, f.Topology, epoch, 0, seq); err != nil {
		t.Fatal(err)
	}
}

// liftLoop lifts old units drained to the switch until stop closes.
func liftLoop(nc natsConn, reg *poolctl.PG, f *fleettest.Fleet, epoch int64, stop chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		b, err := reg.OrderBarrier(ctx, f.Topology)
		if err != nil || b == nil {
			continue
		}
		pb, _ := b.Partition(0)
		var lift []int
		for _, old := range pb.Waiting() {
			if d, err := natsops.DrainedTo(ctx, nc, f.Layout, 0, old, pb.SwitchSeq); err == nil && d.Drained {
				lift = append(lift, old)
			}
		}
		if len(lift) > 0 {
			_ = reg.LiftPredecessors(ctx, f.Topology, epoch, 0, lift)
		}
	}
}

// A change of V that moves keys into units that existed before (8 -> 12:
// a key of old shard 3 can move to 0.7): the worker holding 0.7 keeps
// pulling it across the activation, and the transform moves in the
// operator's activating reconcile, so rows of moved keys can reach 0.7
// before the worker's next registry read shows the new epoch active.
// The barrier must already be in its permission then: the operator
// writes it before the freeze is acknowledged, and a worker acknowledges
// the freeze only with the barrier it read published to its pullers. A
// slow tick (3 s) widens the window; 0.3's handler is gated, so a moved
// key's new row delivered in 0.7 meanwhile is an inversion.
func TestPerKeyBarrierHoldsKeysMovedIntoAUnitHeldAcrossTheActivation(t *testing.T) {
	ctx := context.Background()
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 8, Servers: 1, AckWait: 3 * time.Second, Assignment: natsops.AssignByTransform})
	nc := f.NATS.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const gated, from, to = 3, 8, 12
	gate := make(chan struct{})
	log := newOrderLog()
	handler := log.gatedHandler(gated, gate)
	s := startSDK(t, f, "w-0", handler, func(o *worker.Options) {
		o.FetchWait = 200 * time.Millisecond
		o.TickInterval = 3 * time.Second
	})
	waitHolding(t, s, 30*time.Second, unitNames(from)...)

	// Keys of old shard 3 that move into units 0.0 to 0.7.
	var keys []string
	for i := 0; len(keys) < 6; i++ {
		k := fmt.Sprintf("acct%d", i)
		if o, n := ownership.PartitionShard(k, from), ownership.PartitionShard(k, to); o == gated && n != o && n < from {
			keys = append(keys, k)
		}
	}
	publish := func(seq int) {
		t.Helper()
		for _, k := range keys {
			if _, err := js.Publish(ctx, f.Layout.RowSubject(0, k), []byte(fmt.Sprint(seq))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0) // waits in 0.3, whose handler is gated
	fleettest.Eventually(t, 30*time.Second, func() error {
		if log.countDelivered() == 0 {
			return fmt.Errorf("0.%d has not taken its first row yet", gated)
		}
		return nil
	})

	// The change, as the operator makes it: the pending epoch written
	// with its barrier, every live member's freeze acknowledgement, the
	// activation, and the transform moved at once.
	reg := f.Registry
	epoch, activated := changeVUnderBarrier(t, f, nc, from, to)
	publish(1)
	// The fault took effect: the rows reached the units the keys moved
	// to while the worker had not read the registry since (the next tick
	// is up to 3 s after the one that acknowledged the freeze).
	fleettest.Eventually(t, 10*time.Second, func() error {
		if pending := movedRowsWaiting(ctx, t, js, f, keys, from, to); pending > 0 {
			return fmt.Errorf("%d moved rows not yet taken by their new units", pending)
		}
		return nil
	})
	taken := time.Since(activated)
	recordSwitch(t, nc, reg, f, epoch, from, to)
	stop := make(chan struct{})
	defer close(stop)
	go liftLoop(nc, reg, f, epoch, stop)
	waitHolding(t, s, 30*time.Second, unitNames(to)...)
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("%d inversions, the moved rows taken %s after the activation: %v", len(inv), taken.Round(time.Millisecond), inv[:min(5, len(inv))])
	}

	// The same barrier across a restart: w-0 is cut off from the registry
	// (it fences itself) and a new process under its name re-homes its
	// units once the old lease and the grace lapsed. Its registry reads
	// are held, so the only thing that can keep it from delivering the
	// moved keys' rows before it knows the barrier is waiting for one.
	s.reg.holdRenewals()
	t.Cleanup(s.reg.releaseRenewals)
	var heldReads func()
	s2 := startArmedSDK(t, f, "w-0", handler, func(r *faultyRegistry) { heldReads = r.holdSnapshots(t) }, func(o *worker.Options) {
		o.FetchWait = 200 * time.Millisecond
	})
	fleettest.Eventually(t, 60*time.Second, func() error {
		if st := s2.w.Status(); st.Fenced || len(st.Held) != to {
			return fmt.Errorf("the new process holds %v (fenced %v), want every unit re-homed", st.Held, st.Fenced)
		}
		return nil
	})
	rehomed := time.Now()
	fleettest.Eventually(t, 10*time.Second, func() error {
		if d := time.Since(rehomed); d < 2*time.Second {
			return fmt.Errorf("watching the re-homed units for %s", d.Round(time.Millisecond))
		}
		return nil
	})
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("%d inversions after a new process re-homed the units without reading the registry: %v", len(inv), inv[:min(5, len(inv))])
	}
	heldReads()
	close(gate)
	fleettest.Eventually(t, 60*time.Second, func() error {
		if n := log.count(); n != 2*len(keys) {
			return fmt.Errorf("%d of %d rows acknowledged", n, 2*len(keys))
		}
		return nil
	})
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("%d cross-unit per-key inversions: %v", len(inv), inv[:min(5, len(inv))])
	}
	t.Logf("moved rows taken by their new units %s after the activation; %v rows held", taken.Round(time.Millisecond), s.counter(t, "shardkeeper_worker_rows_held_total"))
}

// changeVUnderBarrier changes partition 0's V from from to to as the
// operator does under PerKey: the new units provisioned with the
// transform still on from, the pending epoch written with its barrier
// (the stream's last sequence as the sequence before the switch), the
// activation once every live member acknowledged the freeze, and the
// transform moved. It returns the epoch and when it was activated; f's
// layout is the new one after it.
func changeVUnderBarrier(t *testing.T, f *fleettest.Fleet, nc natsConn, from, to int) (int64, time.Time) {
	t.Helper()
	ctx := context.Background()
	wide := f.Layout
	wide.Shards, wide.TransformShards = to, from
	if _, err := f.Provision(ctx, wide); err != nil {
		t.Fatal(err)
	}
	pos, err := natsops.StreamPositions(ctx, nc, f.Layout)
	if err != nil {
		t.Fatal(err)
	}
	preds, err := ownership.MovingShards(from, to)
	if err != nil {
		t.Fatal(err)
	}
	epoch, err := f.Registry.CreateOrderedPending(ctx, f.Topology, 1, to, poolctl.BarrierStart{FromShards: from,
		Before: map[int]uint64{0: pos[0].LastSeq}, Predecessors: preds})
	if err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error { return f.Registry.Activate(ctx, f.Topology, epoch) })
	activated := time.Now()
	wide.TransformShards = 0
	if _, err := f.Provision(ctx, wide); err != nil {
		t.Fatal(err)
	}
	f.Layout = wide
	return epoch, activated
}

// movedRowsWaiting counts the rows of keys not yet delivered by the
// consumers of the units they moved to.
func movedRowsWaiting(ctx context.Context, t *testing.T, js jetstream.JetStream, f *fleettest.Fleet, keys []string, from, to int) int {
	t.Helper()
	n := 0
	seen := map[int]bool{}
	for _, k := range keys {
		s := ownership.PartitionShard(k, to)
		if seen[s] {
			continue
		}
		seen[s] = true
		c, err := js.Consumer(ctx, f.Layout.StreamName(0), f.Layout.ConsumerDurable(0, s))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n += int(info.NumPending)
	}
	return n
}

// A new unit that holds more moved rows than NATS's default max ack
// pending (1000) still delivers its unmoved keys: 8 -> 12 moves keys of
// old shard 3 into unit 0.target, which also keeps keys of its own. 0.3's
// handler is gated, so the barrier holds every moved row in 0.target;
// the unit consumers are provisioned with the layout's max_ack_pending
// (DefaultMaxAckPending), so the unmoved keys' rows published after the
// held ones are still fetched and delivered. With max_ack_pending 1000
// (NATS's default, what the layout set before spec.nats.maxAckPending)
// the unit stops receiving at 1000 held rows and the unmoved rows wait
// for the barrier.
func TestPerKeyBarrierHoldingMoreThanOneThousandRowsLetsUnmovedKeysFlow(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Partitions: 1, Shards: 8, Servers: 1, AckWait: 3 * time.Second, Assignment: natsops.AssignByTransform})
	nc := f.NATS.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const gated, from, to, target = 3, 8, 12, 7
	const movedRows = 1200 // above NATS's default max ack pending
	gate := make(chan struct{})
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	log := newOrderLog()
	s := startSDK(t, f, "w-0", log.gatedHandler(gated, gate), func(o *worker.Options) { o.FetchWait = 200 * time.Millisecond })
	waitHolding(t, s, 30*time.Second, unitNames(from)...)

	var moved, unmoved []string
	for i := 0; len(moved) < 12 || len(unmoved) < 4; i++ {
		k := fmt.Sprintf("acct%d", i)
		o, n := ownership.PartitionShard(k, from), ownership.PartitionShard(k, to)
		switch {
		case o == gated && n == target && len(moved) < 12:
			moved = append(moved, k)
		case o == target && n == target && len(unmoved) < 4:
			unmoved = append(unmoved, k)
		}
	}
	publish := func(keys []string, seqFrom, seqTo int) {
		t.Helper()
		for seq := seqFrom; seq < seqTo; seq++ {
			for _, k := range keys {
				if _, err := js.PublishAsync(f.Layout.RowSubject(0, k), []byte(fmt.Sprint(seq))); err != nil {
					t.Fatal(err)
				}
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatal("publishes not acknowledged within 30s")
		}
	}
	publish(moved, 0, 1) // stuck in 0.3 behind the gate
	fleettest.Eventually(t, 30*time.Second, func() error {
		if log.countDelivered() == 0 {
			return fmt.Errorf("0.%d has not taken its first row yet", gated)
		}
		return nil
	})

	// The change, as the operator makes it.
	reg := f.Registry
	epoch, _ := changeVUnderBarrier(t, f, nc, from, to)
	recordSwitch(t, nc, reg, f, epoch, from, to)
	stop := make(chan struct{})
	defer close(stop)
	go liftLoop(nc, reg, f, epoch, stop)
	waitHolding(t, s, 30*time.Second, unitNames(to)...)

	// The fault took effect: more rows held in 0.target than NATS's
	// default would let it have outstanding.
	publish(moved, 1, 1+movedRows/len(moved))
	fleettest.Eventually(t, 60*time.Second, func() error {
		if n := s.counter(t, "shardkeeper_worker_rows_held_total"); n < movedRows {
			return fmt.Errorf("%v rows held, want all %d moved rows", n, movedRows)
		}
		return nil
	})
	publish(unmoved, 0, 5)
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := log.countOf(unmoved); n != 5*len(unmoved) {
			return fmt.Errorf("%d of %d rows of unmoved keys in 0.%d acknowledged while it holds %d moved rows", n, 5*len(unmoved), target, movedRows)
		}
		return nil
	})
	close(gate)
	total := len(moved)*(1+movedRows/len(moved)) + 5*len(unmoved)
	fleettest.Eventually(t, 60*time.Second, func() error {
		if n := log.count(); n != total {
			return fmt.Errorf("%d of %d rows acknowledged", n, total)
		}
		return nil
	})
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("%d cross-unit per-key inversions: %v", len(inv), inv[:min(5, len(inv))])
	}
}

// A change of N from 2 to 3 partitions (V 1) under the registry's
// barrier of a change of N, on pkg/worker and the real parts, the test
// acting as the operator (which does not write such a barrier yet). Units
// 0.0 and 1.0 feed each other (gcd 1: a key can move 0 -> 1 or 1 -> 0).
// Publishers switch one by one: a switched one sends a moved key's new row
// into the other old partition, where the worker holds it, and then a
// publisher not yet switched sends a row of its own key after it, below
// that stream's S_p. So each old unit holds a row below its own S_p: its
// ack floor stays below S_p and the floor alone never lifts it (asserted:
// the mutual wait the mark exists for). The holders' drained-to marks
// must pass S_p, and once the test lifts by them the held rows flow, in
// key order.
func TestAChangeOfNsOldUnitsMarkPastTheRowsTheyHold(t *testing.T) {
	ctx := context.Background()
	f := fleettest.Start(t, fleettest.Options{Partitions: 2, Shards: 1, Servers: 1, AckWait: 30 * time.Second, Assignment: natsops.AssignByTransform})
	nc := f.NATS.Connect(0)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	log := newOrderLog()
	s := startSDK(t, f, "w-0", log.gatedHandler(-1, nil), func(o *worker.Options) { o.FetchWait = 200 * time.Millisecond })
	waitHolding(t, s, 30*time.Second, "0.0", "1.0")

	// keyMoving finds a key the change moves from partition from to to
	// (or keeps there, from == to).
	keyMoving := func(from, to int, not ...string) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("acct%d", i)
			if ownership.KeyPartition(k, 2) == from && ownership.KeyPartition(k, 3) == to && !slices.Contains(not, k) {
				return k
			}
		}
	}
	k01, k10 := keyMoving(0, 1), keyMoving(1, 0)          // the switched publisher's keys
	slow0, slow1 := keyMoving(0, 0), keyMoving(1, 1, k10) // the slow publisher's
	publish := func(p int, key string, seq int) uint64 {
		t.Helper()
		ack, err := js.Publish(ctx, f.Layout.RowSubject(p, key), []byte(fmt.Sprint(seq)))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	keys := []string{k01, k10, slow0, slow1}
	for seq := range 3 {
		for _, k := range keys {
			publish(ownership.KeyPartition(k, 2), k, seq)
		}
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := log.count(); n != 3*len(keys) {
			return fmt.Errorf("%d of %d rows before the change acknowledged", n, 3*len(keys))
		}
		return nil
	})

	// The change, as the operator would make it with a change of N's
	// barrier: every shard of both old partitions waits.
	reg := f.Registry
	wide := f.Layout
	wide.Partitions = 3
	if _, err := f.Provision(ctx, wide); err != nil {
		t.Fatal(err)
	}
	epoch, err := reg.CreateOrderedPending(ctx, f.Topology, 3, 1, poolctl.BarrierStart{FromPartitions: 2, FromShards: 1,
		Before: map[int]uint64{0: 0, 1: 0}, Predecessors: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 30*time.Second, func() error { return reg.Activate(ctx, f.Topology, epoch) })
	f.Layout = wide
	waitHolding(t, s, 30*time.Second, "0.0", "1.0", "2.0")

	// The switched publisher: moved keys' new rows, into the other old
	// partition. Then the slow one, still on 2 partitions: S_p.
	publish(1, k01, 3)
	publish(0, k10, 3)
	S := map[int]uint64{0: publish(0, slow0, 3), 1: publish(1, slow1, 3)}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := s.counter(t, "shardkeeper_worker_rows_held_total"); n < 2 {
			return fmt.Errorf("%v rows held, want the 2 moved keys' new rows", n)
		}
		if n := log.count(); n != 3*len(keys)+2 {
			return fmt.Errorf("%d rows acknowledged, want %d: every row but the 2 held", n, 3*len(keys)+2)
		}
		return nil
	})
	for p, seq := range S {
		d, err := natsops.DrainedTo(ctx, nc, f.Layout, p, 0, seq)
		if err != nil {
			t.Fatal(err)
		}
		if d.Drained {
			t.Fatalf("unit %d.0 counts as drained to S_p %d by its floor (%+v): the held row below S_p did not keep it low, so the mark is not needed here", p, seq, d)
		}
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		b, err := reg.OrderBarrier(ctx, f.Topology)
		if err != nil {
			return err
		}
		for p, seq := range S {
			pb, _ := b.Partition(p)
			if len(pb.Predecessors) != 1 || pb.Predecessors[0].Mark < seq {
				return fmt.Errorf("unit %d.0's barrier row %+v: want a mark at or past S_p %d", p, pb.Predecessors, seq)
			}
		}
		return nil
	})
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("inversions while the held rows waited: %v", inv)
	}

	// Lifted by the marks, as the operator will: the held rows flow.
	for p, seq := range S {
		if err := reg.RecordSwitch(ctx, f.Topology, epoch, p, seq); err != nil {
			t.Fatal(err)
		}
		if err := reg.LiftPredecessors(ctx, f.Topology, epoch, p, []int{0}); err != nil {
			t.Fatal(err)
		}
	}
	fleettest.Eventually(t, 30*time.Second, func() error {
		if n := log.count(); n != 4*len(keys) {
			return fmt.Errorf("%d of %d rows acknowledged after the lift", n, 4*len(keys))
		}
		return nil
	})
	if inv := log.inversions(); len(inv) > 0 {
		t.Fatalf("inversions: %v", inv)
	}
	t.Logf("S_p %v; held %v rows; marks passed S_p while the floors stayed below", S, s.counter(t, "shardkeeper_worker_rows_held_total"))
}
