package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Every registry call of the operator carries a deadline. A worker stopped
// in the middle of a transaction holds its row locks, and a registry behind
// a partition answers nothing: without a deadline the operator's statement
// (Activate, say) waits forever, the reconcile hangs, and status keeps
// saying whatever it said before (P7). With one, the call fails with a
// *RegistryTimeoutError, the step fails, and status says the registry did
// not answer.

// DefaultRegistryTimeout bounds one registry operation of the operator.
// Each is one statement or one short transaction; 10s is far above what a
// healthy registry needs and well below what a person notices as a hang.
const DefaultRegistryTimeout = 10 * time.Second

// registryOpenTimeout bounds opening a registry pool, which also migrates
// the schema at the first connection.
const registryOpenTimeout = 30 * time.Second

// RegistryTimeoutError says the registry did not answer an operation
// within the operator's bound.
type RegistryTimeoutError struct {
	// Op is the registry operation, e.g. "Snapshot".
	Op string
	// After is the bound that passed.
	After time.Duration
	// Err is what the client returned when the deadline passed.
	Err error
}

// Error says which operation got no answer, and within what.
func (e *RegistryTimeoutError) Error() string {
	return fmt.Sprintf("the registry did not answer %s within %s (%v)", e.Op, e.After, e.Err)
}

// Unwrap returns the client's error.
func (e *RegistryTimeoutError) Unwrap() error { return e.Err }

// boundedRegistry is a Registry whose every operation runs under a
// deadline of its own.
var _ poolctl.Registry = (*boundedRegistry)(nil)

type boundedRegistry struct {
	inner   poolctl.Registry
	timeout time.Duration
}

// boundRegistry wraps reg so every call has a deadline of timeout.
func boundRegistry(reg poolctl.Registry, timeout time.Duration) poolctl.Registry {
	if b, ok := reg.(*boundedRegistry); ok {
		reg = b.inner
	}
	return &boundedRegistry{inner: reg, timeout: timeout}
}

// bounded runs one operation under the deadline and turns the deadline's
// passing into a *RegistryTimeoutError. A caller's own cancellation stays
// what it is.
func bounded[T any](ctx context.Context, b *boundedRegistry, op string, f func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	v, err := f(cctx)
	if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return v, &RegistryTimeoutError{Op: op, After: b.timeout, Err: err}
	}
	return v, err
}

func boundedErr(ctx context.Context, b *boundedRegistry, op string, f func(context.Context) error) error {
	_, err := bounded(ctx, b, op, func(c context.Context) (struct{}, error) { return struct{}{}, f(c) })
	return err
}

func (b *boundedRegistry) EnsureTopology(ctx context.Context, topology string, p poolctl.Params) error {
	return boundedErr(ctx, b, "EnsureTopology", func(c context.Context) error { return b.inner.EnsureTopology(c, topology, p) })
}

func (b *boundedRegistry) Join(ctx context.Context, topology, member string) (poolctl.Lease, error) {
	return bounded(ctx, b, "Join", func(c context.Context) (poolctl.Lease, error) { return b.inner.Join(c, topology, member) })
}

func (b *boundedRegistry) Renew(ctx context.Context, m poolctl.MemberRef) (poolctl.Lease, error) {
	return bounded(ctx, b, "Renew", func(c context.Context) (poolctl.Lease, error) { return b.inner.Renew(c, m) })
}

func (b *boundedRegistry) Leave(ctx context.Context, m poolctl.MemberRef) error {
	return boundedErr(ctx, b, "Leave", func(c context.Context) error { return b.inner.Leave(c, m) })
}

func (b *boundedRegistry) Fence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	return boundedErr(ctx, b, "Fence", func(c context.Context) error { return b.inner.Fence(c, m, gen) })
}

func (b *boundedRegistry) Unfence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	return boundedErr(ctx, b, "Unfence", func(c context.Context) error { return b.inner.Unfence(c, m, gen) })
}

func (b *boundedRegistry) Claim(ctx context.Context, m poolctl.MemberRef, under int64, unit string) (poolctl.Claim, error) {
	return bounded(ctx, b, "Claim", func(c context.Context) (poolctl.Claim, error) { return b.inner.Claim(c, m, under, unit) })
}

func (b *boundedRegistry) ClaimMany(ctx context.Context, m poolctl.MemberRef, under int64, units []string) ([]poolctl.ClaimOutcome, error) {
	return bounded(ctx, b, "ClaimMany", func(c context.Context) ([]poolctl.ClaimOutcome, error) { return b.inner.ClaimMany(c, m, under, units) })
}

func (b *boundedRegistry) Handover(ctx context.Context, t poolctl.Token, to string) error {
	return boundedErr(ctx, b, "Handover", func(c context.Context) error { return b.inner.Handover(c, t, to) })
}

func (b *boundedRegistry) Release(ctx context.Context, t poolctl.Token) error {
	return boundedErr(ctx, b, "Release", func(c context.Context) error { return b.inner.Release(c, t) })
}

func (b *boundedRegistry) ReleaseMany(ctx context.Context, tokens []poolctl.Token) ([]error, error) {
	return bounded(ctx, b, "ReleaseMany", func(c context.Context) ([]error, error) { return b.inner.ReleaseMany(c, tokens) })
}

func (b *boundedRegistry) ConfirmOwned(ctx context.Context, m poolctl.MemberRef, expected map[string]int64) (poolctl.Confirmation, error) {
	return bounded(ctx, b, "ConfirmOwned", func(c context.Context) (poolctl.Confirmation, error) { return b.inner.ConfirmOwned(c, m, expected) })
}

func (b *boundedRegistry) Checkpoint(ctx context.Context, t poolctl.Token, seq int64) error {
	return boundedErr(ctx, b, "Checkpoint", func(c context.Context) error { return b.inner.Checkpoint(c, t, seq) })
}

func (b *boundedRegistry) CheckToken(ctx context.Context, t poolctl.Token) error {
	return boundedErr(ctx, b, "CheckToken", func(c context.Context) error { return b.inner.CheckToken(c, t) })
}

func (b *boundedRegistry) CreatePending(ctx context.Context, topology string, partitions, shards int) (int64, error) {
	return bounded(ctx, b, "CreatePending", func(c context.Context) (int64, error) { return b.inner.CreatePending(c, topology, partitions, shards) })
}

func (b *boundedRegistry) AckFreeze(ctx context.Context, m poolctl.MemberRef, epoch int64) error {
	return boundedErr(ctx, b, "AckFreeze", func(c context.Context) error { return b.inner.AckFreeze(c, m, epoch) })
}

func (b *boundedRegistry) Activate(ctx context.Context, topology string, epoch int64) error {
	return boundedErr(ctx, b, "Activate", func(c context.Context) error { return b.inner.Activate(c, topology, epoch) })
}

func (b *boundedRegistry) SetDraining(ctx context.Context, topology, member string, draining bool) error {
	return boundedErr(ctx, b, "SetDraining", func(c context.Context) error { return b.inner.SetDraining(c, topology, member, draining) })
}

func (b *boundedRegistry) SetRetiring(ctx context.Context, topology string, units []string) error {
	return boundedErr(ctx, b, "SetRetiring", func(c context.Context) error { return b.inner.SetRetiring(c, topology, units) })
}

func (b *boundedRegistry) ReportActivity(ctx context.Context, m poolctl.MemberRef, units []poolctl.UnitActivity) error {
	return boundedErr(ctx, b, "ReportActivity", func(c context.Context) error { return b.inner.ReportActivity(c, m, units) })
}

func (b *boundedRegistry) Activity(ctx context.Context, topology string) ([]poolctl.ActivityReport, error) {
	return bounded(ctx, b, "Activity", func(c context.Context) ([]poolctl.ActivityReport, error) { return b.inner.Activity(c, topology) })
}

func (b *boundedRegistry) Retire(ctx context.Context, topology string, epoch int64) error {
	return boundedErr(ctx, b, "Retire", func(c context.Context) error { return b.inner.Retire(c, topology, epoch) })
}

func (b *boundedRegistry) PublishResetPermission(ctx context.Context, topology string, p poolctl.ResetPermission) error {
	return boundedErr(ctx, b, "PublishResetPermission", func(c context.Context) error { return b.inner.PublishResetPermission(c, topology, p) })
}

func (b *boundedRegistry) Snapshot(ctx context.Context, topology string) (poolctl.Snapshot, error) {
	return bounded(ctx, b, "Snapshot", func(c context.Context) (poolctl.Snapshot, error) { return b.inner.Snapshot(c, topology) })
}

func (b *boundedRegistry) Observe(ctx context.Context, topology string) (poolctl.Observation, error) {
	return bounded(ctx, b, "Observe", func(c context.Context) (poolctl.Observation, error) { return b.inner.Observe(c, topology) })
}

func (b *boundedRegistry) Rejoin(ctx context.Context, m poolctl.MemberRef, process string) (poolctl.Lease, error) {
	return bounded(ctx, b, "Rejoin", func(c context.Context) (poolctl.Lease, error) { return b.inner.Rejoin(c, m, process) })
}

func (b *boundedRegistry) Claims(ctx context.Context, topology string) ([]poolctl.ClaimInfo, error) {
	return bounded(ctx, b, "Claims", func(c context.Context) ([]poolctl.ClaimInfo, error) { return b.inner.Claims(c, topology) })
}

// openRegistry opens (or reuses) the topology's registry pool under
// registryOpenTimeout and returns it with every operation bounded.
func (r *ShardTopologyReconciler) openRegistry(ctx context.Context, s *scope, dsn string) (poolctl.Registry, error) {
	octx, cancel := context.WithTimeout(ctx, registryOpenTimeout)
	defer cancel()
	pg, err := r.conns().Registry(octx, s.key, s.registryKey(), dsn)
	if err != nil {
		if ctx.Err() == nil && errors.Is(octx.Err(), context.DeadlineExceeded) {
			return nil, &RegistryTimeoutError{Op: "Open", After: registryOpenTimeout, Err: err}
		}
		return nil, err
	}
	return boundRegistry(pg, r.registryTimeout()), nil
}

// errNoHistory means the registry keeps no history to prune.
var errNoHistory = errors.New("the registry keeps no history")

// historyPruner is the part of poolctl.HistoryReader the operator uses.
type historyPruner interface {
	PruneHistory(ctx context.Context, topology string, before time.Time) error
}

var _ historyPruner = poolctl.HistoryReader(nil)

// PruneHistory prunes the inner registry's history, when it keeps one
// (poolctl.HistoryReader).
func (b *boundedRegistry) PruneHistory(ctx context.Context, topology string, before time.Time) error {
	h, ok := b.inner.(historyPruner)
	if !ok {
		return errNoHistory
	}
	return boundedErr(ctx, b, "PruneHistory", func(c context.Context) error { return h.PruneHistory(c, topology, before) })
}

// epochHistorian is the part of poolctl.HistoryReader that lists every
// epoch the registry wrote.
type epochHistorian interface {
	EpochHistory(ctx context.Context, topology string) ([]poolctl.EpochSpan, error)
}

// EpochHistory lists the inner registry's epochs, when it keeps them
// (poolctl.HistoryReader).
func (b *boundedRegistry) EpochHistory(ctx context.Context, topology string) ([]poolctl.EpochSpan, error) {
	h, ok := b.inner.(epochHistorian)
	if !ok {
		return nil, errNoHistory
	}
	return bounded(ctx, b, "EpochHistory", func(c context.Context) ([]poolctl.EpochSpan, error) { return h.EpochHistory(c, topology) })
}

// nextEpochNumber is the number CreatePending gives the next epoch: one
// above every epoch the registry ever wrote (an abandoned pending one
// included). 0 when the registry lists no epochs to the operator.
func nextEpochNumber(ctx context.Context, reg poolctl.Registry, topology string) (int64, error) {
	h, ok := reg.(epochHistorian)
	if !ok {
		return 0, nil
	}
	spans, err := h.EpochHistory(ctx, topology)
	if errors.Is(err, errNoHistory) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var top int64
	for _, e := range spans {
		top = max(top, e.Number)
	}
	return top + 1, nil
}
