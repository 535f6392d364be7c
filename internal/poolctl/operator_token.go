package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operator's leader token (issue 21). Operator replicas elect one
// leader with a Kubernetes Lease, but the Lease cannot stop a leader that
// was paused (a long GC, a frozen node, a partition) from resuming after
// another replica took over and writing what it decided from its old
// reading: undoing a drain request, putting back a retiring set, publishing
// a stale RESET verdict. So each leader takes a token in the registry,
// per topology, before its first write (TakeOperatorToken), and writes
// only through a registry bound to it (AsOperator). The registry refuses
// every operator write whose token is not the latest taken, with an
// *OperatorFencedError; a write carrying no token at all is refused too
// once any token was taken (an operator that predates tokens). The
// writes it covers are EnsureTopology, CreatePending, Activate, Retire,
// SetDraining, SetRetiring, PublishResetPermission, Recover and
// DrainedMember. Workers' writes carry no operator token and are never
// refused for it.
//
// A superseded leader must not take a token again: it lost its leadership
// and stops (the operator exits, and waits for the Lease when it starts
// again). Two processes that kept taking tokens would fence each other in
// turn.

// ErrOperatorSuperseded means a newer operator leader took the topology's
// operator token: the caller is no longer the leader and must not write.
var ErrOperatorSuperseded = errors.New("operator token superseded by a newer leader")

// operatorFenceSQLState is the SQLSTATE the registry raises for a stale
// operator token (migration 0008).
const operatorFenceSQLState = "SKOPF"

// OperatorToken is what an operator leader presents with its writes to
// one topology's registry rows.
type OperatorToken struct {
	Topology string
	// Epoch grows by one at every take; only the latest is valid.
	Epoch int64
	// Holder names the leader that took it (its identity).
	Holder string
	// TakenAt is when the registry granted it, on the registry's wall clock.
	TakenAt time.Time
}

// OperatorFencedError refuses an operator write whose token is not the
// topology's latest.
type OperatorFencedError struct {
	Topology string
	// Presented is the token the write carried, 0 for none.
	Presented int64
	// Current is the latest token, 0 when none was ever taken (the
	// registry lost it: a restore or a failover).
	Current int64
	// Holder is who took the current token.
	Holder string
}

// Error says which token was refused and who holds the current one.
func (e *OperatorFencedError) Error() string {
	if e.Presented == 0 {
		return fmt.Sprintf("operator write to %s carries no operator token, but leader %q holds token %d", e.Topology, e.Holder, e.Current)
	}
	if e.Lost() {
		return fmt.Sprintf("operator token %d of %s is above the registry's latest (%d): the registry lost its take "+
			"(a failover or restore) and is behind until Recover", e.Presented, e.Topology, e.Current)
	}
	return fmt.Sprintf("operator token %d of %s superseded: leader %q took token %d", e.Presented, e.Topology, e.Holder, e.Current)
}

// Lost reports whether the refused token is above the registry's latest:
// only the registry issues tokens, so it lost the commit of this take (a
// failover or restore). Its holder is the newest leader, not a superseded
// one; Recover binds the token again (migration 0010).
func (e *OperatorFencedError) Lost() bool { return e.Presented > e.Current }

// Is matches ErrRegistryBehind for a lost take (Lost) and
// ErrOperatorSuperseded otherwise.
func (e *OperatorFencedError) Is(target error) bool {
	if e.Lost() {
		return target == ErrRegistryBehind
	}
	return target == ErrOperatorSuperseded
}

// OperatorFenced finds an operator token refusal in err: an
// *OperatorFencedError, or the registry's raw refusal (a write that
// bypassed AsOperator and met the schema's triggers).
func OperatorFenced(err error) (*OperatorFencedError, bool) {
	var fe *OperatorFencedError
	if errors.As(err, &fe) {
		return fe, true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != operatorFenceSQLState {
		return nil, false
	}
	fe = &OperatorFencedError{Holder: pgErr.Hint}
	for _, kv := range strings.Fields(pgErr.Detail) {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "presented":
			fe.Presented = n
		case "current":
			fe.Current = n
		}
	}
	return fe, true
}

// OperatorRegistry is a registry an operator leader can take a token in.
// Both backends implement it.
type OperatorRegistry interface {
	// TakeOperatorToken makes holder the topology's operator leader: it
	// raises the topology's operator token by one and returns it. Every
	// token taken before is refused from then on. The topology need not
	// exist yet. A process takes it once, when it becomes leader, and
	// never again after a refusal.
	TakeOperatorToken(ctx context.Context, topology, holder string) (OperatorToken, error)
	// OperatorToken reads the topology's current token (zero Epoch when
	// none was taken).
	OperatorToken(ctx context.Context, topology string) (OperatorToken, error)
	// DrainedMember sets member's drain request (as SetDraining does) and
	// reads the member under it, in one transaction: the check a pod
	// delete is conditional on. It is an operator write.
	DrainedMember(ctx context.Context, topology, member string) (Member, error)
}

var (
	_ OperatorRegistry = (*PG)(nil)
	_ OperatorRegistry = (*Twin)(nil)
)

// takeOperatorTokenSQL raises the token. The UPDATE waits for every
// transaction that checked the old token (they hold its row FOR SHARE), so
// whatever they wrote is visible to the new leader's first read. While the
// registry may have lost commits (registry_suspect: found behind, or a new
// timeline), it raises the token by $3 more, past any take only the lost
// primary had: that take's holder, paused, must not share the number.
const takeOperatorTokenSQL = `
	INSERT INTO shardkeeper.operator_tokens AS o (topology, epoch, holder, taken_at)
	VALUES ($1, 1 + CASE WHEN shardkeeper.registry_suspect($1) THEN $3::bigint ELSE 0 END, $2, clock_timestamp())
	ON CONFLICT (topology) DO UPDATE
	   SET epoch = o.epoch + 1 + CASE WHEN shardkeeper.registry_suspect($1) THEN $3::bigint ELSE 0 END,
	       holder = excluded.holder, taken_at = excluded.taken_at
	RETURNING epoch, taken_at`

// TakeOperatorToken implements OperatorRegistry in one statement.
func (p *PG) TakeOperatorToken(ctx context.Context, topology, holder string) (OperatorToken, error) {
	if topology == "" || holder == "" {
		return OperatorToken{}, fmt.Errorf("take operator token: empty topology or holder: %w", ErrInvalid)
	}
	tok := OperatorToken{Topology: topology, Holder: holder}
	if err := p.pool.QueryRow(ctx, takeOperatorTokenSQL, topology, holder, int64(DefaultRecoverMargin)).Scan(&tok.Epoch, &tok.TakenAt); err != nil {
		return OperatorToken{}, fmt.Errorf("take operator token of %s: %w", topology, err)
	}
	return tok, nil
}

// OperatorToken implements OperatorRegistry.
func (p *PG) OperatorToken(ctx context.Context, topology string) (OperatorToken, error) {
	tok := OperatorToken{Topology: topology}
	var (
		epoch  *int64
		holder *string
		at     *time.Time
	)
	err := p.pool.QueryRow(ctx, `
		SELECT o.epoch, o.holder, o.taken_at FROM (SELECT 1) one
		  LEFT JOIN shardkeeper.operator_tokens o ON o.topology = $1`, topology).Scan(&epoch, &holder, &at)
	if err != nil {
		return OperatorToken{}, fmt.Errorf("read operator token of %s: %w", topology, err)
	}
	if epoch != nil {
		tok.Epoch, tok.Holder, tok.TakenAt = *epoch, *holder, *at
	}
	return tok, nil
}

// AsOperator returns p bound to tok: its operator writes to tok.Topology
// run in transactions the registry checks against the topology's latest
// operator token. Close on the copy leaves the pool open.
func (p *PG) AsOperator(tok OperatorToken) *PG {
	c := *p
	c.owned = false
	c.op = &opBinding{}
	c.op.tok.Store(&tok)
	return &c
}

// opBinding is the token an operator handle presents. Recover moves it
// (the recovering leader's token moves past every take a lost primary may
// have made), and every copy of the handle presents the new one.
type opBinding struct {
	tok atomic.Pointer[OperatorToken]
}

// Operator returns the token p is bound to, if any.
func (p *PG) Operator() (OperatorToken, bool) {
	if p.op == nil {
		return OperatorToken{}, false
	}
	return *p.op.tok.Load(), true
}

// operatorFenceSQL marks the transaction as the operator's and checks its
// token at once.
const operatorFenceSQL = `SELECT shardkeeper.operator_fence($1, $2)`

// operatorCheckSQL refuses a transaction without a token once an operator
// took one for the topology.
const operatorCheckSQL = `SELECT shardkeeper.operator_check($1)`

// fenceQueue queues, as the transaction's first statement, the operator
// fence for topology with p's token, or, when p carries none, the check
// that no operator took one. A token bound to another topology is
// presented all the same (and refused), never dropped.
func (p *PG) fenceQueue(b *pgx.Batch, topology string) {
	if p.op == nil {
		b.Queue(operatorCheckSQL, topology)
		return
	}
	b.Queue(operatorFenceSQL, topology, p.fenceEpoch(topology))
}

func (p *PG) fenceEpoch(topology string) int64 {
	tok := p.op.tok.Load()
	if tok.Topology != topology {
		return -1
	}
	return tok.Epoch
}

// fenceErr turns the registry's refusal into an *OperatorFencedError for
// topology; other errors pass unchanged.
func fenceErr(topology string, err error) error {
	if fe, ok := OperatorFenced(err); ok {
		fe.Topology = topology
		return fe
	}
	return err
}

// checkOperator refuses at once, on the twin, a write by op (nil: none)
// that is not the topology's latest token. Called with t.mu held.
func (t *Twin) checkOperator(topology string) error {
	cur, taken := t.ops[topology]
	switch {
	case t.op == nil && !taken:
		return nil
	case t.op == nil:
		return &OperatorFencedError{Topology: topology, Current: cur.Epoch, Holder: cur.Holder}
	case t.op.Topology != topology:
		return &OperatorFencedError{Topology: topology, Presented: -1, Current: cur.Epoch, Holder: cur.Holder}
	case !taken || cur.Epoch != t.op.Epoch:
		return &OperatorFencedError{Topology: topology, Presented: t.op.Epoch, Current: cur.Epoch, Holder: cur.Holder}
	}
	return nil
}

// TakeOperatorToken implements OperatorRegistry.
func (t *Twin) TakeOperatorToken(_ context.Context, topology, holder string) (OperatorToken, error) {
	if topology == "" || holder == "" {
		return OperatorToken{}, fmt.Errorf("take operator token: empty topology or holder: %w", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ops == nil {
		t.ops = map[string]OperatorToken{}
	}
	tok := OperatorToken{Topology: topology, Epoch: t.ops[topology].Epoch + 1, Holder: holder, TakenAt: t.wall()}
	t.ops[topology] = tok
	return tok, nil
}

// OperatorToken implements OperatorRegistry.
func (t *Twin) OperatorToken(_ context.Context, topology string) (OperatorToken, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.ops[topology]
	if !ok {
		return OperatorToken{Topology: topology}, nil
	}
	return tok, nil
}

// AsOperator returns the twin bound to tok: the same state, with every
// operator write checked against the topology's latest token, as PG's
// AsOperator is.
func (t *Twin) AsOperator(tok OperatorToken) *Twin {
	return &Twin{twinState: t.twinState, op: &tok}
}

// opExec runs one statement as an operator write: in one transaction
// behind the operator fence (p's token, or the check that none is needed).
func (p *PG) opExec(ctx context.Context, topology, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := p.opPipeline(ctx, topology, func(b *pgx.Batch) { b.Queue(sql, args...) }, func(br pgx.BatchResults) error {
		var err error
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// opQueryRow is opExec for a statement that returns one row, scanned into
// dest.
func (p *PG) opQueryRow(ctx context.Context, topology, sql string, args []any, dest ...any) error {
	return p.opPipeline(ctx, topology, func(b *pgx.Batch) { b.Queue(sql, args...) }, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(dest...)
	})
}

// opPipeline is pipeline for an operator write: the operator fence first
// (fenceQueue); a refusal comes back as an *OperatorFencedError.
func (p *PG) opPipeline(ctx context.Context, topology string, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	err := pipeline(ctx, p.pool, func(b *pgx.Batch) {
		p.fenceQueue(b, topology)
		queue(b)
	}, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return read(br)
	})
	return fenceErr(topology, err)
}

// setDrainingSQL sets member $2's drain request, writing a placeholder row
// (left, no slot, incarnation 0) for a name with no row.
const setDrainingSQL = `
	INSERT INTO shardkeeper.members (topology, member, slot, incarnation, lease_expires_at, joined_at, left_at, draining)
	SELECT $1, $2, NULL, 0, shardkeeper.clock(topology), shardkeeper.clock(topology), shardkeeper.clock(topology), true
	  FROM shardkeeper.topologies WHERE topology = $1
	ON CONFLICT (topology, member) DO UPDATE SET draining = true`

// drainedLockSQL waits for every claim batch of the member still writing:
// batches hold its row FOR KEY SHARE, which FOR UPDATE conflicts with, and
// a batch that starts later reads the drain request in its write statement
// and claims nothing (ErrDraining).
const drainedLockSQL = `SELECT 1 FROM shardkeeper.members WHERE topology = $1 AND member = $2 FOR UPDATE`

// drainedReadSQL reads the member after the lock, in a statement of its
// own so that its snapshot includes every batch that committed meanwhile.
const drainedReadSQL = `
	WITH t AS (SELECT shardkeeper.clock($1) AS now)
	SELECT m.incarnation, coalesce(m.slot, -1), m.left_at IS NOT NULL, m.left_at IS NULL AND m.lease_expires_at > t.now,
	       m.draining, (SELECT count(*) FROM shardkeeper.claims c WHERE c.topology = $1 AND c.owner = $2)
	  FROM shardkeeper.members m, t WHERE m.topology = $1 AND m.member = $2`

// DrainedMember sets member's drain request and reads, in the same
// transaction behind the operator fence, the member as it is then
// (Incarnation, Slot, Left, Live, Draining and Holds are set). What it
// holds then it cannot add to (a draining member claims nothing), so a
// pod delete decided on it is decided on the registry at that moment, by
// the leader of that moment: a superseded operator gets an
// *OperatorFencedError and deletes nothing.
func (p *PG) DrainedMember(ctx context.Context, topology, member string) (Member, error) {
	if member == "" {
		return Member{}, fmt.Errorf("drain member: empty member name: %w", ErrInvalid)
	}
	m := Member{Name: member}
	var inserted int64
	err := p.opPipeline(ctx, topology, func(b *pgx.Batch) {
		b.Queue(setDrainingSQL, topology, member)
		b.Queue(drainedLockSQL, topology, member)
		b.Queue(drainedReadSQL, topology, member)
	}, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		if inserted = tag.RowsAffected(); inserted == 0 {
			return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(&m.Incarnation, &m.Slot, &m.Left, &m.Live, &m.Draining, &m.Holds)
	})
	if err != nil {
		return Member{}, fmt.Errorf("drain %s and read what it holds: %w", member, err)
	}
	return m, nil
}

// DrainedMember implements OperatorRegistry.
func (t *Twin) DrainedMember(_ context.Context, topology, member string) (Member, error) {
	if member == "" {
		return Member{}, fmt.Errorf("drain member: empty member name: %w", ErrInvalid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return Member{}, fmt.Errorf("drain %s and read what it holds: %w", member, err)
	}
	if err := t.setDraining(topology, member, true); err != nil {
		return Member{}, fmt.Errorf("drain %s and read what it holds: %w", member, err)
	}
	snap, err := t.snapshot(topology)
	if err != nil {
		return Member{}, err
	}
	m := snap.Member(member)
	return Member{Name: member, Incarnation: m.Incarnation, Slot: m.Slot, Left: m.Left, Live: m.Live, Draining: m.Draining, Holds: m.Holds}, nil
}
