package fleettest

import (
	"context"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Evidence gathers what the history checker judges: every worker's
// delivery history, the registry's claim, lease and epoch history, every
// sink write and what was published.
func (f *Fleet) Evidence(ctx context.Context, published map[string]ownership.Unit) (historycheck.Input, error) {
	procs, err := history.ReadDir(f.HistoryDir)
	if err != nil {
		return historycheck.Input{}, fmt.Errorf("read delivery histories: %w", err)
	}
	in := historycheck.Input{Processes: procs, Published: map[string]string{}}
	for id, u := range published {
		in.Published[id] = u.String()
	}
	sink, err := f.Sink(ctx)
	if err != nil {
		return in, fmt.Errorf("read sink: %w", err)
	}
	for _, w := range sink {
		in.Sink = append(in.Sink, historycheck.SinkWrite{RowID: w.ID, Unit: w.Unit, Member: w.Member, Epoch: w.Epoch, At: w.WrittenAt})
	}
	if err := f.registryEvidence(ctx, &in); err != nil {
		return in, err
	}
	return in, nil
}

// registryEvidence adds the registry's history to in.
func (f *Fleet) registryEvidence(ctx context.Context, in *historycheck.Input) error {
	claims, err := f.Registry.ClaimHistory(ctx, f.Topology)
	if err != nil {
		return fmt.Errorf("read claim history: %w", err)
	}
	for _, c := range claims {
		in.Claims = append(in.Claims, historycheck.ClaimEvent{Unit: c.Unit, Owner: c.Owner, Incarnation: c.Incarnation,
			Epoch: c.Epoch, State: string(c.State), Under: c.Under, Op: c.Op, At: c.At})
	}
	leases, err := f.Registry.LeaseHistory(ctx, f.Topology)
	if err != nil {
		return fmt.Errorf("read lease history: %w", err)
	}
	for _, l := range leases {
		in.Leases = append(in.Leases, historycheck.LeaseEvent{Member: l.Member, Incarnation: l.Incarnation, At: l.At,
			ExpiresAt: l.ExpiresAt, Left: l.Left})
	}
	epochs, err := f.Registry.EpochHistory(ctx, f.Topology)
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

var _ poolctl.HistoryReader = (*poolctl.PG)(nil)
