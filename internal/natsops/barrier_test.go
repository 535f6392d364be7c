package natsops

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	ow "github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// DrainedTo on a real nats-server: a unit is drained to S once every row at
// or below S was acknowledged, whatever it holds above S, even when the
// ack floor alone stays below S.
func TestDrainedToJudgesRowsAtOrBelowTheSwitch(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 3, 1)
	mustProvision(t, nc, l)
	ctx := testContext(t, 30*time.Second)

	publishShard(t, js, l, 0, 0, 3) // seq 1-3
	publishShard(t, js, l, 0, 1, 2) // seq 4-5
	publishShard(t, js, l, 0, 2, 1) // seq 6
	const S = 6

	// One handle per unit: a pinned consumer serves only the client its
	// pin went to.
	units := map[int]jetstream.Consumer{}
	fetch := func(s, n int) []jetstream.Msg {
		t.Helper()
		if units[s] == nil {
			c, err := js.Consumer(ctx, l.StreamName(0), l.ConsumerDurable(0, s))
			if err != nil {
				t.Fatal(err)
			}
			units[s] = c
		}
		var got []jetstream.Msg
		for len(got) < n && ctx.Err() == nil {
			batch, err := units[s].Fetch(n-len(got), jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(PriorityGroup))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				got = append(got, m)
			}
		}
		return got
	}

	// Unit 0.0 acknowledged its rows below S, then received a row above
	// S that it holds (a new unit's moved key waiting for its own
	// predecessor).
	for _, m := range fetch(0, 3) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publishShard(t, js, l, 0, 0, 1) // seq 7
	fetch(0, 1)
	d, err := DrainedTo(ctx, nc, l, 0, 0, S)
	if err != nil {
		t.Fatal(err)
	}
	// The fault took effect: the floor alone says "not yet".
	if d.AckFloor >= S || d.AckPending != 1 {
		t.Fatalf("unit 0.0: %+v; want an ack floor below %d and one row unacknowledged (the case the floor cannot judge)", d, S)
	}
	if !d.Drained || d.FirstOpen != 7 {
		t.Fatalf("unit 0.0: %+v; want drained, its first open row 7 above the switch", d)
	}

	// Unit 0.1 acknowledged one of its two rows below S: not drained.
	ms := fetch(1, 2)
	if err := ms[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	d, err = DrainedTo(ctx, nc, l, 0, 1, S)
	if err != nil {
		t.Fatal(err)
	}
	if d.Drained || d.FirstOpen != 5 {
		t.Fatalf("unit 0.1 with row 5 unacknowledged: %+v; want not drained, first open row 5", d)
	}
	if err := ms[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "unit 0.1 drained once row 5 is acknowledged", func() bool {
		d, err := DrainedTo(ctx, nc, l, 0, 1, S)
		return err == nil && d.Drained
	})

	// Unit 0.2 never delivered its row: not drained.
	d, err = DrainedTo(ctx, nc, l, 0, 2, S)
	if err != nil {
		t.Fatal(err)
	}
	if d.Drained || d.Pending != 1 {
		t.Fatalf("unit 0.2 with its row undelivered: %+v; want not drained, 1 pending", d)
	}
	// A row nacked below S is not acknowledged either.
	m := fetch(2, 1)[0]
	if err := m.Nak(); err != nil {
		t.Fatal(err)
	}
	if d, err = DrainedTo(ctx, nc, l, 0, 2, S); err != nil || d.Drained {
		t.Fatalf("unit 0.2 with its row nacked: %+v, %v; want not drained", d, err)
	}

	// A consumer that is gone (retired once drained) counts as drained.
	if err := (jsAPI{nc}).deleteConsumer(ctx, l.StreamName(0), l.ConsumerDurable(0, 2)); err != nil {
		t.Fatal(err)
	}
	if d, err = DrainedTo(ctx, nc, l, 0, 2, S); err != nil || !d.Drained || !d.Retired {
		t.Fatalf("unit 0.2 retired: %+v, %v; want drained and retired", d, err)
	}
}

// The switch of a real stream's subject transform, under a publisher that
// does not stop: the rows at or below the switch FindSwitch finds are all
// the old shape's (or unmoved), and the rows above it all the new shape's.
// This is what lets a worker tell a moved key's old rows from its new ones
// by the stream sequence alone.
func TestTheTransformSwitchesAtOneStreamSequence(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 8, 1)
	l.Assignment = AssignByTransform
	mustProvision(t, nc, l)
	ctx := testContext(t, 60*time.Second)

	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		published atomic.Int64
		pubErr    atomic.Value
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if _, err := js.Publish(ctx, l.RowSubject(0, fmt.Sprintf("k%d", i%500)), []byte("r")); err != nil {
				pubErr.Store(err)
				return
			}
			published.Add(1)
		}
	}()
	eventually(t, 10*time.Second, "rows flowing before the switch", func() bool { return published.Load() > 200 })
	before, err := StreamPositions(ctx, nc, l)
	if err != nil {
		t.Fatal(err)
	}
	wide := l
	wide.Shards = 16
	if !before[0].Routed {
		t.Fatal("before the switch, the stream does not route over 8 shards")
	}
	if pos, err := StreamPositions(ctx, nc, wide); err != nil || pos[0].Routed {
		t.Fatalf("before the switch: %+v, %v; want the 16-shard layout seen as not routed yet", pos, err)
	}
	mustProvision(t, nc, wide)
	after, err := StreamPositions(ctx, nc, wide)
	if err != nil {
		t.Fatal(err)
	}
	if !after[0].Routed {
		t.Fatal("after the switch, the stream does not route over 16 shards")
	}
	n := published.Load()
	eventually(t, 10*time.Second, "rows flowing after the switch", func() bool { return published.Load() > n+200 })
	stop.Store(true)
	wg.Wait()
	if e := pubErr.Load(); e != nil {
		t.Fatal(e)
	}
	routed := func(seq uint64) (ow.Routing, error) {
		r, ok, err := RowAt(ctx, nc, l, 0, seq)
		if err != nil || !ok {
			return ow.RoutedEither, err
		}
		return ow.RoutedBy(r.Key, r.Shard, 8, 16), nil
	}
	S, err := ow.FindSwitch(before[0].LastSeq, after[0].LastSeq, routed)
	if err != nil {
		t.Fatal(err)
	}
	pos, err := StreamPositions(ctx, nc, wide)
	if err != nil {
		t.Fatal(err)
	}
	last := pos[0].LastSeq
	t.Logf("before %d, switch %d, after %d, last %d", before[0].LastSeq, S, after[0].LastSeq, last)
	var olds, news int
	for seq := uint64(1); seq <= last; seq++ {
		r, err := routed(seq)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r == ow.RoutedOld && seq > S:
			t.Fatalf("row %d above the switch %d was routed over 8 shards", seq, S)
		case r == ow.RoutedNew && seq <= S:
			t.Fatalf("row %d at or below the switch %d was routed over 16 shards", seq, S)
		case r == ow.RoutedOld:
			olds++
		case r == ow.RoutedNew:
			news++
		}
	}
	if olds == 0 || news == 0 {
		t.Fatalf("%d rows of moved keys before the switch, %d after: the test saw no switch", olds, news)
	}
	// RowAt reads the routed subject back.
	if r, ok, err := RowAt(ctx, nc, l, 0, 1); err != nil || !ok || r.Key != "k0" || r.Shard != ow.PartitionShard("k0", 8) {
		t.Fatalf("row 1: %+v ok=%v err=%v; want key k0 in its shard under 8", r, ok, err)
	}
	if _, ok, err := RowAt(ctx, nc, l, 0, last+100); err != nil || ok {
		t.Fatalf("a row past the end: ok=%v err=%v; want none", ok, err)
	}
}
