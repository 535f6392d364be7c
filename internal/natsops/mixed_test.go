package natsops

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// startMixedCluster starts the cluster of a rolling upgrade from 2.12 to
// 2.14 that has not finished: two servers at 2.14.9 and, last, one at
// 2.12.15, each a separate process.
func startMixedCluster(t *testing.T) *natstest.ProcCluster {
	t.Helper()
	new, old := natstest.Binary(t, natstest.Version214), natstest.Binary(t, natstest.Version212)
	return natstest.StartProcCluster(t, new, new, old)
}

const oldServer = 2 // index of the 2.12 server in startMixedCluster

// checks P4
func TestMixedClusterCensusNamesThe212ServerAndRefusesResetOfEveryConsumer(t *testing.T) {
	c := startMixedCluster(t)
	old := c.Configs[oldServer].Name
	nc := c.Connect(0)
	l := testLayout(2, 2, 3)
	mustProvision(t, nc, l)

	census, err := TakeCensus(testContext(t, 20*time.Second), c.ConnectSys(0), CensusOptions{JetStream: nc, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, census)
	if census.FloorMet() || census.MinVersion != "2.12.15" || !slices.Equal(census.BelowFloor, []string{old}) {
		t.Fatalf("census: min %s, below %v; want 2.12.15 and only %s", census.MinVersion, census.BelowFloor, old)
	}
	s, _ := census.Server(old)
	if s.Version != "2.12.15" || !s.Answered || s.Consumers != len(l.Consumers()) {
		t.Fatalf("2.12 server %+v: want it seen hosting every R3 consumer", s)
	}
	for i := range 2 {
		s, _ := census.Server(c.Configs[i].Name)
		if s.Version != "2.14.9" || s.BelowFloor || s.APILevel <= 3 {
			t.Fatalf("2.14 server %+v", s)
		}
	}

	v := census.ResetVerdict()
	if v.Allowed || v.Servers[old] != "2.12.15" {
		t.Fatalf("verdict %+v, want refused, listing %s at 2.12.15", v, old)
	}
	// Even a verdict that says "allowed" (taken before the 2.12 server
	// joined, say) does not RESET a consumer that server hosts now.
	forged := v
	forged.Allowed = true
	js := mustJetStream(t, nc)
	for _, ref := range l.Consumers() {
		var refused *RefusedError
		if err := census.AllowReset(ref.Stream, ref.Name, time.Minute); !errors.As(err, &refused) || !slices.Equal(refused.Servers, []string{old}) {
			t.Fatalf("census allows RESET of %s: %v; want refused naming %s", ref, err, old)
		}
		if err := GuardedReset(testContext(t, 10*time.Second), js, ref, v, time.Minute, time.Now()); !errors.As(err, &refused) {
			t.Fatalf("GuardedReset of %s with the census's verdict: %v; want refused", ref, err)
		}
		err := GuardedReset(testContext(t, 10*time.Second), js, ref, forged, time.Minute, time.Now())
		if !errors.As(err, &refused) || refused.Op != OpReset || !slices.Equal(refused.Servers, []string{old}) {
			t.Fatalf("GuardedReset of %s with a verdict that allows: %v; want refused naming %s", ref, err, old)
		}
		// UNPIN only needs 2.11, so graceful handover works mid-upgrade.
		if err := census.AllowUnpin(ref.Stream, ref.Name, time.Minute); err != nil {
			t.Fatalf("UNPIN of %s refused: %v", ref, err)
		}
	}
	if !c.Procs[oldServer].Running() {
		t.Fatalf("the 2.12.15 server died: a RESET got through\n%s", c.Procs[oldServer].LogTail(10))
	}
	ref := l.Consumers()[0]
	st, err := js.Stream(testContext(t, 10*time.Second), ref.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.UnpinConsumer(testContext(t, 10*time.Second), ref.Name, PriorityGroup); err != nil {
		t.Fatalf("UNPIN of %s in the mixed cluster: %v", ref, err)
	}
}

// On a cluster whose servers are all 2.14.9 (separate processes), a fresh
// verdict allows GuardedReset, and the row a dead owner left unacked comes
// back at once, not after ack_wait (30s).
// checks P4
func TestGuardedResetOnAll214ServersRedeliversAtOnce(t *testing.T) {
	new := natstest.Binary(t, natstest.Version214)
	c := natstest.StartProcCluster(t, new, new, new)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 1, 3)
	mustProvision(t, nc, l)
	ref := l.ConsumerRef(Unit{0, 0})
	publishShard(t, js, l, 0, 0, 1)

	ctx := testContext(t, 30*time.Second)
	cons, err := js.Consumer(ctx, ref.Stream, ref.Name)
	if err != nil {
		t.Fatal(err)
	}
	fetchOne := func(wait time.Duration) jetstream.Msg {
		t.Helper()
		deadline := time.Now().Add(wait)
		for time.Now().Before(deadline) {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond), jetstream.FetchPriorityGroup(PriorityGroup))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				return m
			}
		}
		return nil
	}
	if m := fetchOne(10 * time.Second); m == nil {
		t.Fatal("the row was never delivered")
	}
	// The owner "dies" holding it unacked.
	census, err := TakeCensus(ctx, c.ConnectSys(1), CensusOptions{JetStream: nc, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, census)
	v := census.ResetVerdict()
	if !v.Allowed || len(v.Servers) != 3 {
		t.Fatalf("verdict %+v, want allowed with 3 servers", v)
	}
	if err := GuardedReset(ctx, js, ref, v, time.Minute, time.Now()); err != nil {
		t.Fatalf("GuardedReset: %v", err)
	}
	start := time.Now()
	m := fetchOne(5 * time.Second)
	if m == nil {
		t.Fatalf("the unacked row did not come back within 5s of the RESET (ack_wait is %s)", l.AckWait)
	}
	// RESET rewinds the consumer: the row comes back as stream sequence 1
	// again (delivery counts start over).
	md, err := m.Metadata()
	if err != nil || md.Sequence.Stream != 1 {
		t.Fatalf("row after RESET: %+v (%v), want stream sequence 1 again", md, err)
	}
	t.Logf("redelivered %s after the RESET", time.Since(start).Round(time.Millisecond))
}

// checks P4
func TestCensusThroughA214ServerIsNotFooledWhileA212MemberExists(t *testing.T) {
	c := startMixedCluster(t)
	old := c.Configs[oldServer].Name
	nc := c.Connect(0)
	l := testLayout(1, 2, 3)
	mustProvision(t, nc, l)
	floor := MinResetVersion

	for i := range 2 {
		sys := c.ConnectSys(i)
		// The trap: the server the client talks to is new enough.
		connected, err := ParseVersion(sys.ConnectedServerVersion())
		if err != nil || !connected.AtLeast(floor) {
			t.Fatalf("connected to %s at %q: the test needs a 2.14 server here", sys.ConnectedServerName(), sys.ConnectedServerVersion())
		}
		census, err := TakeCensus(testContext(t, 20*time.Second), sys, CensusOptions{JetStream: nc, Consumers: l.Consumers()})
		if err != nil {
			t.Fatal(err)
		}
		// A census reduced to the connected server's version would pass
		// here and fail these.
		if census.FloorMet() || !slices.Contains(census.BelowFloor, old) || census.MinVersion != "2.12.15" {
			t.Fatalf("census through %s (%s): min %s, below %v; want %s below the floor",
				sys.ConnectedServerName(), sys.ConnectedServerVersion(), census.MinVersion, census.BelowFloor, old)
		}
		if len(census.Servers) != 3 {
			t.Fatalf("census through %s saw %d servers, want 3", sys.ConnectedServerName(), len(census.Servers))
		}
		app := mustJetStream(t, c.Connect(i))
		for _, ref := range l.Consumers() {
			if err := GuardedReset(testContext(t, 10*time.Second), app, ref, census.ResetVerdict(), time.Minute, time.Now()); !errors.Is(err, ErrRefused) {
				t.Fatalf("RESET of %s through %s: %v, want refused", ref, sys.ConnectedServerName(), err)
			}
		}
	}
}

// TestUnguardedResetOnAnR3ConsumerWithA212Replica records what P4 protects
// against. It issues a raw RESET, without the guard, on an R3 consumer led
// by a 2.14.9 server with a 2.12.15 replica and 5 rows unacknowledged, and
// watches the 2.12.15 process.
//
// Observed (nats-server v2.14.9 leader, v2.12.15 replica, loopback):
//   - While the 2.12.15 server leads the consumer, RESET gets no answer: the
//     request times out, and nothing changes.
//   - Led by 2.14.9, RESET succeeds for the client (reset_seq 1).
//   - The 2.12.15 replica dies at once with
//     "panic: JetStream Cluster Unknown group entry op type: 18".
//   - Restarted, it replays the entry from its raft log and dies with the
//     same panic again, on every restart, until it is upgraded.
//
// The assertions below hold those observations; if a future version
// behaves differently the test fails and says what it saw.
//
// checks P4
func TestUnguardedResetOnAnR3ConsumerWithA212Replica(t *testing.T) {
	const panicLine = "panic: JetStream Cluster Unknown group entry op type: 18"
	c := startMixedCluster(t)
	oldProc := c.Procs[oldServer]
	old := c.Configs[oldServer].Name
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 1, 3)
	mustProvision(t, nc, l)
	stream, name := l.StreamName(0), l.ConsumerDurable(0, 0)
	subject := fmt.Sprintf("$JS.API.CONSUMER.RESET.%s.%s", stream, name)

	publishShard(t, js, l, 0, 0, 5)
	fetchNoAck(t, js, l, 0, 0, 5)

	// 1. Led by the 2.12 server, RESET is ignored.
	moveConsumerLeader(t, js, nc, stream, name, old)
	if _, err := nc.Request(subject, nil, 2*time.Second); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("RESET with a 2.12.15 leader: %v, want a timeout", err)
	}
	t.Logf("RESET with the 2.12.15 server %s leading: timed out, as expected", old)
	if ci := mustConsumerInfo(t, js, stream, name); ci.NumAckPending != 5 {
		t.Fatalf("ignored RESET changed the consumer: ack pending %d", ci.NumAckPending)
	}

	// 2. Led by a 2.14 server, RESET succeeds for the client.
	moveConsumerLeader(t, js, nc, stream, name, c.Configs[0].Name)
	eventually(t, 20*time.Second, "2.12.15 replica current", func() bool {
		ci := tryConsumerInfo(t, js, stream, name)
		if ci == nil || ci.Cluster == nil {
			return false
		}
		for _, r := range ci.Cluster.Replicas {
			if r.Name == old {
				return r.Current
			}
		}
		return false
	})
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("RESET with a 2.14.9 leader: %v", err)
	}
	var resp struct {
		ResetSeq uint64          `json:"reset_seq"`
		Error    json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error != nil || resp.ResetSeq != 1 {
		t.Fatalf("RESET reply %s: want success with reset_seq 1", m.Data)
	}
	t.Logf("RESET with %s leading answered success, reset_seq %d", c.Configs[0].Name, resp.ResetSeq)

	// 3. The 2.12 replica receives the raft entry and dies.
	first := waitForExit(t, oldProc, 20*time.Second)
	if !strings.Contains(first, panicLine) {
		t.Fatalf("2.12.15 replica after RESET: %s\nwant it to die with %q", first, panicLine)
	}
	t.Logf("the 2.12.15 replica died (%v): %s", oldProc.ExitErr(), panicOf(oldProc.Log()))

	// The census now counts it as unknown, and the guard refuses.
	census, err := TakeCensus(testContext(t, 20*time.Second), c.ConnectSys(0), CensusOptions{Timeout: time.Second, JetStream: nc, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, census)
	if s, ok := census.Server(old); !ok || s.Answered || !s.BelowFloor {
		t.Fatalf("census after the crash: %+v, want %s unknown and below the floor", s, old)
	}

	// 4. Restarted, it replays the entry and dies again.
	before := strings.Count(oldProc.Log(), panicLine)
	if err := oldProc.Start(30 * time.Second); err != nil {
		t.Logf("restart of the 2.12.15 server failed while starting: %v", err)
	}
	second := waitForExit(t, oldProc, 30*time.Second)
	if after := strings.Count(oldProc.Log(), panicLine); after <= before {
		t.Fatalf("2.12.15 server after a restart: %s\nwant the same panic again", second)
	}
	t.Logf("restarted, the 2.12.15 server died again (%v): %s", oldProc.ExitErr(), panicOf(second))
}

// moveConsumerLeader asks the consumer's leader to step down in favour of
// server to, until it has.
func moveConsumerLeader(t *testing.T, js jetstream.JetStream, nc *nats.Conn, stream, consumer, to string) {
	t.Helper()
	body := fmt.Sprintf(`{"placement":{"preferred":%q}}`, to)
	subject := fmt.Sprintf("$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s", stream, consumer)
	leader := func() string {
		if ci := tryConsumerInfo(t, js, stream, consumer); ci != nil && ci.Cluster != nil {
			return ci.Cluster.Leader
		}
		return ""
	}
	eventually(t, 30*time.Second, "consumer led by "+to, func() bool {
		l := leader()
		if l == to {
			return true
		}
		if l != "" {
			if _, err := nc.Request(subject, []byte(body), 2*time.Second); err != nil {
				t.Logf("step down: %v", err)
			}
		}
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if leader() == to {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	})
}

// waitForExit waits for the process to die and returns the end of its log;
// it fails the test, instead of hanging, if it lives on.
func waitForExit(t *testing.T, p *natstest.Proc, timeout time.Duration) string {
	t.Helper()
	select {
	case <-p.Done():
		return fmt.Sprintf("exited (%v); log ends:\n%s", p.ExitErr(), p.LogTail(15))
	case <-time.After(timeout):
		t.Fatalf("%s still running after %s; log ends:\n%s", p.Config.Name, timeout, p.LogTail(15))
		return ""
	}
}

// panicOf returns the last panic line of a log.
func panicOf(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "panic:") {
			return lines[i]
		}
	}
	return "(no panic line)"
}
