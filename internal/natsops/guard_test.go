package natsops

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// fakeCensus is a census of three members, a..c, with one consumer S/C led
// by a, tweaked per case.
func fakeCensus(now time.Time, tweak func(*Census)) *Census {
	c := &Census{
		TakenAt: now.Add(-time.Second),
		Floor:   "2.14.0",
		Servers: []ServerInfo{
			{Name: "a", Version: "2.14.9", Role: RoleMetaLeader, Answered: true, Counted: true},
			{Name: "b", Version: "2.14.9", Role: RoleMember, Answered: true, Counted: true},
			{Name: "c", Version: "2.14.9", Role: RoleMember, Answered: true, Counted: true},
		},
		Consumers: []ConsumerPlacement{{ConsumerRef: ConsumerRef{"S", "C"}, Found: true, Leader: "a", Replicas: []string{"b", "c"}}},
	}
	if tweak != nil {
		tweak(c)
	}
	return c
}

// checks P4
func TestGuardAllowsOnlyWithAFreshCensusShowingEveryServerAtTheVersion(t *testing.T) {
	now := time.Now()
	ref := ConsumerRef{"S", "C"}
	setVersion := func(name, v string) func(*Census) {
		return func(c *Census) {
			for i := range c.Servers {
				if c.Servers[i].Name == name {
					c.Servers[i].Version = v
					c.Servers[i].Answered = v != UnknownVersion
				}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		op      Op
		census  *Census
		blocked []string // nil: allowed
	}{
		{"all at 2.14 allows RESET", OpReset, fakeCensus(now, nil), nil},
		{"no census", OpReset, nil, []string{}},
		{"stale census", OpReset, fakeCensus(now, func(c *Census) { c.TakenAt = now.Add(-2 * time.Minute) }), []string{}},
		{"census from the future", OpReset, fakeCensus(now, func(c *Census) { c.TakenAt = now.Add(time.Hour) }), []string{}},
		{"consumer not inspected", OpReset, fakeCensus(now, func(c *Census) { c.Consumers = nil }), []string{}},
		{"consumer not found", OpReset, fakeCensus(now, func(c *Census) {
			c.Consumers[0] = ConsumerPlacement{ConsumerRef: ref}
			c.BelowFloor = []string{"hub"}
		}), []string{"hub"}},
		{"no leader", OpReset, fakeCensus(now, func(c *Census) { c.Consumers[0].Leader = "" }), []string{"b", "c"}},
		{"replica at 2.12", OpReset, fakeCensus(now, setVersion("c", "2.12.15")), []string{"c"}},
		{"leader at 2.12", OpReset, fakeCensus(now, setVersion("a", "2.12.15")), []string{"a"}},
		{"replica unknown", OpReset, fakeCensus(now, setVersion("b", UnknownVersion)), []string{"b"}},
		{"replica unparsable", OpReset, fakeCensus(now, setVersion("b", "2.14")), []string{"b"}},
		{"release candidate", OpReset, fakeCensus(now, setVersion("b", "2.14.0-rc.1")), []string{"b"}},
		{"replica missing from the census", OpReset, fakeCensus(now, func(c *Census) { c.Consumers[0].Replicas = []string{"b", "x"} }), []string{"x"}},
		{"member hosting nothing at 2.12", OpReset, fakeCensus(now, func(c *Census) {
			c.Consumers[0].Replicas = []string{"b"}
			setVersion("c", "2.12.15")(c)
		}), []string{"c"}},
		{"unnamed server", OpReset, fakeCensus(now, func(c *Census) {
			c.Servers = append(c.Servers, ServerInfo{Name: "(unnamed 1 of 1)", Version: UnknownVersion, Role: RoleUnknown, Counted: true})
		}), []string{"(unnamed 1 of 1)"}},
		{"leafnode spoke at 2.12 does not block", OpReset, fakeCensus(now, func(c *Census) {
			c.Servers = append(c.Servers, ServerInfo{Name: "leaf", Version: "2.12.15", Role: RoleLeafnode, Answered: true, Counted: true})
		}), nil},
		{"floor above 2.14 applies to RESET", OpReset, fakeCensus(now, func(c *Census) { c.Floor = "2.14.5"; setVersion("b", "2.14.4")(c) }), []string{"b"}},
		{"floor below 2.14 does not lower RESET's need", OpReset, fakeCensus(now, func(c *Census) { c.Floor = "2.11.0"; setVersion("b", "2.12.15")(c) }), []string{"b"}},
		{"UNPIN is fine with 2.12", OpUnpin, fakeCensus(now, setVersion("c", "2.12.15")), nil},
		{"UNPIN needs 2.11", OpUnpin, fakeCensus(now, setVersion("c", "2.10.24")), []string{"c"}},
		{"UNPIN refuses unknown", OpUnpin, fakeCensus(now, setVersion("a", UnknownVersion)), []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.census.Allow(tc.op, ref, time.Minute, now)
			if tc.blocked == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var refused *RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, ErrRefused) {
				t.Fatalf("got %v, want a *RefusedError", err)
			}
			if refused.Op != tc.op || refused.Consumer != ref || !slices.Equal(refused.Servers, tc.blocked) && !(len(tc.blocked) == 0 && len(refused.Servers) == 0) {
				t.Fatalf("refusal %+v, want op %s blocked by %v", refused, tc.op, tc.blocked)
			}
			t.Log(err)
		})
	}
}

// A verdict made from a census travels with the version of every server
// it listed (did not answer: ""), and allows RESET only when the census
// itself does.
// checks P4
func TestResetVerdictFromACensus(t *testing.T) {
	now := time.Now()
	v := fakeCensus(now, func(c *Census) {
		c.Servers = append(c.Servers, ServerInfo{Name: "gone", Version: UnknownVersion, Role: RoleLeafnode})
	}).ResetVerdict()
	want := map[string]string{"a": "2.14.9", "b": "2.14.9", "c": "2.14.9", "gone": ""}
	if !v.Allowed || v.Floor != "2.14.0" || !v.TakenAt.Equal(now.Add(-time.Second)) || !maps.Equal(v.Servers, want) {
		t.Fatalf("verdict %+v, want allowed with servers %v", v, want)
	}
	below := fakeCensus(now, func(c *Census) {
		c.Servers[2].Version = "2.12.15"
		c.BelowFloor, c.MinVersion = []string{"c"}, "2.12.15"
	}).ResetVerdict()
	if below.Allowed || !strings.Contains(below.Reason, "c") || below.Servers["c"] != "2.12.15" {
		t.Fatalf("verdict below the floor %+v, want refused naming c", below)
	}
	uncovered := fakeCensus(now, func(c *Census) { c.Consumers[0].Replicas = []string{"b", "x"} }).ResetVerdict()
	if uncovered.Allowed || !strings.Contains(uncovered.Reason, "x") {
		t.Fatalf("verdict with a consumer host the census did not see %+v, want refused naming x", uncovered)
	}
	var none *Census
	if v := none.ResetVerdict(); v.Allowed {
		t.Fatalf("no census: %+v", v)
	}
}

// GuardedReset against a real R3 consumer: it refuses, issuing nothing, a
// verdict that refuses, is too old, lacks a host of the consumer or lists
// one as silent; with a fresh verdict covering every host it RESETs, and
// the rows a dead owner held come back at once (not after ack_wait), to a
// new client once UNPIN lifts the dead owner's pin.
// checks P4
func TestGuardedResetOfAnR3ConsumerChecksItsCurrentHosts(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	l := testLayout(1, 1, 3)
	mustProvision(t, nc, l)
	js := mustJetStream(t, nc)
	ref := l.ConsumerRef(Unit{0, 0})

	publishShard(t, js, l, 0, 0, 5)
	fetchNoAck(t, js, l, 0, 0, 5)
	ci := mustConsumerInfo(t, js, ref.Stream, ref.Name)
	if ci.NumAckPending != 5 || len(ci.PriorityGroups) != 1 || ci.PriorityGroups[0].PinnedClientID == "" {
		t.Fatalf("before: ack pending %d, groups %+v; want 5 rows held by a pinned client", ci.NumAckPending, ci.PriorityGroups)
	}
	ctx := testContext(t, 30*time.Second)
	census, err := TakeCensus(ctx, c.ConnectSys(0), CensusOptions{JetStream: nc, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	v := census.ResetVerdict()
	if !v.Allowed {
		t.Fatalf("verdict %+v, want allowed on a cluster of one version", v)
	}
	replica := ci.Cluster.Replicas[0].Name
	refusals := []struct {
		name    string
		verdict func() ResetVerdict
		now     time.Time
		blocked []string
	}{
		{"a verdict that refuses", func() ResetVerdict { w := v; w.Allowed = false; return w }, time.Now(), nil},
		{"a stale verdict", func() ResetVerdict { return v }, v.TakenAt.Add(2 * time.Minute), nil},
		{"a replica missing from the verdict", func() ResetVerdict {
			w := v
			w.Servers = maps.Clone(v.Servers)
			delete(w.Servers, replica)
			return w
		}, time.Now(), []string{replica}},
		{"a replica that did not answer", func() ResetVerdict {
			w := v
			w.Servers = maps.Clone(v.Servers)
			w.Servers[replica] = ""
			return w
		}, time.Now(), []string{replica}},
		{"a leader below 2.14", func() ResetVerdict {
			w := v
			w.Servers = maps.Clone(v.Servers)
			w.Servers[ci.Cluster.Leader] = "2.12.15"
			return w
		}, time.Now(), []string{ci.Cluster.Leader}},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			err := GuardedReset(ctx, js, ref, tc.verdict(), time.Minute, tc.now)
			var refused *RefusedError
			if !errors.As(err, &refused) || refused.Op != OpReset || (tc.blocked != nil && !slices.Equal(refused.Servers, tc.blocked)) {
				t.Fatalf("GuardedReset: %v, want refused (blocking %v)", err, tc.blocked)
			}
			if got := mustConsumerInfo(t, js, ref.Stream, ref.Name); got.NumAckPending != 5 {
				t.Fatalf("a refused RESET changed the consumer: ack pending %d", got.NumAckPending)
			}
			t.Log(err)
		})
	}

	if err := GuardedReset(ctx, js, ref, v, time.Minute, time.Now()); err != nil {
		t.Fatalf("RESET: %v", err)
	}
	after := mustConsumerInfo(t, js, ref.Stream, ref.Name)
	if after.NumAckPending != 0 || after.NumPending != 5 {
		t.Fatalf("after RESET: ack pending %d, pending %d; want 0 and 5 (redelivered now, not after ack_wait)", after.NumAckPending, after.NumPending)
	}
	// The consumer is still pinned to the dead owner; UNPIN (2.11) lets
	// the next owner, a new client, take the rows.
	st, err := js.Stream(ctx, ref.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.UnpinConsumer(ctx, ref.Name, PriorityGroup); err != nil {
		t.Fatalf("UNPIN: %v", err)
	}
	start := time.Now()
	for i, m := range fetchNoAck(t, js, l, 0, 0, 5) {
		if md, err := m.Metadata(); err != nil || md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("row %d after RESET: metadata %+v (%v), want the same rows again from the ack floor", i, md, err)
		}
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("redelivery took %s", waited)
	}
}
