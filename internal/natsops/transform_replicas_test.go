package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ow "github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// subjectsOnEachReplica reads the stored subject of every row in
// [from, to] of partition 0's stream as each server of c stores it: it
// moves the stream's leadership to each server in turn (a stepdown with a
// preferred server) and reads the rows through the leader.
func subjectsOnEachReplica(t *testing.T, c *natstest.Cluster, nc *nats.Conn, l Layout, from, to uint64) map[string][]string {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	js := mustJetStream(t, nc)
	stream := l.StreamName(0)
	out := map[string][]string{}
	for _, cfg := range c.Configs {
		eventually(t, time.Minute, "leader "+cfg.Name, func() bool {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return false
			}
			info, err := st.Info(ctx)
			if err != nil || info.Cluster == nil {
				return false
			}
			if info.Cluster.Leader == cfg.Name {
				return true
			}
			body, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": cfg.Name}})
			_, _ = nc.Request(fmt.Sprintf(api.JSApiStreamLeaderStepDownT, stream), body, 5*time.Second)
			time.Sleep(500 * time.Millisecond)
			return false
		})
		var subjects []string
		for seq := from; seq <= to; seq++ {
			var m *api.StoredMsg
			eventually(t, 30*time.Second, fmt.Sprintf("row %d on %s", seq, cfg.Name), func() bool {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				got, err := msgGet(rctx, jsAPI{nc}, stream, api.JSApiMsgGetRequest{Seq: seq})
				m = got
				return err == nil && got != nil
			})
			subjects = append(subjects, m.Subject)
		}
		out[cfg.Name] = subjects
	}
	return out
}

// switchUnderTraffic changes an R3 stream's transform from V 16 to 12
// while four publishers keep sending keyed rows, with change, and returns
// the rows around the change as each replica stores them, and the range
// they cover. It shows the fault took effect: rows were taken just before
// and just after the change, and the rows around it include rows the old
// transform routed and rows the new one did.
func switchUnderTraffic(t *testing.T, change func(ctx context.Context, c *natstest.Cluster, nc *nats.Conn, narrow Layout) error) (map[string][]string, uint64) {
	t.Helper()
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(0)
	js := mustJetStream(t, nc)
	l := testLayout(1, 16, 3)
	l.Assignment = AssignByTransform
	mustProvision(t, nc, l)
	ctx := testContext(t, 2*time.Minute)

	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		published atomic.Int64
		refused   atomic.Int64
		timedOut  atomic.Int64
		lastErr   atomic.Value
	)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				// Publishers retry while the stream's input is paused,
				// and give up on a publish whose acknowledgement does not
				// come, as publishers must.
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, l.RowSubject(0, fmt.Sprintf("k%d-%d", g, i%500)), []byte("r"), jetstream.WithRetryAttempts(100), jetstream.WithRetryWait(20*time.Millisecond))
				cancel()
				switch {
				case err == nil:
					published.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
				default:
					refused.Add(1)
					lastErr.Store(err.Error())
				}
			}
		}()
	}
	eventually(t, 10*time.Second, "rows flowing before the switch", func() bool { return published.Load() > 500 })
	before, err := StreamPositions(ctx, nc, l)
	if err != nil {
		t.Fatal(err)
	}
	// Rows the old transform routes, between the position read and the
	// change: on a loaded machine the change could otherwise come before
	// any (a cold make test saw none).
	n0 := published.Load()
	eventually(t, 10*time.Second, "rows flowing after the position read", func() bool { return published.Load() > n0+100 })
	narrow := l
	narrow.Shards = 12
	began := time.Now()
	if err := change(ctx, c, nc, narrow); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	after, err := StreamPositions(ctx, nc, narrow)
	if err != nil {
		t.Fatal(err)
	}
	if !after[0].Routed {
		t.Fatal("after the change, the stream does not route over 12 shards")
	}
	n := published.Load()
	logged := time.Now()
	eventually(t, 10*time.Second, "rows flowing after the switch", func() bool {
		if published.Load() > n+500 {
			return true
		}
		if time.Since(logged) < time.Second {
			return false
		}
		logged = time.Now()
		t.Logf("%d published since the switch, %d refused (last: %v), %d timed out", published.Load()-n, refused.Load(), lastErr.Load(), timedOut.Load())
		return false
	})
	stop.Store(true)
	wg.Wait()
	from, to := before[0].LastSeq, after[0].LastSeq+200
	subjects := subjectsOnEachReplica(t, c, nc, l, from, to)
	var olds, news int
	for i, subj := range subjects[c.Configs[0].Name] {
		s, key, ok := l.parseRoutedSubject(0, subj)
		if !ok {
			t.Fatalf("row %d: subject %s is not a routed row's", from+uint64(i), subj)
		}
		switch ow.RoutedBy(key, s, 16, 12) {
		case ow.RoutedOld:
			olds++
		case ow.RoutedNew:
			news++
		}
	}
	t.Logf("change took %s; rows %d..%d around it: %d routed over 16 only, %d over 12 only; %d publishes refused, %d timed out", took.Round(time.Millisecond), from, to, olds, news, refused.Load(), timedOut.Load())
	if olds == 0 || news == 0 {
		t.Fatalf("rows around the change: %d routed by the old transform, %d by the new: the change did not happen under traffic", olds, news)
	}
	return subjects, from
}

// disagreements counts the rows whose subject differs between replicas,
// logging the first few.
func disagreements(t *testing.T, subjects map[string][]string, from uint64) int {
	t.Helper()
	var names []string
	for name := range subjects {
		names = append(names, name)
	}
	slices.Sort(names)
	differ := 0
	for i := range subjects[names[0]] {
		for _, name := range names[1:] {
			if subjects[name][i] != subjects[names[0]][i] {
				if differ < 5 {
					t.Logf("row %d: %s stores %s, %s stores %s", from+uint64(i), names[0], subjects[names[0]][i], name, subjects[name][i])
				}
				differ++
			}
		}
	}
	return differ
}

// The switch of a replicated stream's transform (switchTransform): every
// replica stores every row under the same subject, rows flowing on both
// sides of the change.
//
// checks P1, P3
func TestATransformSwitchKeepsEveryReplicaRoutingEachRowAlike(t *testing.T) {
	subjects, from := switchUnderTraffic(t, func(ctx context.Context, c *natstest.Cluster, nc *nats.Conn, narrow Layout) error {
		_, err := ProvisionWith(ctx, nc, narrow, ProvisionOptions{System: c.ConnectSys(0)})
		return err
	})
	if n := disagreements(t, subjects, from); n > 0 {
		t.Errorf("%d rows stored under different subjects on different replicas", n)
	}
}

// What the switch guards against, on a real cluster: the transform of an
// R3 stream changed in place under traffic stores some rows under one
// subject on one replica and another on another (3 of 240 rows around the
// change in one run). The race is timing-bound, so the test tries up to
// five times and fails only if no try shows it: then NATS orders a
// transform change with the stream's rows, and the switch's pause may no
// longer be needed.
func TestAnInPlaceTransformChangeCanStoreARowUnderTwoSubjects(t *testing.T) {
	for try := 1; try <= 5; try++ {
		var n int
		t.Run(fmt.Sprintf("try %d", try), func(t *testing.T) {
			subjects, from := switchUnderTraffic(t, func(ctx context.Context, _ *natstest.Cluster, nc *nats.Conn, narrow Layout) error {
				cfg := narrow.StreamConfig(0)
				jsa := jsAPI{nc}
				info, err := jsa.streamInfo(ctx, cfg.Name)
				if err != nil {
					return err
				}
				next := info.Config
				next.SubjectTransform = cfg.SubjectTransform
				return jsa.updateStream(ctx, next)
			})
			n = disagreements(t, subjects, from)
		})
		if n > 0 {
			t.Logf("try %d: %d rows stored under different subjects on different replicas", try, n)
			return
		}
	}
	t.Errorf("five in-place changes under traffic, every replica agreed on every row: NATS may now order a transform change with the stream's rows (see switchTransform)")
}

// A switch with a replica already offline does not pause the stream: the
// pause would last as long as the replica stays away, so the switch
// waits with the input flowing and the old transform in place, and says
// which replica it waits for.
func TestATransformSwitchWaitsWithTheInputFlowingWhileAReplicaIsOffline(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(0)
	l := testLayout(1, 16, 3)
	l.Assignment = AssignByTransform
	mustProvision(t, nc, l)
	ctx := testContext(t, time.Minute)
	c.Servers[2].Shutdown()
	down := c.Configs[2].Name
	eventually(t, 30*time.Second, down+" seen offline or behind", func() bool {
		lagging, err := laggingReplicas(ctx, jsAPI{nc}, l.StreamName(0))
		return err == nil && slices.Contains(lagging, down)
	})
	narrow := l
	narrow.Shards = 12
	_, err := ProvisionWith(testContext(t, 20*time.Second), nc, narrow, ProvisionOptions{System: c.ConnectSys(0)})
	if err == nil || !strings.Contains(err.Error(), down) || !strings.Contains(err.Error(), "the input still flowing") {
		t.Fatalf("switch with %s down: %v; want a wait naming it", down, err)
	}
	info, err := jsAPI{nc}.streamInfo(ctx, l.StreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.Config.Subjects, l.StreamConfig(0).Subjects) || !sameTransform(info.Config.SubjectTransform, l.Transform(0)) {
		t.Fatalf("with a replica down the stream changed: subjects %v, transform %s; want %v and the 16-shard transform",
			info.Config.Subjects, transform(info.Config.SubjectTransform), l.StreamConfig(0).Subjects)
	}
}

// Which replicas the switch waits for before it pauses the input: the
// leader's "current" flag alone flickers under traffic, so a replica a
// little behind and heard from lately does not hold the switch back; one
// offline, silent or far behind does.
func TestAReplicaIsFitForThePauseWhenOnlineRecentAndNearlyCaughtUp(t *testing.T) {
	for _, c := range []struct {
		name string
		peer api.PeerInfo
		want bool
	}{
		{"current", api.PeerInfo{Current: true, Active: 100 * time.Millisecond}, true},
		{"a few entries behind under traffic", api.PeerInfo{Lag: 12, Active: 30 * time.Millisecond}, true},
		{"offline", api.PeerInfo{Offline: true, Current: true}, false},
		{"silent", api.PeerInfo{Lag: 1, Active: pauseMaxSilence + time.Second}, false},
		{"far behind", api.PeerInfo{Lag: pauseMaxLag + 1, Active: 10 * time.Millisecond}, false},
	} {
		if got := fitForPause(&c.peer); got != c.want {
			t.Errorf("%s (%+v): fit %t, want %t", c.name, c.peer, got, c.want)
		}
	}
}
