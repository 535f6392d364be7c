package poolctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrRegistryBehind means the registry has lost commits a client saw: it
// was failed over to a standby that had not received them, or restored
// from a backup (issue 22). Nothing it answers may be acted on until
// Recover has moved its counters past what every client saw.
var ErrRegistryBehind = errors.New("registry is behind what a client has seen (failover or restore); recovery needed")

// behindSQLState is the SQLSTATE the registry's commit trigger raises
// while it is behind (migration 0006).
const behindSQLState = "SKBHD"

// RegistryBehindError refuses a request because the registry went back in
// time. Seq is the registry's sequence, Seen the highest a client
// reported; Timeline and WasTimeline are set when the server's WAL
// timeline changed since the last write (a promotion or a restore).
type RegistryBehindError struct {
	Topology              string
	Seq, Seen             int64
	Timeline, WasTimeline int64
	Reason                string
}

// Error implements error.
func (e *RegistryBehindError) Error() string {
	s := fmt.Sprintf("registry of %s is behind: %s (registry seq %d, a client has seen %d", e.Topology, e.Reason, e.Seq, e.Seen)
	if e.Timeline != e.WasTimeline {
		s += fmt.Sprintf(", timeline %d was %d", e.Timeline, e.WasTimeline)
	}
	return s + ")"
}

// Is matches ErrRegistryBehind.
func (e *RegistryBehindError) Is(target error) bool { return target == ErrRegistryBehind }

// RegistryBehind finds a refusal for a registry that went back in time in
// err: a *RegistryBehindError, or the commit trigger's error, which any
// write may return. Callers treat it as the loss of their lease (a worker
// fences) and ask for Recover.
func RegistryBehind(err error) (*RegistryBehindError, bool) {
	var be *RegistryBehindError
	if errors.As(err, &be) {
		return be, true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != behindSQLState {
		return nil, false
	}
	be = &RegistryBehindError{Reason: pgErr.Message}
	for _, kv := range strings.Fields(pgErr.Detail) {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "seq":
			be.Seq = n
		case "seen":
			be.Seen = n
		case "timeline":
			be.Timeline = n
		case "was":
			be.WasTimeline = n
		}
	}
	return be, true
}

// seqMarks is a client's highest registry sequence seen, per topology: the
// ZooKeeper zxid of this client. It only grows.
type seqMarks struct {
	mu sync.Mutex
	m  map[string]int64
}

func (s *seqMarks) note(topology string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]int64{}
	}
	if seq > s.m[topology] {
		s.m[topology] = seq
	}
}

func (s *seqMarks) get(topology string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[topology]
}

// onNotice adopts the sequence the commit trigger reports. The trigger
// runs at commit, after every statement of the transaction, so a sequence
// seen here is one the server was committing; a commit that then fails
// (rare: the commit record itself) makes this client think the registry
// one write further on than it is, which is refused as behind and
// recovered like a real loss — safe, never silent.
func (s *seqMarks) onNotice(_ *pgconn.PgConn, n *pgconn.Notice) {
	if n.Message != "shardkeeper registry seq" {
		return
	}
	seq, err := strconv.ParseInt(n.Hint, 10, 64)
	if err != nil {
		return
	}
	s.note(n.Detail, seq)
}

// SeenSeq is the highest registry sequence of topology this client has
// seen: every committed write raises it, and this client sends it with
// every renewal.
func (p *PG) SeenSeq(topology string) int64 { return p.marks.get(topology) }

// NoteSeq raises the client's mark for topology to seq, for a client that
// carries its marks across registry handles.
func (p *PG) NoteSeq(topology string, seq int64) { p.marks.note(topology, seq) }

// checkSeqSQL compares the client's mark ($2) with the registry's sequence
// and records a refusal, so that every other client is refused too (until
// Recover) even once new writes have raised the sequence past the mark.
// It returns the sequence and the behind state after the statement.
var checkSeqSQL = `
	WITH s AS (SELECT * FROM shardkeeper.registry_seq WHERE topology = $1),
	mark AS (SELECT shardkeeper.report_seen($1, $2) AS behind_reason)
	SELECT coalesce(s.seq, 0), coalesce(s.timeline, 0), shardkeeper.current_timeline(), ` + systemChangedOf("s") + `,
	       coalesce((SELECT behind_reason FROM mark), s.behind_reason), greatest(s.behind_seen, $2),
	       coalesce(o.epoch, 0), coalesce(o.holder, '')
	  FROM (SELECT 1) one LEFT JOIN s ON true LEFT JOIN shardkeeper.operator_tokens o ON o.topology = $1`

// systemChangedOf is true when the server's system identifier differs
// from the one the last write of registry_seq row a recorded (where both
// are known: migration 0013).
func systemChangedOf(a string) string {
	return "coalesce(" + a + ".system_id <> shardkeeper.current_system_id(), false)"
}

// readSeqCols are what a read of a topology is checked against (readSeq),
// from registry_seq row a: its sequence, timeline and behind reason, the
// server's current timeline and whether its system identifier changed.
func readSeqCols(a string) string {
	return "coalesce(" + a + ".seq, 0), coalesce(" + a + ".timeline, 0), shardkeeper.current_timeline(), " +
		systemChangedOf(a) + ", " + a + ".behind_reason"
}

// readSeqSQL reads readSeqCols of topology $1 on their own.
var readSeqSQL = `SELECT ` + readSeqCols("s") + `
	FROM (SELECT 1) one LEFT JOIN shardkeeper.registry_seq s ON s.topology = $1`

// readSeq is readSeqCols as a read scanned them.
type readSeq struct {
	seq, timeline int64
	current       *int64
	systemChanged bool
	reason        *string
}

func (r *readSeq) dest() []any {
	return []any{&r.seq, &r.timeline, &r.current, &r.systemChanged, &r.reason}
}

// checkRead refuses (a *RegistryBehindError) what a read of topology
// answered when the registry went back in time: it was found behind
// before, its timeline or system identifier changed since the last write,
// or its sequence is below this client's mark. Writes are refused by the
// commit trigger; a read a member acts on (its snapshot, the confirmation
// of an unknown outcome) must be too: chaos 14a saw a worker read the
// promoted standby, which had lost releases the dead primary had
// answered, take the units back and deliver again under the released
// token.
//
// A sequence below the mark is not proof: a commit whose sequence notice
// this client already has may not be visible to the read yet. report_seen
// waits for that commit's lock on the row and records the loss only if
// the registry is still behind (as Renew does), so a false alarm costs one
// round trip and fences nobody.
//
// q is the pool, or the connection a caller holds (a pool of one
// connection would wait for itself).
func (p *PG) checkRead(ctx context.Context, q queryRower, topology string, r readSeq) error {
	mark := p.marks.get(topology)
	reason := r.reason
	if reason == nil && r.seq < mark {
		if err := q.QueryRow(ctx, `SELECT shardkeeper.report_seen($1, $2)`, topology, mark).Scan(&reason); err != nil {
			return fmt.Errorf("check the registry sequence of %s against %d: %w", topology, mark, err)
		}
	}
	if err := behindErr(topology, r.seq, r.timeline, r.current, r.systemChanged, reason, max(mark, r.seq)); err != nil {
		return err
	}
	p.marks.note(topology, r.seq)
	return nil
}

// checkReadNow reads what checkRead needs through q and checks it, for an
// answer taken from the registry without a write (a repeated claim).
func (p *PG) checkReadNow(ctx context.Context, q queryRower, topology string) error {
	var rs readSeq
	if err := q.QueryRow(ctx, readSeqSQL, topology).Scan(rs.dest()...); err != nil {
		return fmt.Errorf("read the registry sequence of %s: %w", topology, err)
	}
	return p.checkRead(ctx, q, topology, rs)
}

// queryRower is a pool or a connection.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckSeq reads the registry's sequence of topology and refuses (a
// *RegistryBehindError) when it is behind this client's mark, when its
// timeline or system identifier changed since the last write, when it was found behind before,
// or, for a handle bound to an operator token, when the registry's latest
// token is below it (the registry lost the take). The operator calls it
// every reconcile; workers have the same check in every Renew.
//
// A handle whose Recover failed with an unknown outcome (a timeout after
// the commit) learns here whether it committed: a later token the registry
// shows with this handle's holder (an identity no other process uses) is
// the one that Recover took, and the handle presents it from then on.
func (p *PG) CheckSeq(ctx context.Context, topology string) (int64, error) {
	var (
		seq, tl, seen, opEpoch int64
		cur                    *int64
		sysChanged             bool
		reason                 *string
		opHolder               string
	)
	if err := p.pool.QueryRow(ctx, checkSeqSQL, topology, p.marks.get(topology)).Scan(&seq, &tl, &cur, &sysChanged, &reason, &seen, &opEpoch, &opHolder); err != nil {
		return 0, fmt.Errorf("check registry sequence of %s: %w", topology, err)
	}
	if p.op != nil {
		p.confirmRecoveredToken(topology, opEpoch, opHolder)
		if reason == nil && p.fenceEpoch(topology) > opEpoch {
			lost := "the registry lost this operator's token take"
			reason = &lost
		}
	}
	if err := behindErr(topology, seq, tl, cur, sysChanged, reason, seen); err != nil {
		return seq, err
	}
	p.marks.note(topology, seq)
	return seq, nil
}

// behindErr is the refusal a sequence read calls for: a recorded behind
// reason, else a changed timeline, else a changed system identifier; nil
// when none holds.
func behindErr(topology string, seq, tl int64, cur *int64, sysChanged bool, reason *string, seen int64) error {
	be := &RegistryBehindError{Topology: topology, Seq: seq, Seen: seen, Timeline: tl, WasTimeline: tl}
	if cur != nil {
		be.Timeline = *cur
	}
	switch {
	case reason != nil:
		be.Reason = *reason
	case tl != 0 && cur != nil && *cur != tl:
		be.Reason = "registry timeline changed"
	case sysChanged:
		be.Reason = "registry system identifier changed"
	default:
		return nil
	}
	return be
}

// RecoverFloor is what the clients of a topology report having seen: the
// highest registry sequence, fencing token and topology epoch. Recover
// moves the registry's counters past them.
type RecoverFloor struct {
	Seq, Token, Epoch int64
}

// Recovered is what Recover set: every counter now starts above these.
type Recovered struct {
	Seq, TokenFloor, EpochFloor, IncarnationFloor int64
	// Lost is how many write transactions the registry may have lost, as
	// far as any client reported: the highest sequence seen minus the
	// registry's.
	Lost int64
	// OperatorToken is the token a handle bound to one now presents:
	// Recover moved it past every take the lost primary may have made
	// (zero for a handle without one).
	OperatorToken OperatorToken
}

// lostOf is lostSQL as a subquery over $1 (topology) and $4 (the caller's
// seen sequence).
var lostOf = strings.NewReplacer("$2::bigint", "$4::bigint").Replace(lostSQL)

// DefaultRecoverMargin is added to every counter on Recover, beyond the
// bound the clients' reports give: it covers commits of the lost primary
// that no client reported (their clients died before renewing), each of
// which raised a counter by at most one. A replication lag of more than
// this many write transactions of one topology that no surviving client
// saw is not covered.
const DefaultRecoverMargin = 1000

// recoverSQL is Recover's statements, after the topology row's lock.
var recoverSQL = []string{
	// The claim rows: every token moves to one floor above every token
	// any client saw; units of every known epoch shape that have no row
	// get a free row at the floor, so their first claim is above it too.
	// The history records both as op "recover": a move that gives the
	// unit to nobody (migration 0014).
	// $4 is the number of transactions the registry may have lost.
	`WITH f AS (SELECT greatest(coalesce((SELECT max(fencing_epoch) FROM shardkeeper.claims WHERE topology = $1), 0) + $4::bigint,
	                            $2::bigint) + $3::bigint AS floor),
	 t AS (SELECT shardkeeper.clock($1) AS now),
	 up AS (UPDATE shardkeeper.claims c SET fencing_epoch = f.floor, last_op = '` + string(lastRecover) + `', updated_at = t.now FROM f, t WHERE c.topology = $1 RETURNING 1),
	 ins AS (
		INSERT INTO shardkeeper.claims (topology, unit, fencing_epoch, state, last_op, updated_at)
		SELECT DISTINCT $1, p || '.' || s, f.floor, 'free', '` + string(lastRecover) + `', t.now
		  FROM shardkeeper.epochs e, f, t, generate_series(0, e.partitions - 1) p, generate_series(0, e.shards - 1) s
		 WHERE e.topology = $1
		ON CONFLICT (topology, unit) DO NOTHING RETURNING 1)
	 SELECT f.floor, (SELECT count(*) FROM up), (SELECT count(*) FROM ins) FROM f`,
	// Every lease ends now, so every member rejoins under a new
	// incarnation above any a lost Join granted; a pending epoch is
	// abandoned (the operator creates it again, under a new number).
	// A lost renewal may have granted a lease this registry never saw, up
	// to the lost primary's death plus the TTL, and the primary died
	// before now: until now + TTL the member may still believe it holds
	// (a paused one has not been refused yet). That horizon is kept as
	// the earlier incarnations' expiry, which a re-home (rehomeAt) and an
	// adoption (decideAdoption) wait for, plus the grace (P5; chaos 14c
	// re-homed inside the grace of a lease only the lost primary had).
	`WITH t AS (SELECT shardkeeper.clock($1) AS now, lease_ttl FROM shardkeeper.topologies WHERE topology = $1)
	 UPDATE shardkeeper.members m SET lease_expires_at = least(m.lease_expires_at, t.now),
	        prev_lease_expires_at = greatest(m.prev_lease_expires_at, m.lease_expires_at, t.now + t.lease_ttl)
	   FROM t WHERE m.topology = $1`,
	`UPDATE shardkeeper.epochs SET state = 'retired', retired_at = shardkeeper.clock($1) WHERE topology = $1 AND state = 'pending'`,
	// recovered_until is the same horizon for the rows Recover moved: a
	// row the standby shows free may be one the lost primary gave away
	// (claim rules, waitRecovered).
	`UPDATE shardkeeper.topologies SET next_incarnation = next_incarnation + $4::bigint + $2::bigint,
	        recovered_until = shardkeeper.clock($1) + lease_ttl,
	        token_floor = greatest(coalesce((SELECT max(fencing_epoch) FROM shardkeeper.claims WHERE topology = $1), 0),
	                               $4::bigint + $2::bigint),
	        epoch_floor = greatest(greatest(epoch_floor, coalesce((SELECT max(epoch) FROM shardkeeper.epochs WHERE topology = $1), 0))
	                               + $4::bigint, $3::bigint) + $2::bigint
	  WHERE topology = $1 RETURNING next_incarnation, epoch_floor`,
	`INSERT INTO shardkeeper.registry_seq AS r (topology, seq, timeline, system_id)
	 VALUES ($1, $2::bigint + $3::bigint, shardkeeper.current_timeline(), shardkeeper.current_system_id())
	 ON CONFLICT (topology) DO UPDATE SET seq = greatest(r.seq, r.behind_seen, $2::bigint) + $3::bigint,
	        timeline = excluded.timeline, system_id = excluded.system_id,
	        behind_reason = NULL, behind_seen = 0
	 RETURNING seq`,
}

// lostSQL reads how many write transactions the registry may have lost:
// the highest sequence a client reported (to Recover, or in a refused
// renewal) minus its own. Each lost transaction raised any one unit's
// token, the epoch numbering and the incarnation numbering by at most
// one, so the counters of the lost primary were at most this far ahead.
const lostSQL = `SELECT greatest(coalesce(max(behind_seen), 0), $2::bigint) - coalesce(max(seq), 0)
	FROM shardkeeper.registry_seq WHERE topology = $1`

// Recover makes a registry that went back in time safe to use again, in
// one transaction: it moves every fencing token, the topology epoch
// numbering, the incarnation numbering and the sequence past what the
// clients report having seen (seen, and the marks refused renewals
// recorded): each counter moves by the number of transactions the
// registry lost (Recovered.Lost: every one raised it by at most one), or
// to the highest value reported, whichever is higher, plus margin; ends every lease (every
// member rejoins and confirms), abandons a pending epoch, and clears the
// behind state and the recorded timeline. No (unit, token) and no epoch
// number a client saw is issued again. margin <= 0 means
// DefaultRecoverMargin.
func (p *PG) Recover(ctx context.Context, topology string, seen RecoverFloor, margin int64) (Recovered, error) {
	if margin <= 0 {
		margin = DefaultRecoverMargin
	}
	seenSeq := max(seen.Seq, p.marks.get(topology))
	var out Recovered
	err := p.recoverPipeline(ctx, topology, margin, &out, func(b *pgx.Batch) {
		b.Queue(lockTopologySQL, topology)
		// The lost count is read under the topology lock in the same
		// transaction; the statements below take it as a subquery.
		b.Queue(lostSQL, topology, seenSeq)
		b.Queue(strings.ReplaceAll(recoverSQL[0], "$4::bigint", "("+lostOf+")"), topology, seen.Token, margin, seenSeq)
		b.Queue(recoverSQL[1], topology)
		b.Queue(recoverSQL[2], topology)
		b.Queue(strings.ReplaceAll(recoverSQL[3], "$4::bigint", "("+lostOf+")"), topology, margin, seen.Epoch, seenSeq)
		b.Queue(recoverSQL[4], topology, seenSeq, margin)
	}, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
		}
		if err := br.QueryRow().Scan(&out.Lost); err != nil {
			return err
		}
		var up, ins int64
		if err := br.QueryRow().Scan(&out.TokenFloor, &up, &ins); err != nil {
			return err
		}
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := br.QueryRow().Scan(&out.IncarnationFloor, &out.EpochFloor); err != nil {
			return err
		}
		return br.QueryRow().Scan(&out.Seq)
	})
	if err != nil {
		return Recovered{}, fmt.Errorf("recover registry of %s: %w", topology, err)
	}
	p.marks.note(topology, out.Seq)
	if out.OperatorToken.Epoch != 0 {
		p.op.tok.Store(&out.OperatorToken)
	}
	return out, nil
}

// confirmRecoveredToken moves the handle to the registry's token of
// topology when the registry shows it above the handle's, held by the
// handle's own holder: a Recover of this handle committed though its reply
// was lost.
func (p *PG) confirmRecoveredToken(topology string, epoch int64, holder string) {
	tok := *p.op.tok.Load()
	if tok.Topology != topology || holder != tok.Holder || epoch <= tok.Epoch {
		return
	}
	tok.Epoch = epoch
	p.op.tok.Store(&tok)
}

// recoverFenceSQL is Recover's operator fence (migration 0010): it accepts
// the handle's token when it is the latest or above it (a take only the
// lost primary had), and moves the token past both, bound to its holder.
const recoverFenceSQL = `SELECT shardkeeper.operator_recover_fence($1, $2, $3, $4), clock_timestamp()`

// recoverPipeline is opPipeline for Recover. A handle bound to an operator
// token presents it to recoverFenceSQL, and out.OperatorToken gets the
// token the registry moved it to; a handle without one is checked as
// opPipeline checks it.
func (p *PG) recoverPipeline(ctx context.Context, topology string, margin int64, out *Recovered, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	if p.op == nil {
		return p.opPipeline(ctx, topology, queue, read)
	}
	tok := *p.op.tok.Load()
	err := pipeline(ctx, p.pool, func(b *pgx.Batch) {
		b.Queue(recoverFenceSQL, topology, p.fenceEpoch(topology), tok.Holder, margin)
		queue(b)
	}, func(br pgx.BatchResults) error {
		out.OperatorToken = tok
		if err := br.QueryRow().Scan(&out.OperatorToken.Epoch, &out.OperatorToken.TakenAt); err != nil {
			return err
		}
		return read(br)
	})
	return fenceErr(topology, err)
}
