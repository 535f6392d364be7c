package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config is how the operator and workers reach the registry.
type Config struct {
	// DSN is the PostgreSQL connection string (from the ShardTopology's
	// registry secret). It is never logged.
	DSN string
	// MaxConns caps the pool; zero keeps pgx's default.
	MaxConns int32
	// SkipMigrate leaves the schema alone (workers); the operator migrates.
	SkipMigrate bool

	// The server enforces three timeouts on every connection, so no
	// client, however stuck, holds the registry up. Zero means the default
	// named; negative leaves the server's own setting.
	//
	// StatementTimeout (default 30s) ends any statement that runs longer:
	// far above every query bound, it only catches pathological plans
	// whose caller gave up long ago but whose locks would stay.
	StatementTimeout time.Duration
	// LockTimeout (default 5s) fails a statement that waits longer for a
	// lock, with an error the caller retries, instead of queueing every
	// later claim behind a stuck lock holder.
	LockTimeout time.Duration
	// IdleInTransactionTimeout (default 10s) ends a session that sits
	// inside a transaction without sending anything. A worker SIGSTOPped or
	// cut off mid-transaction holds FOR SHARE locks on member and epoch
	// rows; without this, Activate (which updates the epoch row) and the
	// member's rejoin would wait for it forever.
	IdleInTransactionTimeout time.Duration
}

// Default session timeouts (see Config).
const (
	DefaultStatementTimeout         = 30 * time.Second
	DefaultLockTimeout              = 5 * time.Second
	DefaultIdleInTransactionTimeout = 10 * time.Second
)

// runtimeParams are the session settings Open sends with every connection.
func (cfg Config) runtimeParams() map[string]string {
	out := map[string]string{}
	for _, s := range []struct {
		name string
		d    time.Duration
		def  time.Duration
	}{
		{"statement_timeout", cfg.StatementTimeout, DefaultStatementTimeout},
		{"lock_timeout", cfg.LockTimeout, DefaultLockTimeout},
		{"idle_in_transaction_session_timeout", cfg.IdleInTransactionTimeout, DefaultIdleInTransactionTimeout},
	} {
		d := s.d
		if d == 0 {
			d = s.def
		}
		if d > 0 {
			out[s.name] = strconv.FormatInt(max(d.Milliseconds(), 1), 10)
		}
	}
	return out
}

// PG is the PostgreSQL registry.
type PG struct {
	pool  *pgxpool.Pool
	owned bool
}

var (
	_ Registry      = (*PG)(nil)
	_ HistoryReader = (*PG)(nil)
)

// Open connects with cfg, with the session timeouts on every connection,
// and, unless cfg.SkipMigrate, migrates the schema.
func Open(ctx context.Context, cfg Config) (*PG, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// pgx redacts the password from its parse errors.
		return nil, fmt.Errorf("parse registry DSN: %w", err)
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	for k, v := range cfg.runtimeParams() {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open registry pool: %w", err)
	}
	if !cfg.SkipMigrate {
		if err := Migrate(ctx, pool); err != nil {
			pool.Close()
			return nil, fmt.Errorf("migrate registry: %w", err)
		}
	}
	return &PG{pool: pool, owned: true}, nil
}

// New wraps a pool whose schema is migrated; Close leaves the pool open.
func New(pool *pgxpool.Pool) *PG { return &PG{pool: pool} }

// Pool returns the underlying pool.
func (p *PG) Pool() *pgxpool.Pool { return p.pool }

// Close closes the pool if Open created it.
func (p *PG) Close() {
	if p.owned {
		p.pool.Close()
	}
}

// ShiftClock moves the topology's registry clock forward by d. It is a
// test hook (see ClockShifter): the schema refuses it unless the session
// has shardkeeper.test_clock on, which only test databases set.
func (p *PG) ShiftClock(ctx context.Context, topology string, d time.Duration) error {
	tag, err := p.pool.Exec(ctx,
		"UPDATE shardkeeper.topologies SET clock_offset = clock_offset + $2 WHERE topology = $1", topology, d)
	if err != nil {
		return fmt.Errorf("shift clock of %s (a test hook): %w", topology, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return nil
}

// ClockShifter is a test hook both backends implement: it moves one
// topology's registry clock forward, so tests make leases lapse
// deterministically instead of sleeping.
type ClockShifter interface {
	ShiftClock(ctx context.Context, topology string, d time.Duration) error
}

// EnsureTopology implements Registry.
func (p *PG) EnsureTopology(ctx context.Context, topology string, prm Params) error {
	if err := prm.Validate(); err != nil {
		return fmt.Errorf("topology %q: %w", topology, err)
	}
	prm = prm.normalized()
	_, err := p.pool.Exec(ctx, `
		INSERT INTO shardkeeper.topologies (topology, lease_ttl, renew_interval, query_bound, grace,
			subject_prefix, consumer_name, drain_timeout)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (topology) DO UPDATE SET lease_ttl = $2, renew_interval = $3, query_bound = $4, grace = $5,
			subject_prefix = $6, consumer_name = $7, drain_timeout = $8`,
		topology, prm.LeaseTTL, prm.RenewInterval, prm.QueryBound, prm.Grace,
		prm.Worker.SubjectPrefix, prm.Worker.ConsumerName, prm.Worker.DrainTimeout)
	if err != nil {
		return fmt.Errorf("ensure topology %q: %w", topology, err)
	}
	return nil
}

// memberColCount and claimColCount are how many columns memberCols and
// claimCols select, for statements that pad with NULLs.
const (
	memberColCount = 10
	claimColCount  = 11
)

// memberCols selects a possibly absent member row from alias a, as
// memberScan expects it.
func memberCols(a string) string {
	return fmt.Sprintf(`%[1]s.member, coalesce(%[1]s.slot, -1), %[1]s.incarnation, %[1]s.lease_expires_at,
		%[1]s.left_at IS NOT NULL, %[1]s.fenced, %[1]s.fence_lifted_at, %[1]s.fence_gen, %[1]s.draining,
		%[1]s.prev_lease_expires_at`, a)
}

// memberScan holds a possibly absent member row while scanning.
type memberScan struct {
	name        *string
	slot        *int
	incarnation *int64
	expires     *time.Time
	left        *bool
	fenced      *bool
	lifted      *time.Time
	fenceGen    *int64
	draining    *bool
	prevExpires *time.Time
}

func (s *memberScan) dest() []any {
	return []any{&s.name, &s.slot, &s.incarnation, &s.expires, &s.left, &s.fenced, &s.lifted, &s.fenceGen,
		&s.draining, &s.prevExpires}
}

func (s *memberScan) row() *memberRow {
	if s.name == nil {
		return nil
	}
	m := &memberRow{Name: *s.name, Slot: *s.slot, Incarnation: *s.incarnation, LeaseExpiresAt: *s.expires,
		Left: *s.left, Fenced: *s.fenced, FenceGen: *s.fenceGen, Draining: *s.draining}
	if s.lifted != nil {
		m.FenceLiftedAt = *s.lifted
	}
	if s.prevExpires != nil {
		m.PrevLeaseExpiresAt = *s.prevExpires
	}
	return m
}

// claimCols selects a possibly absent claim row from alias a, as claimScan
// expects it.
func claimCols(a string) string {
	return fmt.Sprintf(`%[1]s.unit, coalesce(%[1]s.owner, ''), coalesce(%[1]s.owner_incarnation, 0), %[1]s.fencing_epoch,
		%[1]s.state, coalesce(%[1]s.handover_to, ''), %[1]s.checkpoint_seq, coalesce(%[1]s.adopted_from, ''),
		%[1]s.rehomed, coalesce(%[1]s.last_op, ''), coalesce(%[1]s.under_epoch, 0)`, a)
}

// claimScan holds a possibly absent claim row while scanning.
type claimScan struct {
	unit     *string
	owner    *string
	inc      *int64
	epoch    *int64
	state    *string
	handover *string
	seq      *int64
	from     *string
	rehomed  *bool
	op       *string
	under    *int64
}

func (s *claimScan) dest() []any {
	return []any{&s.unit, &s.owner, &s.inc, &s.epoch, &s.state, &s.handover, &s.seq, &s.from, &s.rehomed, &s.op, &s.under}
}

func (s *claimScan) row() *claimRow {
	if s.unit == nil {
		return nil
	}
	return &claimRow{Unit: *s.unit, Owner: *s.owner, OwnerIncarnation: *s.inc, Epoch: *s.epoch,
		State: ClaimState(*s.state), HandoverTo: *s.handover, CheckpointSeq: *s.seq,
		AdoptedFrom: *s.from, Rehomed: *s.rehomed, LastOp: claimOp(*s.op), UnderEpoch: *s.under}
}

// scanAll concatenates scan destinations.
func scanAll(first []any, rest ...[]any) []any {
	for _, r := range rest {
		first = append(first, r...)
	}
	return first
}

// topologyErr turns a missing topology (a NULL clock) into its error.
func topologyErr(topology string, now *time.Time) error {
	if now == nil {
		return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	}
	return nil
}

// IsConnectionError reports whether err came from the network or a closed
// connection rather than from the registry's rules: the outcome of the
// operation is unknown and the caller should re-read before acting.
func IsConnectionError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	return err != nil && !errors.Is(err, pgx.ErrNoRows) && !isRuleError(err)
}

func isRuleError(err error) bool {
	for _, e := range []error{ErrUnknownTopology, ErrNotMember, ErrStaleIncarnation, ErrLeaseExpired, ErrFenced,
		ErrDraining, ErrNoActiveEpoch, ErrEpochMoved, ErrFrozen, ErrUnitOutOfRange, ErrHeld, ErrStaleEpoch, ErrStillHolding,
		ErrPendingExists, ErrEpochState, ErrFreezeIncomplete, ErrConflict, ErrInvalid, ErrSchemaTooNew} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
