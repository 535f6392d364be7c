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

// leaves are the two leafnodes of design.md section 6: leafA binds only the
// application account across its leafnode connection, leafB binds the
// application account and SYS.
type leaves struct {
	a, b *natstest.Cluster
}

func startLeaves(t *testing.T, hubName string, hubLeafURLs func(user, pass string) []string) leaves {
	t.Helper()
	start := func(name string, bindSys bool) *natstest.Cluster {
		return natstest.StartClusterWith(t, 1, func(_ int, cfg *natstest.ServerConfig) {
			cfg.Name = hubName + "-" + name
			cfg.Domain = name // JetStream of a leaf stays its own
			cfg.LeafRemotes = []natstest.LeafRemote{{Account: natstest.AppAccount, URLs: hubLeafURLs(natstest.AppUser, natstest.AppPassword)}}
			if bindSys {
				cfg.LeafRemotes = append(cfg.LeafRemotes, natstest.LeafRemote{Account: natstest.SysAccount, URLs: hubLeafURLs(natstest.SysUser, natstest.SysPassword)})
			}
		})
	}
	return leaves{a: start("leafa", false), b: start("leafb", true)}
}

// censusWhenSeen takes censuses through nc until at least n servers answer:
// leafnode connections and system account interest take a moment to
// spread.
func censusWhenSeen(t *testing.T, nc *nats.Conn, opts CensusOptions, n int) *Census {
	t.Helper()
	var census *Census
	eventually(t, 20*time.Second, "census answered by enough servers", func() bool {
		var err error
		census, err = TakeCensus(testContext(t, 10*time.Second), nc, opts)
		if err != nil {
			t.Fatal(err)
		}
		answered := 0
		for _, s := range census.Servers {
			if s.Answered {
				answered++
			}
		}
		return answered >= n
	})
	return census
}

// checks P4
func TestCensusThroughLeafnodesSeesOnlyWhatTheSystemAccountReaches(t *testing.T) {
	hub := natstest.StartClusterWith(t, 3, natstest.WithLeafPorts(t))
	app := hub.Connect(-1)
	l := testLayout(1, 2, 3)
	mustProvision(t, app, l)
	lv := startLeaves(t, hub.Name, hub.LeafURLs)
	leafA, leafB := lv.a.Configs[0].Name, lv.b.Configs[0].Name
	// The consumers are listed through the connection that provisioned
	// them: the hub's JetStream, which the system account may not reach.
	opts := CensusOptions{Timeout: time.Second, JetStream: app, Consumers: l.Consumers()}
	hubNames := []string{hub.Configs[0].Name, hub.Configs[1].Name, hub.Configs[2].Name}

	t.Run("from leafB, which binds SYS, every hub server and leafB answer", func(t *testing.T) {
		census := censusWhenSeen(t, lv.b.ConnectSys(0), opts, 4)
		logCensus(t, census)
		answered := answeredNames(census)
		if !slices.Equal(answered, sorted(append(slices.Clone(hubNames), leafB))) {
			t.Fatalf("answered %v, want the hub and leafB", answered)
		}
		if !census.FloorMet() {
			t.Fatalf("floor not met: %v", census.BelowFloor)
		}
		for _, ref := range l.Consumers() {
			if err := census.AllowReset(ref.Stream, ref.Name, time.Minute); err != nil {
				t.Fatalf("RESET of %s from leafB's census: %v", ref, err)
			}
		}
	})

	t.Run("from the hub, leafB answers and leafA is listed but not counted", func(t *testing.T) {
		census := censusWhenSeen(t, hub.ConnectSys(0), opts, 4)
		logCensus(t, census)
		if got := answeredNames(census); !slices.Equal(got, sorted(append(slices.Clone(hubNames), leafB))) {
			t.Fatalf("answered %v, want the hub and leafB", got)
		}
		a, ok := census.Server(leafA)
		if !ok || a.Answered || a.Counted || a.BelowFloor || a.Role != RoleLeafnode {
			t.Fatalf("leafA %+v: want listed as an invisible leafnode that does not count", a)
		}
		b, _ := census.Server(leafB)
		if b.Role != RoleLeafnode || !b.Answered || b.Version != server.VERSION {
			t.Fatalf("leafB %+v", b)
		}
		if !census.FloorMet() || !hasFinding(census, "leafnode spoke "+leafA) {
			t.Fatalf("floor met %v, findings %v; want met, with a finding about leafA", census.FloorMet(), census.Findings)
		}
	})

	t.Run("from leafA, which binds only the app account, the hub is invisible and the census fails closed", func(t *testing.T) {
		sys := lv.a.ConnectSys(0)
		census, err := TakeCensus(testContext(t, 10*time.Second), sys, opts)
		if err != nil {
			t.Fatal(err)
		}
		logCensus(t, census)
		if got := answeredNames(census); !slices.Equal(got, []string{leafA}) {
			t.Fatalf("answered %v, want only leafA", got)
		}
		// What a naive census would conclude: everything it saw passes.
		if s, _ := census.Server(leafA); s.BelowFloor {
			t.Fatalf("leafA itself below the floor: %+v", s)
		}
		// The hub server leafA connects to is named by leafA's LEAFZ;
		// the listing names all three hub servers as the consumers'
		// hosts. None answered: all unknown, all below the floor.
		for _, name := range hubNames {
			if s, ok := census.Server(name); !ok || s.Answered || !s.BelowFloor || s.Version != UnknownVersion {
				t.Fatalf("hub server %s %+v: want unknown and below the floor", name, s)
			}
		}
		if census.FloorMet() || !slices.ContainsFunc(hubNames, func(h string) bool { return hasFinding(census, "leafnode hub "+h+" did not answer") }) {
			t.Fatalf("floor met %v, findings %v; want failed with a finding naming the hub server leafA connects to", census.FloorMet(), census.Findings)
		}
		for _, ref := range l.Consumers() {
			err := census.AllowReset(ref.Stream, ref.Name, time.Minute)
			var refused *RefusedError
			if !errors.As(err, &refused) || !slices.Equal(refused.Servers, sorted(slices.Clone(hubNames))) {
				t.Fatalf("RESET of %s from leafA's census: %v, want refused naming the hub servers %v", ref, err, hubNames)
			}
		}
	})

	t.Run("an application user gets no replies at all", func(t *testing.T) {
		if _, err := TakeCensus(testContext(t, 10*time.Second), lv.b.Connect(0), CensusOptions{Timeout: 300 * time.Millisecond}); !errors.Is(err, ErrNoReplies) {
			t.Fatalf("census as the app user: %v, want ErrNoReplies", err)
		}
	})
}

// The scenario of design.md section 6 with a real 2.12 hub server: only a
// leaf that binds SYS can see it, and the leaf that cannot fails closed
// instead of passing.
//
// checks P4
func TestLeafCensusSeesThe212HubServerOnlyThroughSys(t *testing.T) {
	new, old := natstest.Binary(t, natstest.Version214), natstest.Binary(t, natstest.Version212)
	hub := natstest.StartProcClusterWith(t, natstest.WithLeafPorts(t), new, new, old)
	app := hub.Connect(0)
	l := testLayout(1, 1, 3)
	mustProvision(t, app, l)
	lv := startLeaves(t, hub.Name, hub.LeafURLs)
	oldName := hub.Configs[oldServer].Name
	opts := CensusOptions{Timeout: time.Second, JetStream: app, Consumers: l.Consumers()}

	fromB := censusWhenSeen(t, lv.b.ConnectSys(0), opts, 4)
	logCensus(t, fromB)
	if fromB.FloorMet() || !slices.Equal(fromB.BelowFloor, []string{oldName}) || fromB.MinVersion != "2.12.15" {
		t.Fatalf("census from leafB: min %s, below %v; want %s at 2.12.15", fromB.MinVersion, fromB.BelowFloor, oldName)
	}

	fromA, err := TakeCensus(testContext(t, 10*time.Second), lv.a.ConnectSys(0), opts)
	if err != nil {
		t.Fatal(err)
	}
	logCensus(t, fromA)
	if fromA.FloorMet() || fromA.MinVersion != UnknownVersion {
		t.Fatalf("census from leafA passed (min %s): it saw 2.15 everywhere while the hub runs 2.12.15", fromA.MinVersion)
	}
	ref := l.Consumers()[0]
	if err := fromA.AllowReset(ref.Stream, ref.Name, time.Minute); !errors.Is(err, ErrRefused) {
		t.Fatalf("RESET from leafA's census: %v, want refused", err)
	}
}

func answeredNames(c *Census) []string {
	var names []string
	for _, s := range c.Servers {
		if s.Answered {
			names = append(names, s.Name)
		}
	}
	return names
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

func hasFinding(c *Census, prefix string) bool {
	return slices.ContainsFunc(c.Findings, func(f string) bool { return strings.HasPrefix(f, prefix) })
}
