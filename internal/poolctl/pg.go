package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
	// They are backstops. No registry transaction waits for its client
	// between statements (each is one statement, or one pipeline the
	// server runs to the end by itself), and no registry statement locks
	// a row that Renew waits for, except Join's and Leave's own member rows
	// for the few milliseconds of their pipelines. What they bound is a
	// client cut off in the middle of sending a pipeline, and a sink's
	// guarded transaction (GuardSQL) that holds a claim row.
	//
	// The rule for the defaults: a member fences itself once its renewals
	// have failed for about TTL minus the query bound, and a single Renew
	// fails when it takes longer than the query bound (DefaultParams: 2s).
	// So whatever a Renew could wait behind must end well within the
	// query bound: the idle timeout (1s) ends a stalled session first, the
	// lock timeout (1.5s) then lets the Renew proceed rather than fail,
	// and both are far below the 10s lease. A topology whose query bound
	// is shorter than these needs shorter timeouts here.
	//
	// StatementTimeout (default 30s) ends any statement that runs longer:
	// far above every query bound, it only catches pathological plans
	// whose caller gave up long ago. It cannot stand between a member and
	// its renewal: the statements that lock member rows (Join, Leave,
	// Renew, Fence, Unfence, SetDraining) touch one topology's member rows
	// and nothing else.
	StatementTimeout time.Duration
	// LockTimeout (default 1.5s) fails a statement that waits longer for
	// a lock, with an error the caller retries, before the caller's query
	// bound expires and leaves it with an unknown outcome. It is longer
	// than IdleInTransactionTimeout, so a Renew queued behind a stalled
	// session is released by that session's end rather than failed.
	LockTimeout time.Duration
	// IdleInTransactionTimeout (default 1s) ends a session that sits
	// inside a transaction without sending anything. A registry
	// transaction never does so while healthy (see above): a session idle
	// in one is a client cut off mid-pipeline, and its locks (a member row
	// in Join or Leave) would delay that member's renewal. 1s is below
	// every default query bound, so a Renew behind it still answers in
	// time; it is also the longest a pause of the operator's process may
	// last between the statements of a migration.
	IdleInTransactionTimeout time.Duration
}

// Default session timeouts (see Config).
const (
	DefaultStatementTimeout         = 30 * time.Second
	DefaultLockTimeout              = 1500 * time.Millisecond
	DefaultIdleInTransactionTimeout = time.Second
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
	// marks are this client's highest registry sequences seen (issue 22),
	// fed by the commit trigger's notices on connections Open made.
	marks *seqMarks
	// op is the operator token this handle writes under (AsOperator),
	// nil for none.
	op *opBinding
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
	// Every commit reports the topology's new registry sequence to this
	// client (issue 22).
	marks := &seqMarks{}
	pc.ConnConfig.RuntimeParams["shardkeeper.report_seq"] = "on"
	pc.ConnConfig.OnNotice = marks.onNotice
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
	return &PG{pool: pool, owned: true, marks: marks}, nil
}

// New wraps a pool whose schema is migrated; Close leaves the pool open.
// Its client learns the registry sequence only from Renew and CheckSeq
// replies: the pool's connections were not opened with the notice hook
// that reports every commit's sequence (use Open for a worker).
func New(pool *pgxpool.Pool) *PG { return &PG{pool: pool, marks: &seqMarks{}} }

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
	_, err := p.opExec(ctx, topology, `
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
	memberColCount = 11
	claimColCount  = 11
)

// memberCols selects a possibly absent member row from alias a, as
// memberScan expects it.
func memberCols(a string) string {
	return fmt.Sprintf(`%[1]s.member, coalesce(%[1]s.slot, -1), %[1]s.incarnation, %[1]s.lease_expires_at,
		%[1]s.left_at IS NOT NULL, %[1]s.fenced, %[1]s.fence_lifted_at, %[1]s.fence_gen, %[1]s.draining,
		%[1]s.prev_lease_expires_at, %[1]s.process`, a)
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
	process     *string
}

func (s *memberScan) dest() []any {
	return []any{&s.name, &s.slot, &s.incarnation, &s.expires, &s.left, &s.fenced, &s.lifted, &s.fenceGen,
		&s.draining, &s.prevExpires, &s.process}
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
	if s.process != nil {
		m.Process = *s.process
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

// claimScan holds a possibly absent claim row while scanning. Its fields
// are values, not pointers: scanning into a pointer allocates one per
// column and row, and the operator scans every claim of a topology each
// reconcile (BenchmarkObserve).
type claimScan struct {
	unit     pgtype.Text
	owner    pgtype.Text
	inc      pgtype.Int8
	epoch    pgtype.Int8
	state    pgtype.Text
	handover pgtype.Text
	seq      pgtype.Int8
	from     pgtype.Text
	rehomed  pgtype.Bool
	op       pgtype.Text
	under    pgtype.Int8
}

func (s *claimScan) dest() []any {
	return []any{&s.unit, &s.owner, &s.inc, &s.epoch, &s.state, &s.handover, &s.seq, &s.from, &s.rehomed, &s.op, &s.under}
}

func (s *claimScan) row() *claimRow {
	if !s.unit.Valid {
		return nil
	}
	return &claimRow{Unit: s.unit.String, Owner: s.owner.String, OwnerIncarnation: s.inc.Int64, Epoch: s.epoch.Int64,
		State: ClaimState(s.state.String), HandoverTo: s.handover.String, CheckpointSeq: s.seq.Int64,
		AdoptedFrom: s.from.String, Rehomed: s.rehomed.Bool, LastOp: claimOp(s.op.String), UnderEpoch: s.under.Int64}
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
	for _, e := range []error{ErrUnknownTopology, ErrNotMember, ErrStaleIncarnation, ErrDisplaced, ErrLeaseExpired, ErrFenced,
		ErrDraining, ErrNoActiveEpoch, ErrEpochMoved, ErrFrozen, ErrUnitOutOfRange, ErrHeld, ErrStaleEpoch, ErrStillHolding,
		ErrPendingExists, ErrEpochState, ErrFreezeIncomplete, ErrConflict, ErrInvalid, ErrSchemaTooNew, ErrRegistryBehind, ErrOperatorSuperseded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// pipeline runs one transaction as one pipeline the server runs to the
// end without waiting for the client: BEGIN, the statements queue adds,
// COMMIT. read reads the results of queue's statements, in order. No
// lock it takes is held across a client round trip (issue 20, defect 3);
// on an error the transaction rolls back, and a connection whose ROLLBACK
// did not get through is destroyed by the pool.
func pipeline(ctx context.Context, pool *pgxpool.Pool, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	return pipelineTx(ctx, pool, "BEGIN", queue, read)
}

// pipelineTx is pipeline with begin as its first statement.
func pipelineTx(ctx context.Context, pool *pgxpool.Pool, begin string, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue(begin)
	queue(b)
	b.Queue("COMMIT")
	err = func() error {
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		if err := read(br); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.Close()
	}()
	if err != nil {
		rollback(ctx, conn)
	}
	return err
}
