package natsops

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// checks P4
func TestCensusSeesEveryServerOfTheCluster(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	l := testLayout(2, 2, 3)
	mustProvision(t, c.Connect(-1), l)

	census, err := TakeCensus(testContext(t, 10*time.Second), c.ConnectSys(1), CensusOptions{Account: natstest.AppAccount, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, census)
	if len(census.Servers) != 3 || !census.FloorMet() || census.MinVersion != server.VERSION {
		t.Fatalf("census %+v: want 3 servers at %s meeting the floor", census, server.VERSION)
	}
	if census.Connected != c.Configs[1].Name {
		t.Fatalf("connected %q, want %q", census.Connected, c.Configs[1].Name)
	}
	roles := map[Role]int{}
	for i, s := range census.Servers {
		if s.Name != c.Configs[i].Name || s.Version != server.VERSION || s.Cluster != c.Name || !s.Answered || !s.JetStream || s.APILevel < 1 || s.BelowFloor {
			t.Fatalf("server %d: %+v", i, s)
		}
		roles[s.Role]++
	}
	if roles[RoleMetaLeader] != 1 || roles[RoleMember] != 2 {
		t.Fatalf("roles %v, want one meta leader and two members", roles)
	}
	if len(census.Consumers) != 4 {
		t.Fatalf("consumers %+v", census.Consumers)
	}
	for _, p := range census.Consumers {
		if !p.Found || p.Leader == "" || len(p.Replicas) != 2 || slices.Contains(p.Replicas, p.Leader) {
			t.Fatalf("placement of %s: %+v, want a leader and two other replicas", p.ConsumerRef, p)
		}
	}
	if len(census.Findings) != 0 {
		t.Fatalf("findings %v", census.Findings)
	}
}

// checks P4
func TestCensusCountsAServerThatDoesNotAnswerAsBelowTheFloor(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	l := testLayout(1, 2, 3)
	mustProvision(t, c.Connect(-1), l)
	down := c.Configs[2].Name
	c.Servers[2].Shutdown()
	c.Servers[2].WaitForShutdown()

	sys := c.ConnectSys(0)
	census, err := TakeCensus(testContext(t, 10*time.Second), sys, CensusOptions{Timeout: 500 * time.Millisecond, Account: natstest.AppAccount, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, census)
	s, ok := census.Server(down)
	if !ok || s.Answered || s.Version != UnknownVersion || !s.BelowFloor || !s.Counted {
		t.Fatalf("stopped server %s: %+v, want unknown and below the floor", down, s)
	}
	if census.FloorMet() || census.MinVersion != UnknownVersion || !slices.Equal(census.BelowFloor, []string{down}) {
		t.Fatalf("census passes with a silent member: min %s, below %v", census.MinVersion, census.BelowFloor)
	}
	for _, ref := range l.Consumers() {
		err := census.AllowReset(ref.Stream, ref.Name, time.Minute)
		var refused *RefusedError
		if !errors.As(err, &refused) || !slices.Contains(refused.Servers, down) {
			t.Fatalf("RESET of %s: %v, want a refusal naming %s", ref, err, down)
		}
	}
}

func TestCensusNeedsTheSystemAccount(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	_, err := TakeCensus(testContext(t, 10*time.Second), c.Connect(0), CensusOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrNoReplies) {
		t.Fatalf("census as an application user: %v, want ErrNoReplies", err)
	}
}

func TestCensusJudgesAgainstTheFloorItIsGiven(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	sys := c.ConnectSys(0)
	census, err := TakeCensus(testContext(t, 10*time.Second), sys, CensusOptions{Floor: "v99.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	if census.FloorMet() || len(census.BelowFloor) != 1 || census.Floor != "99.0.0" || census.MinVersion != server.VERSION {
		t.Fatalf("census %+v: want the lone server below 99.0.0", census)
	}
	if _, err := TakeCensus(testContext(t, 10*time.Second), sys, CensusOptions{Floor: "2.14"}); !errors.Is(err, ErrBadVersion) {
		t.Fatalf("floor 2.14: %v, want ErrBadVersion", err)
	}
}

// logCensus prints the census the way the CLI would, to read in -v runs.
func logCensus(t testing.TB, c *Census) {
	t.Helper()
	var b strings.Builder
	for _, s := range c.Servers {
		b.WriteString("\n  " + s.Name + " " + s.Version + " " + string(s.Role) + " " + s.Cluster)
		if s.BelowFloor {
			b.WriteString(" BELOW: " + s.Reason)
		} else if !s.Counted {
			b.WriteString(" (not counted: " + s.Reason + ")")
		}
	}
	for _, f := range c.Findings {
		b.WriteString("\n  finding: " + f)
	}
	t.Logf("census through %s: min %s, below %v%s", c.Connected, c.MinVersion, c.BelowFloor, b.String())
}

// A census that waits for a server that never answers is as old as the
// first reply it judged, not as the moment it gave up waiting: the age a
// RESET guard computes from TakenAt must never be understated.
// checks P4
func TestCensusTakenAtIsTheFirstReplyNotTheEndOfTheWait(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	sys := c.ConnectSys(0)
	const wait = time.Second
	before := time.Now()
	census, err := TakeCensus(testContext(t, 10*time.Second), sys, CensusOptions{Timeout: wait, ExpectedServers: []string{"never-answers"}})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if after.Sub(before) < wait {
		t.Fatalf("census returned after %s; the test needs it to wait %s for the silent server", after.Sub(before), wait)
	}
	if s, ok := census.Server("never-answers"); !ok || s.Answered || !s.BelowFloor {
		t.Fatalf("silent server %+v, want expected, unknown and below the floor", s)
	}
	// The lone server answered at once; the census then waited for the
	// silent one. Its evidence is from the first reply.
	if census.TakenAt.Before(before) || census.TakenAt.Sub(before) > wait/2 {
		t.Fatalf("census taken at %s after it started (it returned after %s): want the first reply's time, well before the wait ended",
			census.TakenAt.Sub(before), after.Sub(before))
	}
}

// The census reads each inspected consumer's pending and unacknowledged
// rows from the JSZ replies it already collects, so the operator can tell
// a unit whose rows wait from one that is simply idle.
func TestCensusReportsEachConsumersPendingRows(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	l := testLayout(1, 2, 3)
	mustProvision(t, nc, l)
	js := mustJetStream(t, nc)
	publishShard(t, js, l, 0, 1, 3)
	fetchNoAck(t, js, l, 0, 1, 1)

	var census *Census
	eventually(t, 10*time.Second, "the census to count 2 pending and 1 unacknowledged row of unit 0.1", func() bool {
		var err error
		census, err = TakeCensus(testContext(t, 10*time.Second), c.ConnectSys(0), CensusOptions{Account: natstest.AppAccount, Consumers: l.Consumers()})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := census.Consumer(l.StreamName(0), l.ConsumerDurable(0, 1))
		return p.Pending == 2 && p.AckPending == 1
	})
	if p, _ := census.Consumer(l.StreamName(0), l.ConsumerDurable(0, 0)); p.Pending != 0 || p.AckPending != 0 {
		t.Fatalf("unit 0.0 %+v, want nothing pending", p)
	}
}

// A JetStream server that runs alone (no cluster block) reports its
// consumers without a leader in JSZ; it hosts them, so it is their leader
// and only replica. Before, every unit consumer "had no leader" and RESET
// was refused forever while the floor was met.
// checks P4
func TestCensusTakesAStandaloneServerAsTheLeaderOfTheConsumersItHosts(t *testing.T) {
	c := natstest.StartCluster(t, 1)
	l := testLayout(1, 2, 1)
	mustProvision(t, c.Connect(0), l)

	for _, tc := range []struct {
		name    string
		floor   string
		allowed bool
	}{
		{name: "the floor met allows RESET", floor: "2.11.0", allowed: true},
		{name: "a floor above the server still refuses", floor: "99.0.0", allowed: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			census, err := TakeCensus(testContext(t, 10*time.Second), c.ConnectSys(0), CensusOptions{Floor: tc.floor, Account: natstest.AppAccount, Consumers: l.Consumers()})
			if err != nil {
				t.Fatal(err)
			}
			logCensus(t, census)
			lone := c.Configs[0].Name
			for _, p := range census.Consumers {
				if !p.Found || p.Leader != lone || len(p.Replicas) != 0 {
					t.Fatalf("placement of %s: %+v, want %s as its leader and no other replica", p.ConsumerRef, p, lone)
				}
				err := census.AllowReset(p.Stream, p.Name, time.Minute)
				if tc.allowed && err != nil {
					t.Fatalf("RESET of %s refused on a lone server at the floor: %v", p.ConsumerRef, err)
				}
				var refused *RefusedError
				if !tc.allowed && (!errors.As(err, &refused) || !slices.Contains(refused.Servers, lone)) {
					t.Fatalf("RESET of %s below the floor: %v, want a refusal naming %s", p.ConsumerRef, err, lone)
				}
			}
			if s, _ := census.Server(lone); s.Consumers != 2 {
				t.Fatalf("server %+v, want it counted as the host of both consumers", s)
			}
		})
	}
}

// checks P4
// TestCensusCountsAMetaGroupMemberNobodyNamesAsBelowTheFloor: while a
// JetStream cluster elects a new meta leader after its leader died, no
// STATSZ reply lists the meta peers and active_servers already counts only
// the living, so nothing named the dead server; chaos 7 saw a census taken
// then allow RESET with one of three servers down. Every member still
// reports the meta group's size: the census counts the shortfall as
// unnamed servers below the floor.
func TestCensusCountsAMetaGroupMemberNobodyNamesAsBelowTheFloor(t *testing.T) {
	reply := func(name string, active int, meta *metaInfo) statszReply {
		var r statszReply
		r.Server = serverIdent{Name: name, ID: "id-" + name, Version: server.VERSION, Cluster: "c1", JetStream: true}
		r.Stats.ActiveServers = active
		r.Stats.JetStream = &struct {
			Stats *struct {
				API struct {
					Level int `json:"level"`
				} `json:"api"`
			} `json:"stats"`
			Meta *metaInfo `json:"meta"`
		}{Meta: meta}
		return r
	}
	census := func(statsz ...statszReply) *Census {
		floor, err := ParseVersion(DefaultFloor.String())
		if err != nil {
			t.Fatal(err)
		}
		b := &censusBuilder{opts: CensusOptions{}, floor: floor, statsz: map[string]statszReply{}}
		for _, r := range statsz {
			b.statsz[r.Server.Name] = r
			b.maxActive = max(b.maxActive, r.Stats.ActiveServers)
		}
		return b.build()
	}

	leaderless := census(reply("n1", 2, &metaInfo{Name: "_meta_", Size: 3}), reply("n2", 2, &metaInfo{Name: "_meta_", Size: 3}))
	if leaderless.FloorMet() || len(leaderless.BelowFloor) != 1 {
		t.Fatalf("two of a three-member meta group answered, no leader: floor met %t, below %v, findings %v; want one unnamed server below the floor",
			leaderless.FloorMet(), leaderless.BelowFloor, leaderless.Findings)
	}

	// The healthy cluster: the leader names its peers (under the cluster's
	// name, the others under the raft group's), nothing is missing.
	healthy := census(
		reply("n1", 3, &metaInfo{Name: "c1", Leader: "n1", Size: 3, Replicas: []peerInfo{{Name: "n2"}, {Name: "n3"}}}),
		reply("n2", 3, &metaInfo{Name: "_meta_", Leader: "n1", Size: 3}),
		reply("n3", 3, &metaInfo{Name: "_meta_", Leader: "n1", Size: 3}))
	if !healthy.FloorMet() || len(healthy.Findings) != 0 {
		t.Fatalf("every member answered: floor met %t, below %v, findings %v", healthy.FloorMet(), healthy.BelowFloor, healthy.Findings)
	}
}
