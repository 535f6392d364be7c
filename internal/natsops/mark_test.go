package natsops

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// The drained-to mark of a change of N, against a real server: exact when
// the consumer's pending rows are the holder's held ones (and then past
// the ack floor the held rows keep low), the ack floor otherwise: a row
// nak'd for later, or rows a dead holder left that its successor never
// saw, keep it there. The last case is the takeover hole of a mark built
// from the new holder's own deliveries (design.md section 8).
func TestMarkOfIsExactOnlyWhenThePendingRowsAreTheHeldOnes(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 3, 1)
	mustProvision(t, nc, l)
	ctx := testContext(t, 30*time.Second)
	ack := func(ms ...jetstream.Msg) {
		t.Helper()
		for _, m := range ms {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	mark := func(s, held int) Mark {
		t.Helper()
		m, err := MarkOf(ctx, js, l.ConsumerRef(Unit{Partition: 0, Shard: s}), held)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	seq := func(m jetstream.Msg) uint64 {
		t.Helper()
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		return md.Sequence.Stream
	}

	// Unit 0.0 holds its second and fifth rows (moved-in keys) and
	// acknowledged the rest; a row of 0.1 lies between them in the stream.
	publishShard(t, js, l, 0, 0, 4)
	publishShard(t, js, l, 0, 1, 1)
	publishShard(t, js, l, 0, 0, 3)
	rows := fetchNoAck(t, js, l, 0, 0, 7)
	ack(rows[0], rows[2], rows[3], rows[5], rows[6])
	got := mark(0, 2)
	// A filtered consumer's floor sits just below its first row
	// delivered and not acknowledged (DrainedTo says why).
	floor := seq(rows[1]) - 1
	if got := mustConsumerInfo(t, js, l.StreamName(0), l.ConsumerDurable(0, 0)).AckFloor.Stream; got != floor {
		t.Fatalf("unit 0.0's ack floor %d, want %d (its first held row keeps it low: the case the mark is for)", got, floor)
	}
	if !got.Exact || got.Seq != seq(rows[6]) {
		t.Fatalf("unit 0.0 holding 2 rows, the rest acknowledged: %+v; want exact at its last row %d", got, seq(rows[6]))
	}
	// The operator's lift test: the floor alone says "not drained" to the
	// unit's last row, the mark passes it, and a row of the unit beyond
	// the mark that is not settled keeps a later sequence from passing.
	S := seq(rows[6])
	if d, err := DrainedTo(ctx, nc, l, 0, 0, S); err != nil || d.Drained {
		t.Fatalf("unit 0.0 drained to %d by its floor: %+v, %v; want not (its held rows keep the floor low)", S, d, err)
	}
	passes := func(mark, seq uint64) bool {
		t.Helper()
		ok, err := MarkPasses(ctx, nc, l, 0, 0, mark, seq)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !passes(got.Seq, S) || !passes(got.Seq, S+2) {
		t.Fatalf("mark %d does not pass %d, or %d with no row of unit 0.0 between", got.Seq, S, S+2)
	}
	after := publishOne(t, js, l, 0, 0)
	if passes(got.Seq, after) || !passes(got.Seq, after-1) {
		t.Fatalf("mark %d: a row of unit 0.0 at %d above it must keep %d from passing, and not %d", got.Seq, after, after, after-1)
	}

	// Counted against a wrong number of held rows it is only the floor.
	if got := mark(0, 1); got.Exact || got.Seq != floor {
		t.Fatalf("unit 0.0 counted with 1 held row: %+v; want the floor %d", got, floor)
	}

	// Unit 0.1 nak'd a row for later: pending, held by no one.
	publishShard(t, js, l, 0, 1, 2)
	rows = fetchNoAck(t, js, l, 0, 1, 3)
	ack(rows[0], rows[2])
	if err := rows[1].NakWithDelay(time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := mark(1, 0); got.Exact || got.Seq != seq(rows[1])-1 || got.AckPending != 1 {
		t.Fatalf("unit 0.1 with a nak'd row: %+v; want the floor %d, one row pending", got, seq(rows[1])-1)
	}

	// Unit 0.2's holder died with two rows unacknowledged; its successor
	// (another client, after the pin was lifted) gets only the newer rows
	// and acknowledges them all. From its own deliveries it would mark its
	// last row; the consumer says two rows are pending that it never saw.
	publishShard(t, js, l, 0, 2, 3)
	dead := fetchNoAck(t, js, l, 0, 2, 3)
	ack(dead[0])
	st, err := js.Stream(ctx, l.StreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.UnpinConsumer(ctx, l.ConsumerDurable(0, 2), PriorityGroup); err != nil {
		t.Fatal(err)
	}
	publishShard(t, js, l, 0, 2, 2)
	next := fetchNoAck(t, mustJetStream(t, c.Connect(0)), l, 0, 2, 2)
	if seq(next[0]) <= seq(dead[2]) {
		t.Fatalf("the successor's first row %d is not newer than the dead holder's last %d: the takeover case did not happen", seq(next[0]), seq(dead[2]))
	}
	ack(next...)
	if got := mark(2, 0); got.Exact || got.Seq != seq(dead[1])-1 || got.AckPending != 2 {
		t.Fatalf("unit 0.2 after a takeover: %+v; want the floor %d with the dead holder's 2 rows pending, not past them", got, seq(dead[1])-1)
	}
}

// publishOne publishes one row to unit (p, s) and returns its stream
// sequence.
func publishOne(t testing.TB, js jetstream.JetStream, l Layout, p, s int) uint64 {
	t.Helper()
	ack, err := js.Publish(testContext(t, 10*time.Second), l.ShardSubject(p, s, "one"), []byte("row"))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}
