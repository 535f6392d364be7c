package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// keyOrderInput is one change of V under keyed traffic, with a backlog
// waiting in the old units when the new epoch is activated.
type keyOrderInput struct {
	Name     string
	From, To ownership.Topology
	// Ordering is what the run declares and the checker judges it by.
	// None: the test asserts cross-unit inversions happen, so the check
	// is known to fire. PerKey: the test asserts none; such a row also
	// sets spec.rollout.ordering through Spec.
	Ordering historycheck.Ordering
	// Spec, when set, adapts the ShardTopology before it is created.
	Spec func(*topologyv1.ShardTopology)
	// Backlog is how many rows are published at once just before the
	// change; MinBacklog is how many of them must still be unacknowledged
	// at the activation (the fault took effect).
	Backlog, MinBacklog int
	// SinkDelay is how long each sink write waits while the backlog
	// drains; 0 means keyOrderSinkDelay. A change with many old units
	// needs more: they must drain slower than a loaded machine publishes
	// the burst, or no backlog is left at the activation.
	SinkDelay time.Duration
	// KillOldHolder SIGKILLs, right after the activation, the pod holding
	// the old unit with the most rows still waiting: the barrier must
	// wait for the takeover of a predecessor whose holder died mid-drain,
	// not give up order.
	KillOldHolder bool
}

// perKey declares spec.rollout.ordering PerKey.
func perKey(st *topologyv1.ShardTopology) { st.Spec.Rollout.Ordering = topologyv1.OrderingPerKey }

// The per-key order judge across changes of V, and of N without a
// barrier (PerKey does not order a change of N yet), on real parts: the operator (as its own
// ServiceAccount), reference workers (pkg/worker) under the test kubelet,
// a 3-server NATS cluster and PostgreSQL, SubjectTransform assignment,
// a publisher of keyed rows (pkg/publish's subjects, a sequence per key).
// Just before the change a burst of rows lands in the old units and every
// worker's sink slows (100 ms a row, more for more old units), so the
// old units still hold a backlog when the new epoch is activated
// (asserted, from the evidence: rows published before the activation
// and not acknowledged by then).
// Without an ordering barrier (ordering None) the new units deliver moved
// keys' new rows while their older rows wait in the old units: the
// checker must count cross-unit per-key inversions. Under PerKey the
// barrier holds them: 0 inversions, also when an old unit's holder is
// SIGKILLed mid-drain. Each row reports the barrier's cost: how long rows
// published after the activation waited for their first delivery, moved
// keys against unmoved ones, beside the old units' drain time. The rest
// of the verdict must be clean.
//
// checks P1, P2, P3
func TestKeyOrderAcrossAChangeOfNOrV(t *testing.T) {
	v8, v12, v16 := ownership.Topology{Partitions: 2, Shards: 8}, ownership.Topology{Partitions: 2, Shards: 12}, ownership.Topology{Partitions: 2, Shards: 16}
	v32, v48 := ownership.Topology{Partitions: 2, Shards: 32}, ownership.Topology{Partitions: 2, Shards: 48}
	n4, n6 := ownership.Topology{Partitions: 4, Shards: 4}, ownership.Topology{Partitions: 6, Shards: 4}
	cases := []keyOrderInput{
		{Name: "V8->16 ordering None", From: v8, To: v16, Ordering: historycheck.OrderingNone, Backlog: 3000, MinBacklog: 1000},
		{Name: "V8->16 ordering PerKey, old holder SIGKILLed mid-drain", From: v8, To: v16, Ordering: historycheck.OrderingPerKey, Spec: perKey,
			Backlog: 3000, MinBacklog: 1000, KillOldHolder: true},
		// Twice the old units of V8->16 drain twice as fast before the
		// activation: twice the burst (a run with 3000 kept 1981).
		// At 100 ms a row the 32 old units drain 320 a second: a cold
		// make test kept 871 of 6,000 at the activation. At 250 ms, 128.
		{Name: "V16->12 ordering None", From: v16, To: v12, Ordering: historycheck.OrderingNone, Backlog: 6000, MinBacklog: 1000, SinkDelay: 250 * time.Millisecond},
		{Name: "V16->12 ordering PerKey", From: v16, To: v12, Ordering: historycheck.OrderingPerKey, Spec: perKey, Backlog: 6000, MinBacklog: 1000, SinkDelay: 250 * time.Millisecond},
		// 64 old units at 400 ms a row drain 160 rows a second, slower than
		// a loaded machine publishes the burst (at 100 ms they drained
		// 640 a second, and a cold make test kept 5 rows of 16,000).
		{Name: "V32->48 ordering None", From: v32, To: v48, Ordering: historycheck.OrderingNone, Backlog: 8000, MinBacklog: 1000, SinkDelay: 400 * time.Millisecond},
		{Name: "V32->48 ordering PerKey", From: v32, To: v48, Ordering: historycheck.OrderingPerKey, Spec: perKey, Backlog: 8000, MinBacklog: 1000, SinkDelay: 400 * time.Millisecond},
		// A change of N moves keys between partition streams as a change
		// of V moves them between shards: the publisher switches at the
		// activation and a moved key's new rows reach a unit with no
		// backlog of its own. Under PerKey they wait there until the
		// publisher acknowledged the new epoch and the old units settled
		// their rows up to it; 4 -> 6 makes units feed each other (old
		// 0 feeds new 2 and old 2 feeds new 0), so the lift comes from
		// the holders' drained-to marks, not the ack floors alone.
		{Name: "N4->6 ordering None", From: n4, To: n6, Ordering: historycheck.OrderingNone, Backlog: 3000, MinBacklog: 1000},
		{Name: "N4->6 ordering PerKey, old holder SIGKILLed mid-drain", From: n4, To: n6, Ordering: historycheck.OrderingPerKey, Spec: perKey,
			Backlog: 3000, MinBacklog: 1000, KillOldHolder: true},
		// Back down: two partitions leave, their keys move into the
		// four that stay, and their units are retired once drained and
		// the publisher moved.
		{Name: "N6->4 ordering PerKey", From: n6, To: n4, Ordering: historycheck.OrderingPerKey, Spec: perKey, Backlog: 3000, MinBacklog: 1000},
	}
	for i, in := range cases {
		t.Run(in.Name, func(t *testing.T) {
			r := runKeyOrder(t, in, fmt.Sprintf("e2e-keyorder-%d", i))
			t.Logf("%s: backlog at activation %d rows (%d published just before the change), old units drained %s after activation; inversions across units %d (%d keys of %d), reorders within a unit %d, %d keyed rows delivered",
				in.Name, r.backlog, in.Backlog, r.drained.Round(10*time.Millisecond), r.v.KeyInversions, r.v.KeysInverted, r.v.Keys, r.v.KeyReorders, r.v.KeyedRows)
			t.Logf("%s: cost: %s", in.Name, r.cost)
			if in.Ordering == historycheck.OrderingPerKey {
				t.Logf("%s: barrier: %s", in.Name, r.barrier)
			}
			for _, x := range r.v.KeyInversionExamples {
				t.Logf("inversion: %s", x)
			}
			if r.backlog < in.MinBacklog {
				t.Errorf("only %d rows were waiting in the old units at the activation, want at least %d: the backlog the check needs did not happen", r.backlog, in.MinBacklog)
			}
			if r.err != nil {
				t.Errorf("rows lost (P3): %v", r.err)
			}
			if !r.v.Clean() {
				t.Errorf("the delivery history breaks a promise: %s\n%s", r.v.FirstViolation, r.v.Table())
			}
			if r.cost.moved.n == 0 || r.cost.unmoved.n == 0 {
				t.Errorf("rows published after the activation: %d of moved keys, %d of unmoved ones; the cost needs both", r.cost.moved.n, r.cost.unmoved.n)
			}
			switch in.Ordering {
			case historycheck.OrderingPerKey:
				if r.v.KeyInversions != 0 {
					t.Errorf("ordering PerKey: %d cross-unit per-key inversions, want 0", r.v.KeyInversions)
				}
				if bound := movedWaitBound(r); r.cost.moved.max > bound {
					t.Errorf("a moved key's row waited %s for its first delivery, beyond %s (the longer of the drain, %s, and an unmoved key's longest wait, %s, + 30 s)",
						r.cost.moved.max, bound, r.drained, r.cost.unmoved.max)
				}
			default:
				if r.v.KeyInversions == 0 {
					t.Errorf("ordering None, a backlog of %d rows at the activation, yet no cross-unit per-key inversion: the check did not fire\n%s", r.backlog, r.v.Table())
				}
			}
		})
	}
}

// movedWaitBound is a gross bound on a moved key's longest wait under
// PerKey (the goal, drain + 1 s, is reported, not asserted): a moved key
// waits for its old unit's drain and the operator's next look (every
// second), not for a timeout. It cannot be the drain alone: while the
// sinks are slow every key's rows queue too, and at 250 ms a row the
// 24 units of 2x12 sink 96 rows a second, under the steady 100, so the
// queue grows until the sinks speed up (a CI run: drain 58.7 s, unmoved
// keys waited up to 86.2 s, moved ones 94.5 s). The barrier's cost is
// what a moved key waits beyond the longer of the two.
func movedWaitBound(r keyOrderResult) time.Duration {
	return max(r.drained, r.cost.unmoved.max) + 30*time.Second
}

// keyOrderResult is what one run measured.
type keyOrderResult struct {
	v historycheck.Verdict
	// backlog is the rows published before the activation and not yet
	// acknowledged at it; drained is how long after the activation the
	// last of them was acknowledged.
	backlog int
	drained time.Duration
	cost    keyOrderCost
	// barrier splits a PerKey run's cost (zero under None).
	barrier barrierTimes
	err     error
}

// keyOrderRate and keyOrderKeys shape the steady traffic: each key gets a
// row every keys/rate seconds (2.56 s), so moved keys get new rows while
// their backlog drains; keyOrderSinkDelay makes the old units drain
// slowly (10 rows a second a unit).
const (
	keyOrderRate      = 100
	keyOrderKeys      = 256
	keyOrderSinkDelay = 100 * time.Millisecond
)

func runKeyOrder(t *testing.T, in keyOrderInput, ns string) keyOrderResult {
	start := time.Now()
	w := startWorld(t, ns, worldOptions{Options: fleettest.Options{Partitions: in.From.Partitions, Shards: in.From.Shards,
		Params: fleettest.FastParams(), DrainTimeout: 5 * time.Second,
		// Longer than a batch of 64 rows at the slow sink's 100 ms (6.4 s):
		// the backlog is worked off in order, not redelivered.
		AckWait:    30 * time.Second,
		Assignment: natsops.AssignByTransform}})
	delayFile := filepath.Join(t.TempDir(), "sink.delay")
	seq := &sequenced{}
	w.createStatefulSet(3, map[string]string{"WORKER_HANDLER_DELAY_FILE": delayFile})
	startOperatorInProcess(w)
	st := sampleTopology(w, in.From)
	if in.Spec != nil {
		in.Spec(st)
	}
	if err := w.k.Create(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	waitTopologyReady(w, in.From)
	w.waitPodsReady(3, time.Minute)
	t.Logf("%s: fleet of 3 pods ready at %s after %s", in.Name, in.From, time.Since(start).Round(time.Second))

	pub := w.fleet.StartKeyedPublisher("ord", in.From, keyOrderKeys, keyOrderRate)
	if in.From.Partitions != in.To.Partitions {
		// A publisher picks the partition: under a change of N it says
		// which epoch it publishes to (pkg/publish.Acknowledge).
		sn, err := w.fleet.Registry.Snapshot(context.Background(), w.fleet.Topology)
		if err != nil || sn.Active == nil {
			t.Fatalf("active epoch before the change: %+v, %v", sn.Active, err)
		}
		if err := pub.SwitchEpoch(in.From, sn.Active.Number); err != nil {
			t.Fatal(err)
		}
	}
	// Traffic flows before the fault: the first rows reach the sink.
	fleettest.Eventually(t, time.Minute, func() error {
		if n := pub.Published(); n < keyOrderKeys {
			return fmt.Errorf("%d rows published, want a round of %d keys", n, keyOrderKeys)
		}
		return nil
	})
	delay := cmp.Or(in.SinkDelay, keyOrderSinkDelay)
	if err := os.WriteFile(delayFile, []byte(delay.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pub.Burst(in.Backlog); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d rows in the old units' streams, sinks slowed to %s a row; changing to %s", in.Name, in.Backlog, delay, in.To)
	began := time.Now()
	// At the activation: a live view of the backlog and, when asked, the
	// kill, both before the change's end (under PerKey the change ends
	// only once the barrier lifted, that is once the old units drained).
	type atActivation struct {
		view   string
		killed poolctl.ClaimInfo
		err    error
	}
	live := make(chan atActivation, 1)
	go func() {
		var a atActivation
		a.view = liveBacklogAtActivation(w, pub, in.From, in.To)
		if in.KillOldHolder {
			a.killed, a.err = killOldHolderMidDrain(w, in.From)
		}
		live <- a
	}()
	seq.Change(w, in.To)
	pub.SetTopology(in.To)
	a := <-live
	t.Logf("%s: change to %s done in %s; %s", in.Name, in.To, time.Since(began).Round(time.Millisecond), a.view)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if in.KillOldHolder {
		awaitTakeover(w, a.killed)
	}
	// Moved keys get new rows while the old units drain; then the sinks
	// speed up again and the rest is worked off.
	waitBacklogDrained(w, pub, 3*time.Minute)
	if err := os.Remove(delayFile); err != nil {
		t.Fatal(err)
	}
	published := pub.Stop()
	_, waitErr := w.fleet.WaitDelivered(published, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ev, err := w.fleet.Evidence(ctx, published)
	if err != nil {
		t.Fatal(err)
	}
	ev.Ordering = in.Ordering
	r := keyOrderResult{v: historycheck.Check(ev), err: waitErr}
	activated := activationOf(t, ev, in.To)
	r.backlog, r.drained = backlogAt(ev, pub.Rows(), activated)
	r.cost = costOf(ev, pub.Rows(), in.From, in.To, activated)
	if in.Ordering == historycheck.OrderingPerKey {
		// Reported, not judged: a barrier not read leaves the split out.
		switch b, err := w.fleet.Registry.OrderBarrier(ctx, w.fleet.Topology); {
		case err != nil || b == nil:
			t.Logf("%s: no order barrier read after the change (%v): the cost is not split", in.Name, err)
		default:
			r.barrier = barrierTimesOf(ev, pub.Rows(), b, activated)
		}
	}
	t.Logf("%s verdict:\n%s", in.Name, r.v.Table())
	return r
}

// liveBacklogAtActivation polls the registry until `to` is active and
// then reads the rows the old units' consumers still hold (pending plus
// delivered and unacknowledged): a live view beside the evidence's count.
// A change of N moves the publisher (pub.SwitchEpoch) right when the
// registry shows the new epoch active, as a publisher watching the active
// epoch does: under PerKey the barrier's switches wait for it.
func liveBacklogAtActivation(w *world, pub *fleettest.Publisher, from, to ownership.Topology) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var epoch int64
	for ctx.Err() == nil {
		sn, err := w.fleet.Registry.Snapshot(ctx, w.fleet.Topology)
		if err == nil && sn.Active != nil && sn.Active.Shards == to.Shards && sn.Active.Partitions == to.Partitions {
			epoch = sn.Active.Number
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	seen := time.Now()
	if from.Partitions != to.Partitions {
		if err := pub.SwitchEpoch(to, epoch); err != nil {
			return fmt.Sprintf("the publisher did not acknowledge epoch %d: %v", epoch, err)
		}
	}
	js, err := jetstream.New(w.fleet.NATS.Connect(-1))
	if err != nil {
		return fmt.Sprintf("live backlog not read: %v", err)
	}
	total := uint64(0)
	for _, u := range from.Units() {
		c, err := js.Consumer(ctx, w.fleet.Layout.StreamName(u.Partition), w.fleet.Layout.ConsumerDurable(u.Partition, u.Shard))
		if err != nil {
			return fmt.Sprintf("live backlog not read: consumer of %s: %v", u, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Sprintf("live backlog not read: consumer of %s: %v", u, err)
		}
		total += info.NumPending + uint64(info.NumAckPending)
	}
	return fmt.Sprintf("live view: %d rows pending or unacknowledged in the old units' consumers, read %s after the registry showed %s active",
		total, time.Since(seen).Round(time.Millisecond), to)
}

// waitBacklogDrained waits until every row the publisher sent so far has
// reached the sink.
//
// It is a phase, not a bound: the slow sinks' pace depends on the
// machine's load (a cold make test left 1 of 4,344 rows after 3 minutes),
// so a backlog not worked off by then is logged and the sinks speed up;
// every published row must still reach the sink afterwards (P3, judged
// by the caller).
func waitBacklogDrained(w *world, pub *fleettest.Publisher, timeout time.Duration) {
	w.t.Helper()
	ids := map[string]ownership.Unit{}
	for id, r := range pub.Rows() {
		ids[id] = r.Unit
	}
	if _, err := w.fleet.WaitDelivered(ids, timeout); err != nil {
		w.t.Logf("the slow sinks had not worked off the backlog within %s (%v); speeding them up", timeout, err)
	}
}

// activationOf is when `to`'s epoch was activated, from the registry's
// epoch history in the evidence.
func activationOf(t *testing.T, in historycheck.Input, to ownership.Topology) time.Time {
	t.Helper()
	for _, e := range in.Epochs {
		if e.Partitions == to.Partitions && e.Shards == to.Shards && !e.ActivatedAt.IsZero() {
			return e.ActivatedAt
		}
	}
	t.Fatalf("no activation of %s in the registry's epoch history", to)
	return time.Time{}
}

// backlogAt counts, from the evidence, the rows published (acknowledged
// by the stream) before the activation and not acknowledged by any
// worker by then, and how long after the activation the last of them was
// acknowledged.
func backlogAt(in historycheck.Input, rows map[string]fleettest.PublishedRow, activated time.Time) (int, time.Duration) {
	acked := firstRecords(in, history.KindAck, history.KindTerm)
	n, last := 0, activated
	for id, r := range rows {
		if !r.Acked.Before(activated) {
			continue
		}
		at, ok := acked[id]
		if ok && at.Before(activated) {
			continue
		}
		n++
		if ok && at.After(last) {
			last = at
		}
	}
	return n, last.Sub(activated)
}

// firstRecords maps each row to the wall time of its first record of one
// of kinds that completed (an empty Detail: not a failed settle).
func firstRecords(in historycheck.Input, kinds ...history.Kind) map[string]time.Time {
	first := map[string]time.Time{}
	for _, p := range in.Processes {
		for _, r := range p.Records {
			if !slices.Contains(kinds, r.Kind) || r.Detail != "" {
				continue
			}
			if at, ok := first[r.RowID]; !ok || p.WallTime(r.Start).Before(at) {
				first[r.RowID] = p.WallTime(r.Start)
			}
		}
	}
	return first
}

// keyOrderCost is what the barrier costs: how long rows published after
// the activation waited from the stream's acknowledgement to their first
// delivery, for keys the change moved and for keys it did not.
type keyOrderCost struct {
	moved, unmoved waits
}

func (c keyOrderCost) String() string {
	return fmt.Sprintf("rows published after the activation, publish to first delivery: moved keys %s; unmoved keys %s", c.moved, c.unmoved)
}

// waits summarizes a set of waits.
type waits struct {
	n        int
	p50, max time.Duration
}

func (w waits) String() string {
	return fmt.Sprintf("%d rows, p50 %s, max %s", w.n, w.p50.Round(time.Millisecond), w.max.Round(time.Millisecond))
}

func summarize(ds []time.Duration) waits {
	if len(ds) == 0 {
		return waits{}
	}
	slices.Sort(ds)
	return waits{n: len(ds), p50: ds[len(ds)/2], max: ds[len(ds)-1]}
}

// costOf measures keyOrderCost from the evidence. A key moved when the
// new shape gives it another unit: another partition (the publisher's
// CRC-32 over N) or another shard (the transform's FNV-1a over V).
func costOf(in historycheck.Input, rows map[string]fleettest.PublishedRow, from, to ownership.Topology, activated time.Time) keyOrderCost {
	delivered := firstRecords(in, history.KindDeliver)
	var moved, unmoved []time.Duration
	for id, r := range rows {
		at, ok := delivered[id]
		if !ok || r.Acked.Before(activated) {
			continue
		}
		if keyUnit(r.Key, from) != keyUnit(r.Key, to) {
			moved = append(moved, at.Sub(r.Acked))
		} else {
			unmoved = append(unmoved, at.Sub(r.Acked))
		}
	}
	return keyOrderCost{moved: summarize(moved), unmoved: summarize(unmoved)}
}

// keyUnit is the unit a row of key reaches under t with SubjectTransform
// assignment.
func keyUnit(key string, t ownership.Topology) ownership.Unit {
	return ownership.Unit{Partition: ownership.KeyPartition(key, t.Partitions), Shard: ownership.PartitionShard(key, t.Shards)}
}

// barrierTimes splits what a moved key waits under PerKey into the parts
// the barrier is made of, all from the activation: its predecessors'
// drain to the switch S (their last row at or below S acknowledged), the
// operator's lift (the registry's lifted_at), and a moved row's first
// delivery after its predecessor's lift (the worker reading the lift,
// then the new unit's own queue).
type barrierTimes struct {
	// drainedToS and lifted are the latest over the predecessors;
	// liftLag is the longest lift after its own drain to S.
	drainedToS, lifted, liftLag time.Duration
	// afterLift summarizes moved rows stored above S: first delivery
	// minus the later of their predecessor's lift and their own
	// publication (negative: delivered before the lift, which the order
	// check judges).
	afterLift waits
	// unswitched counts partitions whose S was never recorded.
	unswitched int
	// Under a change of N: heldBelowS counts moved-in rows stored at or
	// below their partition's S (published in the publishers' switch
	// window), heldUnits the old units they were in (whose ack floors
	// cannot pass S while they hold them), marked the old units whose
	// holder recorded a drained-to mark.
	heldBelowS, heldUnits, marked int
}

func (b barrierTimes) String() string {
	s := fmt.Sprintf("predecessors drained to S by %s after the activation, lifted by %s (each at most %s after its drain to S); moved rows' first delivery after their predecessor's lift: %s; partitions without S %d",
		b.drainedToS.Round(10*time.Millisecond), b.lifted.Round(10*time.Millisecond), b.liftLag.Round(10*time.Millisecond), b.afterLift, b.unswitched)
	if b.heldBelowS > 0 || b.marked > 0 {
		s += fmt.Sprintf("; moved-in rows at or below S %d in %d old units, marks recorded for %d old units", b.heldBelowS, b.heldUnits, b.marked)
	}
	return s
}

// barrierTimesOf measures barrierTimes from the evidence, the publisher's
// stream sequences and the registry's barrier.
func barrierTimesOf(in historycheck.Input, rows map[string]fleettest.PublishedRow, b *poolctl.OrderBarrier, activated time.Time) barrierTimes {
	acked := firstRecords(in, history.KindAck, history.KindTerm)
	delivered := firstRecords(in, history.KindDeliver)
	type pred struct{ partition, shard int }
	drained := map[pred]time.Time{}
	lifts := map[pred]time.Time{}
	var out barrierTimes
	for _, pb := range b.Partitions {
		if !pb.Switched {
			out.unswitched++
			continue
		}
		for _, pr := range pb.Predecessors {
			k := pred{pb.Partition, pr.Shard}
			lifts[k], drained[k] = pr.LiftedAt, activated
			if pr.Mark > 0 {
				out.marked++
			}
		}
	}
	held := map[pred]bool{}
	var after []time.Duration
	for id, r := range rows {
		shard := ownership.PartitionShard(r.Key, b.FromShards)
		k := pred{r.Unit.Partition, shard}
		lift, isPred := lifts[k]
		// Under a change of N a key moved into the partition is not the
		// old unit's to drain: its rows there wait for another unit.
		movedIn := b.ChangesN() && ownership.KeyPartition(r.Key, b.FromPartitions) != r.Unit.Partition
		pb, _ := b.Partition(k.partition)
		switch {
		case isPred && r.StreamSeq <= pb.SwitchSeq && movedIn:
			// Published in the publishers' switch window: held in an
			// old unit, whose ack floor cannot pass S meanwhile.
			out.heldBelowS++
			held[k] = true
		case isPred && r.StreamSeq <= pb.SwitchSeq:
			if at, ok := acked[id]; ok && at.After(drained[k]) {
				drained[k] = at
			}
			continue
		}
		// A moved key's row after the switch: under a change of V its
		// predecessor is in its own partition, under a change of N in
		// the key's old partition.
		moved := isPred && shard != ownership.PartitionShard(r.Key, b.ToShards)
		if b.ChangesN() {
			lift, moved = lifts[pred{ownership.KeyPartition(r.Key, b.FromPartitions), shard}], movedIn
		}
		if at, ok := delivered[id]; ok && moved && !lift.IsZero() {
			after = append(after, at.Sub(later(lift, r.Acked)))
		}
	}
	for k, at := range drained {
		out.drainedToS = max(out.drainedToS, at.Sub(activated))
		if lift := lifts[k]; !lift.IsZero() {
			out.lifted = max(out.lifted, lift.Sub(activated))
			out.liftLag = max(out.liftLag, lift.Sub(at))
		}
	}
	out.afterLift = summarize(after)
	out.heldUnits = len(held)
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// killOldHolderMidDrain SIGKILLs the pod holding the old unit with the
// most rows still waiting in its consumer, and shows the fault took
// effect: that unit held rows at the kill (the barrier must then wait on
// the takeover's drain). It runs beside the change, so it reports errors
// rather than failing the test.
func killOldHolderMidDrain(w *world, from ownership.Topology) (poolctl.ClaimInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(w.fleet.NATS.Connect(-1))
	if err != nil {
		return poolctl.ClaimInfo{}, err
	}
	claims, err := w.fleet.Registry.Claims(ctx, w.fleet.Topology)
	if err != nil {
		return poolctl.ClaimInfo{}, err
	}
	held := map[string]poolctl.ClaimInfo{}
	for _, c := range claims {
		if c.State != poolctl.StateFree && c.Owner != "" {
			held[c.Unit] = c
		}
	}
	var victim poolctl.ClaimInfo
	most := uint64(0)
	for _, u := range from.Units() {
		c, ok := held[u.String()]
		if !ok {
			continue
		}
		cons, err := js.Consumer(ctx, w.fleet.Layout.StreamName(u.Partition), w.fleet.Layout.ConsumerDurable(u.Partition, u.Shard))
		if err != nil {
			return victim, fmt.Errorf("consumer of %s: %w", u, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return victim, fmt.Errorf("consumer of %s: %w", u, err)
		}
		if n := info.NumPending + uint64(info.NumAckPending); n > most {
			victim, most = c, n
		}
	}
	// A unit drains 10 rows a second at the slowed sink: fewer than 50
	// would be over before the takeover.
	if most < 50 {
		return victim, fmt.Errorf("the held old unit with the most rows waiting after the activation had %d: the drain the kill must interrupt was (nearly) over", most)
	}
	if err := w.kubelet.Signal(victim.Owner, syscall.SIGKILL); err != nil {
		return victim, err
	}
	w.t.Logf("SIGKILLed %s (incarnation %d), holder of old unit %s with %d rows pending or unacknowledged", victim.Owner, victim.OwnerIncarnation, victim.Unit, most)
	return victim, nil
}

// awaitTakeover waits until another member, or another incarnation of
// the killed one, holds the killed holder's unit.
func awaitTakeover(w *world, killed poolctl.ClaimInfo) {
	t := w.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		claims, err := w.fleet.Registry.Claims(ctx, w.fleet.Topology)
		if err != nil {
			t.Fatalf("waiting for the takeover of %s: %v", killed.Unit, err)
		}
		for _, c := range claims {
			if c.Unit == killed.Unit && c.State != poolctl.StateFree && (c.Owner != killed.Owner || c.OwnerIncarnation != killed.OwnerIncarnation) {
				t.Logf("old unit %s taken over by %s (incarnation %d)", c.Unit, c.Owner, c.OwnerIncarnation)
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("old unit %s was not taken over from its SIGKILLed holder %s within 3 minutes", killed.Unit, killed.Owner)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
