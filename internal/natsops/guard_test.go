package natsops

import (
	"errors"
	"slices"
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

// checks P4
func TestResetAndUnpinAnR3ConsumerWithAFreshCensus(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	l := testLayout(1, 1, 3)
	mustProvision(t, nc, l)
	js := mustJetStream(t, nc)
	stream, name := l.StreamName(0), l.ConsumerDurable(0, 0)

	publishShard(t, js, l, 0, 0, 5)
	fetchNoAck(t, js, l, 0, 0, 5)
	ci := mustConsumerInfo(t, js, stream, name)
	if ci.NumAckPending != 5 || len(ci.PriorityGroups) != 1 || ci.PriorityGroups[0].PinnedClientID == "" {
		t.Fatalf("before: ack pending %d, groups %+v; want 5 rows held by a pinned client", ci.NumAckPending, ci.PriorityGroups)
	}

	ctx := testContext(t, 30*time.Second)
	census, err := TakeCensus(ctx, c.ConnectSys(0), CensusOptions{Account: natstest.AppAccount, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	// A census older than the allowed age is refused before any request.
	if _, err := Reset(ctx, nc, census, stream, name, time.Nanosecond); !errors.Is(err, ErrRefused) {
		t.Fatalf("RESET with a stale census: %v, want refused", err)
	}
	if got := mustConsumerInfo(t, js, stream, name); got.NumAckPending != 5 {
		t.Fatalf("a refused RESET changed the consumer: ack pending %d", got.NumAckPending)
	}

	seq, err := Reset(ctx, nc, census, stream, name, time.Minute)
	if err != nil {
		t.Fatalf("RESET: %v", err)
	}
	if seq != 1 {
		t.Fatalf("reset to sequence %d, want 1 (the ack floor + 1)", seq)
	}
	// The rows the dead owner held are pending again at once, not after
	// ack_wait (30s).
	after := mustConsumerInfo(t, js, stream, name)
	if after.NumAckPending != 0 || after.NumPending != 5 {
		t.Fatalf("after RESET: ack pending %d, pending %d; want 0 and 5", after.NumAckPending, after.NumPending)
	}

	// The consumer is still pinned to the dead owner; UNPIN lets the next
	// owner, a new client, take the rows.
	if err := Unpin(ctx, nc, census, stream, name, PriorityGroup, time.Minute); err != nil {
		t.Fatalf("UNPIN: %v", err)
	}
	start := time.Now()
	rows := fetchNoAck(t, js, l, 0, 0, 5)
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("redelivery took %s", waited)
	}
	for _, m := range rows {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("row %d after RESET and UNPIN: delivered %d times", md.Sequence.Stream, md.NumDelivered)
	}
	pinned := mustConsumerInfo(t, js, stream, name).PriorityGroups
	if len(pinned) != 1 || pinned[0].PinnedClientID == "" || pinned[0].PinnedClientID == ci.PriorityGroups[0].PinnedClientID {
		t.Fatalf("priority groups %+v: want a new pinned client", pinned)
	}
	if err := Unpin(ctx, nc, census, stream, name, "nosuchgroup", time.Minute); err == nil || errors.Is(err, ErrRefused) {
		t.Fatalf("UNPIN of an unknown group: %v, want the server's error", err)
	}
}
