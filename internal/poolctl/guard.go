package poolctl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// GuardSQL is the write guard a sink in the registry's database can embed
// in its own statement, with GuardArgs as its first four arguments:
//
//	INSERT INTO rows (unit, seq, body)
//	SELECT $2, $5, $6 WHERE shardkeeper.claim_valid($1, $2, $3, $4)
//
// The function locks the claim row FOR SHARE, so an adoption of the unit
// waits until the sink's transaction ends: the write either commits while
// the token is valid or is not made at all (zero rows).
const GuardSQL = "shardkeeper.claim_valid($1, $2, $3, $4)"

// GuardArgs are GuardSQL's arguments for t.
func GuardArgs(t Token) []any { return []any{t.Topology, t.Unit, t.Member, t.Epoch} }

// GuardedExec runs sql with args in tx only if t is valid, and keeps it
// valid until tx ends (see GuardSQL). A stale token is refused with a
// *StaleEpochError and sql does not run. It costs one extra round trip;
// sinks that care embed GuardSQL instead.
func GuardedExec(ctx context.Context, tx pgx.Tx, t Token, sql string, args ...any) (pgconn.CommandTag, error) {
	var ok bool
	if err := tx.QueryRow(ctx, "SELECT "+GuardSQL, GuardArgs(t)...).Scan(&ok); err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("guard %s: %w", t, err)
	}
	if !ok {
		if err := readToken(ctx, tx, t); err != nil {
			return pgconn.CommandTag{}, fmt.Errorf("guarded write: %w", err)
		}
		// Valid again by the time of the second read: report it as a
		// conflict rather than write without the lock.
		return pgconn.CommandTag{}, fmt.Errorf("guarded write with %s: %w", t, ErrConflict)
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return tag, fmt.Errorf("guarded write with %s: %w", t, err)
	}
	return tag, nil
}

// querier is what readToken needs from a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readToken checks t in one statement, without locks.
func readToken(ctx context.Context, q querier, t Token) error {
	var (
		now *time.Time
		c   claimScan
		ow  memberScan
	)
	err := q.QueryRow(ctx, tokenReadSQL+`
		SELECT t.now, `+claimCols("c")+`, `+memberCols("ow")+` FROM t LEFT JOIN c ON true LEFT JOIN ow ON true`,
		t.Topology, t.Unit).Scan(scanAll([]any{&now}, c.dest(), ow.dest())...)
	if err != nil {
		return fmt.Errorf("check token %s: %w", t, err)
	}
	if err := topologyErr(t.Topology, now); err != nil {
		return err
	}
	return tokenValid(t, c.row(), ow.row(), *now)
}

// EpochFence is what a sink outside the registry's database keeps: the
// highest fencing epoch it has admitted per unit. A write whose token is
// older than one already admitted is refused without asking the registry;
// a sink that must also rule out a newer owner it has not heard from yet
// calls CheckToken for each batch. The zero value is ready to use.
type EpochFence struct {
	mu   sync.Mutex
	high map[[2]string]Token
}

// Admit accepts t if no newer epoch of its unit was admitted, and records
// it. It refuses with a *StaleEpochError otherwise.
func (f *EpochFence) Admit(t Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.high == nil {
		f.high = map[[2]string]Token{}
	}
	key := [2]string{t.Topology, t.Unit}
	h, ok := f.high[key]
	if ok && (h.Epoch > t.Epoch || (h.Epoch == t.Epoch && h.Member != t.Member)) {
		return &StaleEpochError{Token: t, Reason: StaleMoved, Owner: h.Member, Epoch: h.Epoch}
	}
	f.high[key] = t
	return nil
}
