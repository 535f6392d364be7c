package poolctl

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// CreatePending implements Registry.
func (t *Twin) CreatePending(_ context.Context, topology string, partitions, shards int) (int64, error) {
	return t.createPendingWith(topology, partitions, shards, func(*twinTopology, int64) {})
}

// createPendingWith is CreatePending that runs with on the topology, under
// the same lock, when it creates the epoch (not when one of that shape is
// pending already).
func (t *Twin) createPendingWith(topology string, partitions, shards int, with func(tp *twinTopology, epoch int64)) (int64, error) {
	if err := checkShape(partitions, shards); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return 0, err
	}
	tp, err := t.topo(topology)
	if err != nil {
		return 0, err
	}
	n, created, err := tp.createPending(partitions, shards)
	if err == nil && created {
		with(tp, n)
	}
	return n, err
}

// createPending is CreatePending on tp, with t.mu held and the operator
// checked; created says the epoch is new.
func (tp *twinTopology) createPending(partitions, shards int) (n int64, created bool, err error) {
	var last int64
	for _, e := range tp.epochs {
		if e.State == EpochPending {
			if e.Partitions == partitions && e.Shards == shards {
				return e.Number, false, nil
			}
			return 0, false, fmt.Errorf("create epoch %dx%d while epoch %d (%dx%d) is pending: %w",
				partitions, shards, e.Number, e.Partitions, e.Shards, ErrPendingExists)
		}
		last = max(last, e.Number)
	}
	e := &epochRow{Number: last + 1, Partitions: partitions, Shards: shards, State: EpochPending}
	tp.epochs[e.Number] = e
	return e.Number, true, nil
}

// AckFreeze implements Registry.
func (t *Twin) AckFreeze(_ context.Context, m MemberRef, epoch int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return err
	}
	if err := checkMember(m, tp.members[m.Member], t.now(tp)); err != nil {
		return fmt.Errorf("ack freeze: %w", err)
	}
	e := tp.epochs[epoch]
	if e == nil || e.State != EpochPending {
		return fmt.Errorf("ack freeze of epoch %d: not pending: %w", epoch, ErrEpochState)
	}
	if tp.acks[epoch] == nil {
		tp.acks[epoch] = map[string]int64{}
	}
	tp.acks[epoch][m.Member] = m.Incarnation
	return nil
}

// Activate implements Registry.
func (t *Twin) Activate(_ context.Context, topology string, epoch int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	e := tp.epochs[epoch]
	switch {
	case e != nil && e.State == EpochActive:
		return nil
	case e == nil || e.State != EpochPending:
		return fmt.Errorf("activate epoch %d: not pending: %w", epoch, ErrEpochState)
	}
	now := t.now(tp)
	var missing []string
	for name, m := range tp.members {
		if m.live(now) && tp.acks[epoch][name] != m.Incarnation {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return &FreezeIncompleteError{Epoch: epoch, Missing: missing}
	}
	wall := t.wall()
	for _, o := range tp.epochs {
		if o.State == EpochActive {
			o.State, o.RetiredWall = EpochRetired, wall
		}
	}
	e.State, e.ActivatedWall = EpochActive, wall
	return nil
}

// Retire implements Registry.
func (t *Twin) Retire(_ context.Context, topology string, epoch int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	e := tp.epochs[epoch]
	switch {
	case e != nil && e.State == EpochRetired:
		return nil
	case e == nil || e.State != EpochPending:
		return fmt.Errorf("retire epoch %d: only a pending epoch can be retired: %w", epoch, ErrEpochState)
	}
	e.State, e.RetiredWall = EpochRetired, t.wall()
	return nil
}

// PublishResetPermission implements Registry.
func (t *Twin) PublishResetPermission(_ context.Context, topology string, p ResetPermission) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkOperator(topology); err != nil {
		return err
	}
	tp, err := t.topo(topology)
	if err != nil {
		return err
	}
	now := t.now(tp)
	var servers map[string]string
	for name, v := range p.Servers {
		if servers == nil {
			servers = map[string]string{}
		}
		servers[name] = v
	}
	tp.reset = &twinReset{allowed: p.Allowed, takenAt: now.Add(-p.CensusAge.Truncate(time.Microsecond)), reason: p.Reason,
		floor: p.Floor, servers: servers, publishedAt: now}
	return nil
}

// Snapshot implements Registry.
func (t *Twin) Snapshot(_ context.Context, topology string) (Snapshot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.snapshot(topology)
}

// snapshot is Snapshot with t.mu held.
func (t *Twin) snapshot(topology string) (Snapshot, error) {
	tp, err := t.topo(topology)
	if err != nil {
		return Snapshot{}, err
	}
	now := t.now(tp)
	s := Snapshot{Topology: topology, Now: now, Params: tp.params}
	for _, e := range tp.epochs {
		ep := &Epoch{Number: e.Number, Partitions: e.Partitions, Shards: e.Shards, State: e.State}
		switch e.State {
		case EpochActive:
			s.Active = ep
		case EpochPending:
			for name, inc := range tp.acks[e.Number] {
				if m := tp.members[name]; m != nil && m.Incarnation == inc {
					ep.Acked = append(ep.Acked, name)
				}
			}
			sort.Strings(ep.Acked)
			s.Pending = ep
		}
	}
	for _, m := range tp.members {
		mm := Member{
			Name: m.Name, Slot: m.Slot, Incarnation: m.Incarnation, LeaseExpiresAt: m.LeaseExpiresAt,
			Live: m.live(now), Left: m.Left, Fenced: m.Fenced, FenceLiftedAt: m.FenceLiftedAt, Draining: m.Draining,
		}
		for _, c := range tp.claims {
			if c.State != StateFree && c.Owner == m.Name {
				mm.Holds++
				if c.State == StateHandover {
					mm.Handovers++
				}
			}
		}
		s.Members = append(s.Members, mm)
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].Name < s.Members[j].Name })
	for _, c := range tp.claims {
		switch c.State {
		case StateHeld:
			s.Counts.Held++
		case StateHandover:
			s.Counts.Handover++
		case StateFree:
			s.Counts.Free++
		}
	}
	s.Barrier = tp.barrierOf(func(e int64) bool {
		return s.Active != nil && e == s.Active.Number || s.Pending != nil && e == s.Pending.Number && !t.mutation.hidePendingBarrier
	})
	if r := tp.reset; r != nil {
		s.Reset = ResetPermission{Allowed: r.allowed, CensusAge: now.Sub(r.takenAt), Reason: r.reason, Published: true,
			Floor: r.floor, Servers: copyServers(r.servers)}
	}
	for u := range tp.retiring {
		s.Retiring = append(s.Retiring, u)
	}
	sort.Strings(s.Retiring)
	return s, nil
}

// copyServers copies a census map so callers cannot change the twin's.
func copyServers(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// checkShape validates a topology shape against the API's limits.
func checkShape(partitions, shards int) error {
	if partitions < 1 || partitions > 1024 || shards < 1 || shards > 1024 || partitions*shards > 65536 {
		return fmt.Errorf("topology %dx%d outside 1..1024 x 1..1024 with at most 65536 units: %w", partitions, shards, ErrInvalid)
	}
	return nil
}
