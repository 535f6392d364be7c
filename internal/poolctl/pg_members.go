package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Renew implements Registry in one statement: the update applies only to a
// live lease of this incarnation, on a registry whose sequence is not
// behind this client's mark (SeenSeq); the member row read alongside
// explains a refusal. Every renewal carries the mark, so a registry that
// lost a commit this client saw is found out within one renew interval,
// and the commit trigger refuses a renewal on a changed timeline at once.
func (p *PG) Renew(ctx context.Context, m MemberRef) (Lease, error) {
	// A renewal whose statement snapshot predates a commit this client has
	// already been told the sequence of (its notice comes while the commit
	// completes) renews nothing and is refused as a conflict, though
	// nothing is wrong: the registry_seq row's lock makes the same
	// statement see the commit when it checks whether the registry is
	// behind. A fresh statement sees it too, so ask again, a few times.
	for attempt := 1; ; attempt++ {
		l, err := p.renewOnce(ctx, m)
		if !errors.Is(err, ErrConflict) || attempt == renewAttempts || ctx.Err() != nil {
			return l, err
		}
	}
}

// renewAttempts bounds Renew's retries of a conflict.
const renewAttempts = 3

func (p *PG) renewOnce(ctx context.Context, m MemberRef) (Lease, error) {
	var (
		now     *time.Time
		prm     nullParams
		expires *time.Time
		slot    *int
		cur     memberScan

		seq, tl, behindSeen int64
		curTL               *int64
		sysChanged          bool
		reason              *string
		seen                = p.marks.get(m.Topology)
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock(topology) AS now, `+paramsCols+` FROM shardkeeper.topologies WHERE topology = $1),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		s AS (SELECT * FROM shardkeeper.registry_seq WHERE topology = $1),
		mark AS (SELECT shardkeeper.report_seen($1, $4) AS behind_reason),
		upd AS (
			UPDATE shardkeeper.members m SET lease_expires_at = t.now + t.lease_ttl FROM t
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3
			   AND m.left_at IS NULL AND m.lease_expires_at > t.now
			   AND coalesce((SELECT seq FROM s), 0) >= $4
			RETURNING m.lease_expires_at, coalesce(m.slot, -1) AS slot)
		SELECT t.now, `+paramsColsOf("t")+`, upd.lease_expires_at, upd.slot, `+memberCols("cur")+`,
		       coalesce(s.seq, 0), coalesce(s.timeline, 0), shardkeeper.current_timeline(), `+systemChangedOf("s")+`,
		       coalesce((SELECT behind_reason FROM mark), s.behind_reason), greatest(s.behind_seen, $4)
		  FROM (SELECT 1) one LEFT JOIN t ON true LEFT JOIN cur ON true LEFT JOIN upd ON true LEFT JOIN s ON true`,
		m.Topology, m.Member, m.Incarnation, seen).Scan(scanAll([]any{&now}, prm.dest(), []any{&expires, &slot}, cur.dest(),
		[]any{&seq, &tl, &curTL, &sysChanged, &reason, &behindSeen})...)
	if err != nil {
		if be, ok := RegistryBehind(err); ok {
			be.Topology = m.Topology
			err = be
		}
		return Lease{}, fmt.Errorf("renew %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return Lease{}, err
	}
	// A registry behind this client's mark changed nothing but its behind
	// state (committed, so every other client is refused too).
	if err := behindErr(m.Topology, seq, tl, curTL, sysChanged, reason, behindSeen); err != nil {
		return Lease{}, fmt.Errorf("renew %s: %w", m.Member, err)
	}
	if expires == nil {
		return Lease{}, fmt.Errorf("renew: %w", refusal(checkMember(m, cur.row(), *now)))
	}
	p.marks.note(m.Topology, seq)
	params := prm.params()
	return Lease{MemberRef: m, Slot: *slot, TTL: params.LeaseTTL, ExpiresAt: *expires, Params: params}, nil
}

// paramsCols are a topology row's parameters (lease and worker
// settings), as paramsDest and nullParams scan them.
const paramsCols = "lease_ttl, renew_interval, query_bound, grace, subject_prefix, consumer_name, drain_timeout"

// paramsColsOf is paramsCols qualified by alias a.
func paramsColsOf(a string) string {
	cols := strings.Split(paramsCols, ", ")
	for i, c := range cols {
		cols[i] = a + "." + c
	}
	return strings.Join(cols, ", ")
}

func paramsDest(p *Params) []any {
	return []any{&p.LeaseTTL, &p.RenewInterval, &p.QueryBound, &p.Grace,
		&p.Worker.SubjectPrefix, &p.Worker.ConsumerName, &p.Worker.DrainTimeout}
}

// nullParams scans possibly absent parameters.
type nullParams struct {
	ttl, renew, query, grace, drain *time.Duration
	prefix, consumer                *string
}

func (n *nullParams) dest() []any {
	return []any{&n.ttl, &n.renew, &n.query, &n.grace, &n.prefix, &n.consumer, &n.drain}
}

func (n *nullParams) params() Params {
	return Params{LeaseTTL: *n.ttl, RenewInterval: *n.renew, QueryBound: *n.query, Grace: *n.grace,
		Worker: WorkerSettings{SubjectPrefix: *n.prefix, ConsumerName: *n.consumer, DrainTimeout: *n.drain}}
}

// nullTime is NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// refusal is the error for a conditional write that matched nothing: the
// rule that refused it, or ErrConflict when the row changed between the
// statement's snapshot and its write.
func refusal(ruleErr error) error {
	if ruleErr != nil {
		return ruleErr
	}
	return ErrConflict
}

// leaveSQL ends the membership where the incarnation is current and
// holds nothing, and reads what explains a refusal.
var leaveSQL = `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		h AS (SELECT count(*)::int AS n FROM shardkeeper.claims WHERE topology = $1 AND owner = $2 AND state <> 'free'),
		upd AS (
			UPDATE shardkeeper.members m SET left_at = t.now, lease_expires_at = least(m.lease_expires_at, t.now)
			  FROM t, h
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3 AND m.left_at IS NULL AND h.n = 0
			RETURNING 1 AS done)
		SELECT t.now, h.n, upd.done, ` + memberCols("cur") + `
		  FROM t CROSS JOIN h LEFT JOIN cur ON true LEFT JOIN upd ON true`

// Leave implements Registry in one pipeline: it locks the member row FOR
// UPDATE first, which waits for any claim batch of the member to commit
// (batches hold it FOR KEY SHARE), so the count of held claims that
// leaveSQL reads in its own, later snapshot includes every claim that
// committed; a batch that comes after sees the member gone. Without it,
// a Leave and a claim could each miss the other and leave a departed
// member holding a unit.
func (p *PG) Leave(ctx context.Context, m MemberRef) error {
	var (
		now   *time.Time
		holds int
		done  *int
		cur   memberScan
	)
	err := pipeline(ctx, p.pool, func(b *pgx.Batch) {
		b.Queue(`SELECT 1 FROM shardkeeper.members WHERE topology = $1 AND member = $2 FOR UPDATE`, m.Topology, m.Member)
		b.Queue(leaveSQL, m.Topology, m.Member, m.Incarnation)
	}, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(scanAll([]any{&now, &holds, &done}, cur.dest())...)
	})
	if err != nil {
		return fmt.Errorf("leave %s: %w", m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if done != nil {
		return nil
	}
	if err := checkIncarnation(m, cur.row()); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if holds > 0 {
		return &HoldingError{Member: m.Member, Units: holds}
	}
	return fmt.Errorf("leave %s: %w", m.Member, ErrConflict)
}

// Fence implements Registry in one statement. The generation condition is
// fenceApplies's; a Fence it leaves out is a no-op, not an error.
func (p *PG) Fence(ctx context.Context, m MemberRef, gen int64) error {
	return p.setFence(ctx, m, gen, "fence", `fenced = true, fence_gen = $4`, `$4 > m.fence_gen`, fenceApplies)
}

// Unfence implements Registry in one statement, under unfenceApplies's
// condition. Lifting a fence that is not set does not move the lift, so a
// repeated Unfence does not extend the grace.
func (p *PG) Unfence(ctx context.Context, m MemberRef, gen int64) error {
	return p.setFence(ctx, m, gen, "unfence",
		`fenced = false, fence_gen = $4, fence_lifted_at = CASE WHEN m.fenced THEN t.now ELSE m.fence_lifted_at END`,
		`$4 >= m.fence_gen`, unfenceApplies)
}

// setFence updates this incarnation's fence with set (a constant) where
// cond (the SQL of applies) holds.
func (p *PG) setFence(ctx context.Context, m MemberRef, gen int64, op, set, cond string, applies func(*memberRow, int64) bool) error {
	var (
		now  *time.Time
		done *int
		cur  memberScan
	)
	err := p.pool.QueryRow(ctx, `
		WITH t AS (SELECT shardkeeper.clock($1) AS now),
		cur AS (SELECT * FROM shardkeeper.members WHERE topology = $1 AND member = $2),
		upd AS (
			UPDATE shardkeeper.members m SET `+set+` FROM t
			 WHERE m.topology = $1 AND m.member = $2 AND m.incarnation = $3 AND m.left_at IS NULL AND `+cond+`
			RETURNING 1 AS done)
		SELECT t.now, upd.done, `+memberCols("cur")+` FROM t LEFT JOIN cur ON true LEFT JOIN upd ON true`,
		m.Topology, m.Member, m.Incarnation, gen).Scan(scanAll([]any{&now, &done}, cur.dest())...)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, m.Member, err)
	}
	if err := topologyErr(m.Topology, now); err != nil {
		return err
	}
	if done != nil {
		return nil
	}
	row := cur.row()
	if err := checkIncarnation(m, row); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !applies(row, gen) {
		return nil // an older generation: nothing to do
	}
	return fmt.Errorf("%s %s: %w", op, m.Member, ErrConflict)
}

// SetDraining implements Registry. A drain request for a member with no
// row writes a placeholder row (left, no slot, incarnation 0) that carries
// it, so a process joining under that name later claims nothing.
func (p *PG) SetDraining(ctx context.Context, topology, member string, draining bool) error {
	if member == "" {
		return fmt.Errorf("set draining: empty member name: %w", ErrInvalid)
	}
	if draining {
		tag, err := p.opExec(ctx, topology, setDrainingSQL, topology, member)
		if err != nil {
			return fmt.Errorf("set draining of %s: %w", member, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("set draining of %s: topology %q: %w", member, topology, ErrUnknownTopology)
		}
		return nil
	}
	tag, err := p.opExec(ctx, topology, `UPDATE shardkeeper.members SET draining = $3 WHERE topology = $1 AND member = $2`,
		topology, member, draining)
	if err != nil {
		return fmt.Errorf("set draining of %s: %w", member, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("set draining of %s in %s: %w", member, topology, ErrNotMember)
	}
	return nil
}
