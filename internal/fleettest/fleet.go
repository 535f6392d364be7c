// Package fleettest runs a real fleet for tests and the demo: a NATS
// JetStream cluster, a PostgreSQL registry, the unit consumers of a
// topology, reference worker processes (cmd/shardkeeper-worker), a
// publisher of uniquely numbered rows, each of a key and numbered in its
// key's sequence, and checkers for the promises: no
// unit held by two workers at once (P1) and every published row in the
// sink (P3), with duplicates counted.
//
// It owns the harness. What the workers and the registry do is the code
// under test; this package only starts, observes and checks.
package fleettest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// Options shape a fleet.
type Options struct {
	// Partitions and Shards of the first epoch.
	Partitions, Shards int
	// Params are the registry's lease parameters; zero means a fast but
	// valid set for tests.
	Params poolctl.Params
	// Servers in the NATS cluster (default 3) and replicas of every
	// stream and consumer (default Servers).
	Servers, Replicas int
	// AckWait of the unit consumers (default 5s).
	AckWait time.Duration
	// DrainTimeout of each worker's handovers (default 5s).
	DrainTimeout time.Duration
	// Topology is the registry key, "namespace/name" (default
	// "default/fleet").
	Topology string
	// NATS, when set, is a running cluster to use instead of starting
	// in-process servers (e.g. separate server processes a test kills).
	NATS NATS
	// PG, when set, is a running PostgreSQL server to create the fleet's
	// database on instead of starting one.
	PG *pgtest.Server
	// RegistryDSN, when set, is another fleet's database to keep this
	// fleet's registry and sink in (two topologies sharing one registry;
	// the guarded sink must live beside the claims it checks). Give both
	// fleets a RowPrefix so each reads only its own rows from the shared
	// sink.
	RegistryDSN string
	// RowPrefix starts every row id the fleet's publishers send; the
	// fleet's sink reads and evidence keep only rows that carry it.
	RowPrefix string
	// SubjectPrefix of the streams (default "shardkeeper"), so fleets
	// sharing a NATS cluster keep apart.
	SubjectPrefix string
	// Assignment says who picks a row's shard (default: the publisher).
	Assignment natsops.ShardAssignment
	// Ordering is the per-key order the run declares (the topology's
	// spec.rollout.ordering): under PerKey, Evidence makes the checker
	// fail a cross-unit per-key inversion.
	Ordering historycheck.Ordering
}

// NATS is the cluster a fleet runs on: in-process servers
// (natstest.Cluster) or separate server processes
// (natstest.ProcCluster). Connections it opens are closed when the test
// that asked for them ends.
type NATS interface {
	// URLs are the client URLs of every server, without credentials.
	URLs() []string
	// Connect connects as the application user to server i (every
	// server when i is negative).
	Connect(i int, opts ...nats.Option) *nats.Conn
	// ConnectSys connects as the system account user.
	ConnectSys(i int, opts ...nats.Option) *nats.Conn
}

// FastParams are lease parameters that keep takeover tests short while
// satisfying P5: grace >= renew interval + query bound.
func FastParams() poolctl.Params {
	return poolctl.Params{LeaseTTL: 2 * time.Second, RenewInterval: 400 * time.Millisecond,
		QueryBound: 500 * time.Millisecond, Grace: time.Second}
}

// Fleet is a running fleet.
type Fleet struct {
	T    testing.TB
	Opts Options
	NATS NATS
	PG   *pgtest.Server
	// DSN reaches the fleet's database directly: the registry, sink and
	// evidence reads of the test.
	DSN string
	// ClientDSN is what workers get as REGISTRY_DSN: DSN unless a test
	// puts something between them and the database (a fault proxy).
	ClientDSN string
	Registry  *poolctl.PG
	Topology  string
	Layout    natsops.Layout
	// HistoryDir is where every worker of the fleet writes its delivery
	// history (one file per process).
	HistoryDir string

	// envelope is every shape provisioned so far.
	envelope ownership.Topology

	mu      sync.Mutex
	workers map[string]*Worker
	// started is every worker process the fleet started, restarts too.
	started []*Worker
	// sources list the worker processes others started (AddProcesses).
	sources []func() []historycheck.ExpectedProcess

	keyMu sync.Mutex
	// keySeq is each key's last sequence number given out; keyed holds
	// every acknowledged row's key and sequence number (Keyed).
	keySeq map[string]int64
	keyed  map[string]historycheck.KeyedRow
}

// Start starts NATS, PostgreSQL and the registry, provisions the first
// epoch's consumers and activates it, as the operator would. Workers are
// started separately.
func Start(t testing.TB, o Options) *Fleet {
	t.Helper()
	f := StartInfra(t, o)
	f.ChangeTopology(o.Partitions, o.Shards)
	return f
}

// StartInfra starts NATS, PostgreSQL and a migrated registry with the
// topology's lease parameters, and nothing else: end-to-end tests leave
// provisioning and epochs to the operator.
func StartInfra(t testing.TB, o Options) *Fleet {
	t.Helper()
	if o.Params == (poolctl.Params{}) {
		o.Params = FastParams()
	}
	if o.Servers == 0 {
		o.Servers = 3
	}
	if o.Replicas == 0 {
		o.Replicas = o.Servers
	}
	if o.AckWait == 0 {
		o.AckWait = 5 * time.Second
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 5 * time.Second
	}
	if o.Topology == "" {
		o.Topology = "default/fleet"
	}
	if o.SubjectPrefix == "" {
		o.SubjectPrefix = "shardkeeper"
	}
	f := &Fleet{T: t, Opts: o, Topology: o.Topology, workers: map[string]*Worker{}, HistoryDir: t.TempDir(),
		keySeq: map[string]int64{}, keyed: map[string]historycheck.KeyedRow{}}
	f.NATS, f.PG = o.NATS, o.PG
	if f.NATS == nil {
		f.NATS = natstest.StartCluster(t, o.Servers)
	}
	if f.PG == nil {
		f.PG = pgtest.New(t)
	}
	f.DSN = o.RegistryDSN
	if f.DSN == "" {
		f.DSN = f.PG.NewTestDatabase(t)
	}
	f.ClientDSN = f.DSN
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: f.DSN})
	if err != nil {
		t.Fatalf("open registry: %v", err)
	}
	t.Cleanup(reg.Close)
	f.Registry = reg
	if err := reg.EnsureTopology(ctx, f.Topology, o.Params); err != nil {
		t.Fatalf("ensure topology: %v", err)
	}
	f.Layout = natsops.Layout{SubjectPrefix: o.SubjectPrefix, ConsumerName: "ingest", Replicas: o.Replicas,
		PinnedTTL: 30 * time.Second, AckWait: o.AckWait, Partitions: o.Partitions, Shards: o.Shards, Assignment: o.Assignment}
	t.Cleanup(f.StopAll)
	return f
}

// Provision provisions l on the fleet's cluster as the operator does,
// with the system-account connection a change of a replicated stream's
// transform needs.
func (f *Fleet) Provision(ctx context.Context, l natsops.Layout) (*natsops.Report, error) {
	return natsops.ProvisionWith(ctx, f.NATS.Connect(0), l, natsops.ProvisionOptions{System: f.NATS.ConnectSys(0)})
}

// ChangeTopology provisions the consumers of (n, v) and rolls the registry
// to it the way the operator does: pending, wait for every live member's
// freeze acknowledgement, activate. It returns the new epoch.
func (f *Fleet) ChangeTopology(n, v int) int64 {
	f.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f.Layout.Partitions, f.Layout.Shards = n, v
	if _, err := f.Provision(ctx, f.Layout); err != nil {
		f.T.Fatalf("provision %dx%d: %v", n, v, err)
	}
	epoch, err := f.Registry.CreatePending(ctx, f.Topology, n, v)
	if err != nil {
		f.T.Fatalf("create pending %dx%d: %v", n, v, err)
	}
	Eventually(f.T, 30*time.Second, func() error {
		return f.Registry.Activate(ctx, f.Topology, epoch)
	})
	f.envelope = ownership.Topology{Partitions: max(f.envelope.Partitions, n), Shards: max(f.envelope.Shards, v)}
	if err := f.Registry.SetRetiring(ctx, f.Topology, f.Leaving()); err != nil {
		f.T.Fatalf("publish the retiring set: %v", err)
	}
	return epoch
}

// Leaving lists, like the operator's retiring set, the units provisioned
// so far that the active shape no longer has.
func (f *Fleet) Leaving() []string {
	active := ownership.Topology{Partitions: f.Layout.Partitions, Shards: f.Layout.Shards}
	var out []string
	for _, u := range f.envelope.Units() {
		if !active.Contains(u) {
			out = append(out, u.String())
		}
	}
	return out
}

// Eventually polls cond until it returns nil or the deadline passes.
var Eventually = testbed.Eventually

var (
	buildOnce sync.Once
	workerBin string
	buildErr  error
)

// WorkerBinary builds cmd/shardkeeper-worker once per test binary.
func WorkerBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { workerBin, buildErr = BuildWorker() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return workerBin
}

// BuildWorker builds cmd/shardkeeper-worker into a new temporary
// directory and returns the binary's path.
func BuildWorker() (string, error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "shardkeeper-worker-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "shardkeeper-worker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/shardkeeper-worker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build shardkeeper-worker: %w\n%s", err, out)
	}
	return bin, nil
}

// PublishCensus takes a real census of the fleet's NATS cluster against
// floor (every unit consumer of the active shape inspected) and publishes
// its verdict for the workers' RESET guard, as the operator does. It
// returns the census.
func (f *Fleet) PublishCensus(floor string) *natsops.Census {
	f.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var refs []natsops.ConsumerRef
	for _, u := range (ownership.Topology{Partitions: f.Layout.Partitions, Shards: f.Layout.Shards}).Units() {
		refs = append(refs, f.Layout.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard}))
	}
	c, err := natsops.TakeCensus(ctx, f.NATS.ConnectSys(0), natsops.CensusOptions{Floor: floor, JetStream: f.NATS.Connect(0), Consumers: refs})
	if err != nil {
		f.T.Fatalf("census: %v", err)
	}
	servers := map[string]string{}
	for _, s := range c.Servers {
		if s.Answered {
			servers[s.Name] = s.Version
		} else {
			servers[s.Name] = ""
		}
	}
	perm := poolctl.ResetPermission{Allowed: c.FloorMet(), Floor: c.Floor, Servers: servers,
		CensusAge: time.Since(c.TakenAt), Reason: fmt.Sprintf("test census: minimum %s against floor %s", c.MinVersion, c.Floor)}
	if err := f.Registry.PublishResetPermission(ctx, f.Topology, perm); err != nil {
		f.T.Fatalf("publish census verdict: %v", err)
	}
	return c
}
