package worker_test

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Takeovers with real worker processes: a SIGKILLed holder's in-flight row
// comes back through RESET only when the census allows it (P4), and
// otherwise after ack wait; a crash-restarted or registry-starved worker's
// units flow again within lease + grace + a few seconds (defect 11).

// deliveries returns, from the fleet's history files, every delivery of
// row id: member and wall time, sorted by time.
func deliveries(t *testing.T, f *fleettest.Fleet, id string) []delivered {
	t.Helper()
	procs, err := history.ReadDir(f.HistoryDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []delivered
	for _, p := range procs {
		for _, r := range p.Records {
			if r.Kind == history.KindDeliver && r.RowID == id {
				out = append(out, delivered{member: r.Member, at: p.WallTime(r.Start)})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

type delivered struct {
	member string
	at     time.Time
}

// resets counts the RESET records in the fleet's history.
func resets(t *testing.T, f *fleettest.Fleet) int {
	t.Helper()
	procs, err := history.ReadDir(f.HistoryDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		for _, r := range p.Records {
			if r.Kind == history.KindReset {
				n++
			}
		}
	}
	return n
}

// TestSigkillTakeoverReturnsInFlightRows kills a worker while a row is in
// its handler. The row must reach the new owner through RESET within lease
// + grace + a few seconds when the census allows it, and only after ack
// wait, with no RESET, when the verdict refuses or is stale (P4).
//
// checks P1, P3, P4, P5
func TestSigkillTakeoverReturnsInFlightRows(t *testing.T) {
	const ackWait = 10 * time.Second
	for _, tc := range []struct {
		name    string
		publish func(f *fleettest.Fleet)
		reset   bool
	}{
		{"census allows RESET", func(f *fleettest.Fleet) { f.PublishCensus(natsops.DefaultFloor.String()) }, true},
		{"census below the floor refuses", func(f *fleettest.Fleet) { f.PublishCensus("2.99.0") }, false},
		{"stale census refuses", func(f *fleettest.Fleet) {
			c := f.PublishCensus(natsops.DefaultFloor.String())
			servers := map[string]string{}
			for _, s := range c.Servers {
				servers[s.Name] = s.Version
			}
			// Taken 3 minutes ago: older than the workers' MaxCensusAge.
			perm := poolctl.ResetPermission{Allowed: true, Floor: c.Floor, Servers: servers, CensusAge: 3 * time.Minute, Reason: "test: old census"}
			if err := f.Registry.PublishResetPermission(context.Background(), f.Topology, perm); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := ownership.Topology{Partitions: 1, Shards: 2}
			f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards, AckWait: ackWait})
			tc.publish(f)
			f.StartWorker("w-0")
			w1 := f.StartWorkerWith("w-1", "WORKER_HANDLER_DELAY=1h")
			h := waitSettled(t, f, topo, 2)
			var unit ownership.Unit
			for u, hs := range h {
				if hs[0] == "w-1" {
					unit, _ = ownership.ParseUnit(u)
				}
			}
			rows := f.PublishBurst([]ownership.Unit{unit}, 1)
			var id string
			for k := range rows {
				id = k
			}
			var first time.Time
			fleettest.Eventually(t, 30*time.Second, func() error {
				ds := deliveries(t, f, id)
				if len(ds) == 0 {
					return fmt.Errorf("w-1 has not taken row %s yet", id)
				}
				first = ds[0].at
				return nil
			})
			killed := time.Now()
			if err := w1.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			v, _ := judge(t, f, rows)
			ds := deliveries(t, f, id)
			again := ds[len(ds)-1]
			p := f.Opts.Params
			t.Logf("row %s: first delivered by w-1, again by %s %s after the kill and %s after its first delivery (lease %s, grace %s, ack wait %s); %d RESETs",
				id, again.member, again.at.Sub(killed).Round(time.Millisecond), again.at.Sub(first).Round(time.Millisecond),
				p.LeaseTTL, p.Grace, ackWait, resets(t, f))
			switch {
			case again.member != "w-0":
				t.Fatalf("row %s last delivered by %s, want w-0", id, again.member)
			case tc.reset && again.at.Sub(killed) > p.LeaseTTL+p.Grace+5*time.Second:
				t.Fatalf("the in-flight row came back %s after the kill; RESET should bring it within lease + grace + 5s", again.at.Sub(killed))
			case tc.reset && resets(t, f) == 0:
				t.Fatal("no RESET recorded although the census allowed it")
			case !tc.reset && resets(t, f) != 0:
				t.Fatalf("%d RESETs although the census did not allow them (P4)", resets(t, f))
			case !tc.reset && again.at.Sub(first) < ackWait-time.Second:
				// A second of slack: the history stamps a delivery a moment
				// after NATS sent it. A RESET would bring it back in about
				// lease + grace, far below.
				t.Fatalf("the row came back %s after its first delivery, before ack wait (%s), without a RESET", again.at.Sub(first), ackWait)
			}
			if v.DupTakeover+v.DupReset+v.DupRedelivery != v.Duplicates {
				t.Fatalf("unexplained duplicates: %d", v.DupUnexplained)
			}
		})
	}
}

// unitsFlowingSince waits until every unit of topo has a row written to
// the sink after since, and returns how long after since the last unit
// started flowing again.
func unitsFlowingSince(t *testing.T, f *fleettest.Fleet, topo ownership.Topology, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	var worst time.Duration
	fleettest.Eventually(t, timeout, func() error {
		sink, err := f.Sink(context.Background())
		if err != nil {
			return err
		}
		first := map[string]time.Time{}
		for _, w := range sink {
			if w.WrittenAt.After(since) && (first[w.Unit].IsZero() || w.WrittenAt.Before(first[w.Unit])) {
				first[w.Unit] = w.WrittenAt
			}
		}
		worst = 0
		for _, u := range topo.Units() {
			at, ok := first[u.String()]
			if !ok {
				return fmt.Errorf("unit %s has not delivered since %s", u, since.Format(time.StampMilli))
			}
			worst = max(worst, at.Sub(since))
		}
		return nil
	})
	return worst
}

// Defect 11: a worker SIGKILLed and restarted under the same name (a crash
// or OOM kill) gets its units flowing again within lease + grace + 5s of
// the restart, not after the dead process's pin times out.
//
// checks P3 (delay), P1
func TestCrashRestartedWorkerDeliversAgainWithinLeasePlusGrace(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	f.StartWorker("w-0")
	w1 := f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)
	pub := f.StartPublisher(topo, 100)
	if err := w1.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	f.StartWorker("w-1")
	p := f.Opts.Params
	bound := p.LeaseTTL + p.Grace + 5*time.Second
	took := unitsFlowingSince(t, f, topo, restarted, time.Minute)
	t.Logf("after a crash-restart every unit delivered again within %s (bound lease + grace + 5s = %s; pinned TTL %s)",
		took.Round(time.Millisecond), bound, f.Layout.PinnedTTL)
	if took > bound {
		t.Fatalf("units flowed again only %s after the restart, want within %s", took, bound)
	}
	checkEvidence(t, f, pub)
}

// Defect 11: PostgreSQL hung (every process SIGSTOPped) for longer than
// lease + grace, then resumed: every worker fences, nothing is delivered
// meanwhile, and every unit flows again within lease + grace + 5s of the
// resume.
//
// checks P3 (delay), P1, P5
func TestRowsFlowAgainSoonAfterARegistryOutage(t *testing.T) {
	topo := ownership.Topology{Partitions: 2, Shards: 4}
	f := fleettest.Start(t, fleettest.Options{Partitions: topo.Partitions, Shards: topo.Shards})
	f.StartWorker("w-0")
	f.StartWorker("w-1")
	waitSettled(t, f, topo, 2)
	pub := f.StartPublisher(topo, 100)
	p := f.Opts.Params
	if err := f.PG.SignalAll(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	outage := p.LeaseTTL + p.Grace + 2*time.Second
	<-time.After(outage) // the fault's length, not a wait for a condition
	if err := f.PG.SignalAll(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	bound := p.LeaseTTL + p.Grace + 5*time.Second
	took := unitsFlowingSince(t, f, topo, resumed, time.Minute)
	t.Logf("after a %s registry outage every unit delivered again within %s of the resume (bound %s)", outage, took.Round(time.Millisecond), bound)
	if took > bound {
		t.Fatalf("units flowed again only %s after the registry came back, want within %s", took, bound)
	}
	checkEvidence(t, f, pub)
}

// Defect 3: a shrink whose leaving units' holder dies (SIGKILL) or stops
// (SIGTERM) while draining them: another worker drains what is left, and
// the units end released, not held forever.
//
// checks P3
func TestLeavingUnitsOfAStoppedHolderAreDrainedByAnother(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			from, to := ownership.Topology{Partitions: 1, Shards: 4}, ownership.Topology{Partitions: 1, Shards: 2}
			f := fleettest.Start(t, fleettest.Options{Partitions: from.Partitions, Shards: from.Shards})
			// A slow sink, so the backlog outlasts the holder.
			workers := map[string]*fleettest.Worker{}
			for _, name := range []string{"w-0", "w-1"} {
				workers[name] = f.StartWorkerWith(name, "WORKER_HANDLER_DELAY=20ms")
			}
			h := waitSettled(t, f, from, 2)
			holder := h["0.3"][0]
			leaving := []ownership.Unit{{Partition: 0, Shard: 3}}
			backlog := f.PublishBurst(leaving, 600)
			f.ChangeTopology(to.Partitions, to.Shards)
			// Let the holder start draining, then stop it.
			fleettest.Eventually(t, 30*time.Second, func() error {
				d, _ := f.WaitDelivered(backlog, 0)
				if d.Delivered < 10 {
					return fmt.Errorf("only %d backlog rows delivered", d.Delivered)
				}
				return nil
			})
			if err := workers[holder].Signal(sig); err != nil {
				t.Fatal(err)
			}
			judge(t, f, backlog)
			fleettest.Eventually(t, 30*time.Second, func() error {
				cs, err := f.Registry.Claims(context.Background(), f.Topology)
				if err != nil {
					return err
				}
				for _, c := range cs {
					if c.Unit == "0.3" && c.State != poolctl.StateFree {
						return fmt.Errorf("leaving unit 0.3 still %s by %s", c.State, c.Owner)
					}
				}
				return nil
			})
		})
	}
}
