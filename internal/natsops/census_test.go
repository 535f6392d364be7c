package natsops

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// checks P4
func TestCensusSeesEveryServerOfTheCluster(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	l := testLayout(2, 2, 3)
	mustProvision(t, c.Connect(-1), l)

	for _, tc := range []struct {
		name      string
		opts      func(t *testing.T) CensusOptions
		placement string
	}{
		{"placed from the streams' listings", func(t *testing.T) CensusOptions {
			return CensusOptions{JetStream: natstest.ConnectURL(t, c.URLs()[2], natstest.AppUser, natstest.AppPassword), Consumers: l.Consumers()}
		}, "consumer-list"},
		{"placed from every server's JSZ", func(*testing.T) CensusOptions {
			return CensusOptions{Account: natstest.AppAccount, Consumers: l.Consumers()}
		}, "jsz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			census, err := TakeCensus(testContext(t, 10*time.Second), natstest.ConnectURL(t, c.URLs()[1], natstest.SysUser, natstest.SysPassword), tc.opts(t))
			if err != nil {
				t.Fatal(err)
			}
			logCensus(t, census)
			if census.Read.Placement != tc.placement {
				t.Fatalf("placement from %q, want %q", census.Read.Placement, tc.placement)
			}
			checkCensusOfThreeServers(t, c, l, census)
		})
	}
}

// checkCensusOfThreeServers checks a census of c with l's consumers.
func checkCensusOfThreeServers(t *testing.T, c *natstest.Cluster, l Layout, census *Census) {
	t.Helper()
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
	census, err := TakeCensus(testContext(t, 20*time.Second), sys, CensusOptions{Timeout: 500 * time.Millisecond, JetStream: c.Connect(0), Consumers: l.Consumers()})
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
		census, err = TakeCensus(testContext(t, 10*time.Second), c.ConnectSys(0), CensusOptions{JetStream: nc, Consumers: l.Consumers()})
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
	nc := c.Connect(0)
	l := testLayout(1, 2, 1)
	mustProvision(t, nc, l)

	for _, tc := range []struct {
		name    string
		floor   string
		allowed bool
	}{
		{name: "the floor met allows RESET", floor: "2.11.0", allowed: true},
		{name: "a floor above the server still refuses", floor: "99.0.0", allowed: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			census, err := TakeCensus(testContext(t, 10*time.Second), c.ConnectSys(0), CensusOptions{Floor: tc.floor, JetStream: nc, Consumers: l.Consumers()})
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

// A topology's census lists its own streams' consumers: on a cluster that
// holds thousands of other consumers in the same account, it decodes its
// own and reads what it read before they existed, while JSZ, which has no
// stream filter, reads them all.
//
// checks P4
func TestCensusOfATopologyDoesNotReadOtherConsumers(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(-1)
	sys := c.ConnectSys(0)
	l := testLayout(2, 4, 3)
	mustProvision(t, nc, l)
	census := func() *Census {
		t.Helper()
		cs, err := TakeCensus(testContext(t, 20*time.Second), sys, CensusOptions{JetStream: nc, Consumers: l.Consumers()})
		if err != nil {
			t.Fatal(err)
		}
		if !cs.FloorMet() || len(cs.Findings) != 0 {
			t.Fatalf("census: floor met %v, findings %v", cs.FloorMet(), cs.Findings)
		}
		for _, p := range cs.Consumers {
			if !p.Found || len(p.Hosts()) != 3 {
				t.Fatalf("placement %+v, want a leader and two replicas", p)
			}
		}
		return cs
	}
	alone := census()

	// Two other topologies' 2,000 R1 consumers in the same account.
	const others = 2000
	for range 2 {
		o := testLayout(2, others/4, 1)
		mustProvision(t, nc, o)
	}
	crowded := census()
	jsz, err := TakeCensus(testContext(t, 20*time.Second), sys, CensusOptions{Account: natstest.AppAccount, Consumers: l.Consumers()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("census of %d consumers: alone %+v; beside %d others %+v; the same from JSZ %+v", len(l.Consumers()), alone.Read, others, crowded.Read, jsz.Read)
	// The fault this guards against is visible: JSZ reads the crowd.
	if jsz.Read.Consumers < others {
		t.Fatalf("the JSZ census decoded %d consumers: the cluster does not hold the %d others this test needs", jsz.Read.Consumers, others)
	}
	for _, cs := range []*Census{alone, crowded} {
		if cs.Read.Placement != "consumer-list" || cs.Read.Consumers != len(l.Consumers()) {
			t.Fatalf("census read %+v: want only its own %d consumers, from their streams' listings", cs.Read, len(l.Consumers()))
		}
	}
	if crowded.Read.Bytes > alone.Read.Bytes*3/2 {
		t.Fatalf("census read %d bytes beside %d other consumers, %d alone: its cost grows with them", crowded.Read.Bytes, others, alone.Read.Bytes)
	}
}

// A listing that never answers (here a subscriber that swallows the
// requests, as a meta leader waiting for consumers' leaders would, for
// longer) ends before the caller's deadline: the census is still judged,
// fails closed for the unlisted consumers, and names the stream.
//
// checks P4
func TestCensusEndsAHangingListingBeforeItsDeadline(t *testing.T) {
	// No JetStream on the server, so only the swallower answers (and
	// never does) the listing in the application account.
	c := natstest.StartClusterWith(t, 1, func(_ int, cfg *natstest.ServerConfig) { cfg.NoJetStream = true })
	sys := c.ConnectSys(0)
	swallower := c.Connect(0)
	if _, err := swallower.Subscribe("$JS.API.CONSUMER.LIST.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := swallower.Flush(); err != nil {
		t.Fatal(err)
	}
	ref := ConsumerRef{Stream: "HANGS", Name: "ingest_0_0"}
	const deadline = 3 * time.Second
	start := time.Now()
	census, err := TakeCensus(testContext(t, deadline), sys, CensusOptions{Timeout: 300 * time.Millisecond, JetStream: c.Connect(0), Consumers: []ConsumerRef{ref}})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("census with a hanging listing: %v after %s, want a census judged before the %s deadline", err, took, deadline)
	}
	logCensus(t, census)
	// The fault took effect: the listing hung until the census cut it.
	if took < deadline/2 || took >= deadline {
		t.Fatalf("census took %s: want the listing to hang past half the %s deadline and be cut before it", took, deadline)
	}
	if p, _ := census.Consumer(ref.Stream, ref.Name); p.Found {
		t.Fatalf("placement %+v of a consumer whose listing never answered", p)
	}
	if !hasFinding(census, "stream HANGS: its consumers could not all be listed") {
		t.Fatalf("findings %v, want one naming the stream that was not listed", census.Findings)
	}
	if err := census.AllowReset(ref.Stream, ref.Name, time.Minute); !errors.Is(err, ErrRefused) {
		t.Fatalf("RESET of the unlisted consumer: %v, want refused", err)
	}
}
