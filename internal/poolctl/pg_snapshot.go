package poolctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// snapshotSQL reads a topology's whole state in one statement; nested rows
// come back as JSON.
var snapshotSQL = `
	WITH t AS (SELECT topology, shardkeeper.clock(topology) AS now, ` + paramsCols + `
	             FROM shardkeeper.topologies WHERE topology = $1),
	  -- The topology's claims counted once, by owner: every worker reads
	  -- a snapshot each tick, and a count per member (an index scan of its
	  -- claims each) beside one for the topology read each claim twice.
	  k AS (SELECT c.owner, count(*)::int AS holds,
	               count(*) FILTER (WHERE c.state = 'held')::int AS held,
	               count(*) FILTER (WHERE c.state = 'handover')::int AS handover,
	               count(*) FILTER (WHERE c.state = 'free')::int AS free
	          FROM shardkeeper.claims c WHERE c.topology = $1 GROUP BY c.owner)
	SELECT t.now, ` + paramsColsOf("t") + `,
	  (SELECT coalesce(json_agg(json_build_object(
	      'number', e.epoch, 'partitions', e.partitions, 'shards', e.shards, 'state', e.state,
	      'acked', (SELECT coalesce(json_agg(a.member ORDER BY a.member COLLATE "C"), '[]'::json)
	                  FROM shardkeeper.freeze_acks a
	                  JOIN shardkeeper.members m ON m.topology = a.topology AND m.member = a.member AND m.incarnation = a.incarnation
	                 WHERE a.topology = e.topology AND a.epoch = e.epoch AND e.state = 'pending'))), '[]'::json)
	     FROM shardkeeper.epochs e WHERE e.topology = t.topology AND e.state <> 'retired'),
	  (SELECT coalesce(json_agg(json_build_object(
	      'name', m.member, 'slot', coalesce(m.slot, -1), 'incarnation', m.incarnation,
	      'leaseExpiresAt', m.lease_expires_at, 'left', m.left_at IS NOT NULL, 'fenced', m.fenced,
	      'fenceLiftedAt', m.fence_lifted_at, 'draining', m.draining,
	      'holds', coalesce((SELECT k.holds FROM k WHERE k.owner = m.member), 0),
	      'handovers', coalesce((SELECT k.handover FROM k WHERE k.owner = m.member), 0))
	      ORDER BY m.member COLLATE "C"), '[]'::json)
	     FROM shardkeeper.members m WHERE m.topology = t.topology),
	  (SELECT coalesce(json_agg(ru.unit ORDER BY ru.unit COLLATE "C"), '[]'::json)
	     FROM shardkeeper.retiring_units ru WHERE ru.topology = t.topology),
	  (SELECT ` + barrierRowsJSON + `
	     FROM shardkeeper.order_barriers b
	     JOIN shardkeeper.epochs e ON e.topology = b.topology AND e.epoch = b.epoch AND e.state IN ('active', 'pending')
	    WHERE b.topology = t.topology),
	  r.allowed, r.census_taken_at, r.reason, r.floor, r.servers,
	  (SELECT coalesce(sum(k.held), 0)::int FROM k), (SELECT coalesce(sum(k.handover), 0)::int FROM k),
	  (SELECT coalesce(sum(k.free), 0)::int FROM k)
	FROM t
	LEFT JOIN shardkeeper.reset_permissions r ON r.topology = t.topology`

type snapEpoch struct {
	Number     int64      `json:"number"`
	Partitions int        `json:"partitions"`
	Shards     int        `json:"shards"`
	State      EpochState `json:"state"`
	Acked      []string   `json:"acked"`
}

type snapMember struct {
	Name           string    `json:"name"`
	Slot           int       `json:"slot"`
	Incarnation    int64     `json:"incarnation"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"`
	Left           bool      `json:"left"`
	Fenced         bool      `json:"fenced"`
	FenceLiftedAt  time.Time `json:"fenceLiftedAt"`
	Draining       bool      `json:"draining"`
	Holds          int       `json:"holds"`
	Handovers      int       `json:"handovers"`
}

// Snapshot implements Registry in one statement.
//
// A member acts on what the snapshot shows (the units it holds, the
// epochs), so the read is checked like a renewal (checkRead): from a
// registry that went back in time it is refused, not acted on.
func (p *PG) Snapshot(ctx context.Context, topology string) (Snapshot, error) {
	var rs readSeq
	s, err := scanSnapshot(p.pool.QueryRow(ctx, checkedSnapshotSQL, topology), topology, rs.dest()...)
	if err != nil {
		return Snapshot{}, err
	}
	if err := p.checkRead(ctx, p.pool, topology, rs); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: %w", topology, err)
	}
	return s, nil
}

// checkedSnapshotSQL is snapshotSQL followed by readSeqCols.
var checkedSnapshotSQL = `SELECT sn.*, ` + readSeqCols("s") + `
	FROM (` + snapshotSQL + `) sn LEFT JOIN shardkeeper.registry_seq s ON s.topology = $1`

// scanSnapshot reads snapshotSQL's row, and into extra any columns that
// follow it.
func scanSnapshot(row pgx.Row, topology string, extra ...any) (Snapshot, error) {
	s := Snapshot{Topology: topology}
	var (
		epochsJSON, membersJSON, retiringJSON, barrierJSON []byte
		allowed                                            *bool
		takenAt                                            *time.Time
		reason, floor                                      *string
		servers                                            map[string]string
	)
	err := row.Scan(scanAll([]any{&s.Now}, paramsDest(&s.Params), []any{&epochsJSON, &membersJSON, &retiringJSON, &barrierJSON, &allowed, &takenAt, &reason,
		&floor, &servers, &s.Counts.Held, &s.Counts.Handover, &s.Counts.Free}, extra)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, fmt.Errorf("topology %q: %w", topology, ErrUnknownTopology)
	} else if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: %w", topology, err)
	}
	var (
		epochs  []snapEpoch
		members []snapMember
	)
	if err := json.Unmarshal(epochsJSON, &epochs); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: decode epochs: %w", topology, err)
	}
	if err := json.Unmarshal(membersJSON, &members); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: decode members: %w", topology, err)
	}
	if err := json.Unmarshal(retiringJSON, &s.Retiring); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: decode retiring units: %w", topology, err)
	}
	if len(s.Retiring) == 0 {
		s.Retiring = nil
	}
	var barrier []barrierRow
	if err := json.Unmarshal(barrierJSON, &barrier); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot of %s: decode the order barrier: %w", topology, err)
	}
	s.Barrier = barrierOf(barrier)
	for _, e := range epochs {
		ep := &Epoch{Number: e.Number, Partitions: e.Partitions, Shards: e.Shards, State: e.State}
		switch e.State {
		case EpochActive:
			s.Active = ep
		case EpochPending:
			ep.Acked = e.Acked
			if len(ep.Acked) == 0 {
				ep.Acked = nil
			}
			s.Pending = ep
		}
	}
	for _, m := range members {
		s.Members = append(s.Members, Member{
			Name: m.Name, Slot: m.Slot, Incarnation: m.Incarnation, LeaseExpiresAt: m.LeaseExpiresAt,
			Live: !m.Left && s.Now.Before(m.LeaseExpiresAt), Left: m.Left, Fenced: m.Fenced,
			FenceLiftedAt: m.FenceLiftedAt, Draining: m.Draining, Holds: m.Holds, Handovers: m.Handovers,
		})
	}
	if allowed != nil {
		s.Reset = ResetPermission{Allowed: *allowed, CensusAge: s.Now.Sub(*takenAt), Reason: *reason, Published: true,
			Floor: *floor, Servers: serversOrNil(servers)}
	}
	if pgMutation.hidePendingBarrier && s.Barrier != nil && (s.Active == nil || s.Barrier.Epoch != s.Active.Number) {
		s.Barrier = nil
	}
	return s, nil
}

// serversOrNil normalizes an empty census map to nil, as both backends
// report it.
func serversOrNil(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
