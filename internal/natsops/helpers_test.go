package natsops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var layoutSeq atomic.Int64

// testLayout is a layout with a prefix of its own, so tests sharing a
// cluster never see each other's streams.
func testLayout(n, v, replicas int) Layout {
	return Layout{
		SubjectPrefix: fmt.Sprintf("t%d", layoutSeq.Add(1)),
		ConsumerName:  "ingest",
		Partitions:    n,
		Shards:        v,
		Replicas:      replicas,
		PinnedTTL:     2 * time.Minute,
		AckWait:       30 * time.Second,
	}
}

func testContext(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustJetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// mustProvision provisions l and retries while a young cluster cannot yet
// place R3 assets (its meta leader may not know every peer, or not yet
// see one online).
func mustProvision(t testing.TB, nc *nats.Conn, l Layout) *Report {
	t.Helper()
	// Provision is idempotent, so an attempt that timed out (R3 consumers
	// are slow to create on a loaded box: a cold make test beside other
	// builds timed out creating 64) is simply made again.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rep, err := Provision(testContext(t, 30*time.Second), nc, l)
		if err == nil {
			waitStreamLeaders(t, nc, l, time.Until(deadline))
			return rep
		}
		young := strings.Contains(err.Error(), "insufficient resources") || strings.Contains(err.Error(), "no suitable peers")
		if time.Now().After(deadline) || !(young || errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("provision: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStreamLeaders waits until every stream of l has elected a leader.
// A stream answers its creation before its raft group has a leader, and a
// publish in that gap gets no response (a clean-clone CI run on a loaded box
// saw one); the tests publish right after provisioning.
func waitStreamLeaders(t testing.TB, nc *nats.Conn, l Layout, within time.Duration) {
	t.Helper()
	js := mustJetStream(t, nc)
	for p := range l.Partitions {
		eventually(t, max(within, 20*time.Second), "stream "+l.StreamName(p)+" has a leader", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := js.Stream(ctx, l.StreamName(p))
			if err != nil {
				return false
			}
			info, err := st.Info(ctx)
			return err == nil && (info.Cluster == nil || info.Cluster.Leader != "")
		})
	}
}

// publishShard publishes count rows to unit (p, s) and waits for the
// stream's acks.
func publishShard(t testing.TB, js jetstream.JetStream, l Layout, p, s, count int) {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	for i := range count {
		if _, err := js.Publish(ctx, l.ShardSubject(p, s, fmt.Sprintf("row%d", i)), []byte("row")); err != nil {
			t.Fatalf("publish to unit %d.%d: %v", p, s, err)
		}
	}
}

// fetchNoAck pulls count rows of unit (p, s) in the priority group and
// leaves them unacknowledged.
func fetchNoAck(t testing.TB, js jetstream.JetStream, l Layout, p, s, count int) []jetstream.Msg {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	cons, err := js.Consumer(ctx, l.StreamName(p), l.ConsumerDurable(p, s))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < count && time.Now().Before(deadline) {
		batch, err := cons.Fetch(count-len(got), jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(PriorityGroup))
		if err != nil {
			t.Fatalf("fetch from unit %d.%d: %v", p, s, err)
		}
		for m := range batch.Messages() {
			got = append(got, m)
		}
	}
	if len(got) != count {
		t.Fatalf("fetched %d rows of unit %d.%d, want %d", len(got), p, s, count)
	}
	return got
}

func mustConsumerInfo(t testing.TB, js jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := testContext(t, 10*time.Second)
	cons, err := js.Consumer(ctx, stream, name)
	if err != nil {
		t.Fatalf("consumer %s/%s: %v", stream, name, err)
	}
	return cons.CachedInfo()
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tryConsumerInfo is mustConsumerInfo for polling loops: a consumer between
// leaders does not answer, which is no failure yet.
func tryConsumerInfo(t testing.TB, js jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := testContext(t, 2*time.Second)
	cons, err := js.Consumer(ctx, stream, name)
	if err != nil {
		t.Logf("consumer %s/%s: %v", stream, name, err)
		return nil
	}
	return cons.CachedInfo()
}
