package fleettest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Source says where a fleet's evidence is: the workers' history files,
// the registry (its history) and the sink's database, and which processes
// the harness started.
type Source struct {
	HistoryDir string
	DSN        string
	Registry   poolctl.HistoryReader
	Topology   string
	// Expected lists every worker process the harness started (each
	// incarnation); the checker fails a run where one left no history.
	Expected []historycheck.ExpectedProcess
	// Grace is P5's adoption grace; zero reads the topology's from the
	// registry at DSN.
	Grace time.Duration
	// RowPrefix, when set, keeps only sink writes of rows whose id starts
	// with it (a sink shared with another fleet).
	RowPrefix string
	// Keys are the published rows' keys and per-key sequence numbers
	// (Fleet.Keyed), for the per-key order check; nil leaves it n/a.
	Keys map[string]historycheck.KeyedRow
}

// Evidence gathers what the history checker judges: every worker's
// delivery history, the registry's claim, lease and epoch history, every
// sink write and what was published (with every row's key and sequence).
func (f *Fleet) Evidence(ctx context.Context, published map[string]ownership.Unit) (historycheck.Input, error) {
	ids := make(map[string]string, len(published))
	for id, u := range published {
		ids[id] = u.String()
	}
	in, err := Gather(ctx, Source{HistoryDir: f.HistoryDir, DSN: f.DSN, Registry: f.Registry, Topology: f.Topology,
		Expected: f.Expected(), RowPrefix: f.Opts.RowPrefix, Keys: f.Keyed()}, ids)
	in.Ordering = f.Opts.Ordering
	return in, err
}

// Gather reads the evidence at src; published maps row ids to units.
func Gather(ctx context.Context, src Source, published map[string]string) (historycheck.Input, error) {
	procs, err := history.ReadDir(src.HistoryDir)
	if err != nil {
		return historycheck.Input{}, fmt.Errorf("read delivery histories: %w", err)
	}
	in := historycheck.Input{Processes: procs, Published: published, Expected: src.Expected, Grace: src.Grace, Keys: src.Keys}
	if in.Grace == 0 {
		if in.Grace, err = ReadGrace(ctx, src.DSN, src.Topology); err != nil {
			return in, err
		}
	}
	sink, err := ReadSink(ctx, src.DSN)
	if err != nil {
		return in, fmt.Errorf("read sink: %w", err)
	}
	for _, w := range ownRows(sink, src.RowPrefix) {
		in.Sink = append(in.Sink, historycheck.SinkWrite{RowID: w.ID, Unit: w.Unit, Member: w.Member, Epoch: w.Epoch, At: w.WrittenAt})
	}
	if err := registryEvidence(ctx, src, &in); err != nil {
		return in, err
	}
	return in, nil
}

// registryEvidence adds the registry's history to in.
func registryEvidence(ctx context.Context, src Source, in *historycheck.Input) error {
	claims, err := src.Registry.ClaimHistory(ctx, src.Topology)
	if err != nil {
		return fmt.Errorf("read claim history: %w", err)
	}
	for _, c := range claims {
		in.Claims = append(in.Claims, historycheck.ClaimEvent{Unit: c.Unit, Owner: c.Owner, Incarnation: c.Incarnation,
			Epoch: c.Epoch, State: string(c.State), Under: c.Under, Op: c.Op, At: c.At})
	}
	leases, err := src.Registry.LeaseHistory(ctx, src.Topology)
	if err != nil {
		return fmt.Errorf("read lease history: %w", err)
	}
	for _, l := range leases {
		in.Leases = append(in.Leases, historycheck.LeaseEvent{Member: l.Member, Incarnation: l.Incarnation, At: l.At,
			ExpiresAt: l.ExpiresAt, Left: l.Left, Fenced: l.Fenced, FenceLiftedAt: l.FenceLiftedAt})
	}
	epochs, err := src.Registry.EpochHistory(ctx, src.Topology)
	if err != nil {
		return fmt.Errorf("read epoch history: %w", err)
	}
	for _, e := range epochs {
		if e.ActivatedAt.IsZero() {
			continue // never active: nothing was decided under it
		}
		in.Epochs = append(in.Epochs, historycheck.EpochSpan{Number: e.Number, Partitions: e.Partitions, Shards: e.Shards,
			ActivatedAt: e.ActivatedAt, RetiredAt: e.RetiredAt})
	}
	return nil
}

// ReadGrace reads the topology's adoption grace from the registry at dsn.
func ReadGrace(ctx context.Context, dsn, topology string) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, fmt.Errorf("read grace: %w", err)
	}
	defer conn.Close(ctx)
	var grace time.Duration
	if err := conn.QueryRow(ctx, `SELECT grace FROM shardkeeper.topologies WHERE topology = $1`, topology).Scan(&grace); err != nil {
		return 0, fmt.Errorf("read grace of topology %s: %w", topology, err)
	}
	return grace, nil
}

// Verdict waits until every published row reached the sink (or timeout),
// then judges the fleet's evidence. noRegistry marks a baseline without
// claims. The delivery error, if any, is returned beside the verdict (the
// verdict counts the lost rows too).
func (f *Fleet) Verdict(published map[string]ownership.Unit, timeout time.Duration, noRegistry bool) (historycheck.Verdict, Delivery, error) {
	d, waitErr := f.WaitDelivered(published, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, err := f.Evidence(ctx, published)
	if err != nil {
		return historycheck.Verdict{}, d, err
	}
	in.NoRegistry = noRegistry
	return historycheck.Check(in), d, waitErr
}
