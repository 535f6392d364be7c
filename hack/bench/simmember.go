package main

import (
	"context"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// simMember is a worker as the registry sees it, without pulling: it
// joins, acknowledges freezes, claims its placement under the active
// epoch, renews on schedule and reports every held unit as pulled a
// moment ago. Row e runs 40 of them so the operator's steady state has
// real claims and fresh activity reports to read, without 40960 pullers
// competing with the operator for this machine's two cores.
type simMember struct {
	reg      poolctl.Registry
	topology string
	name     string

	lease   poolctl.Lease
	held    map[string]poolctl.Token
	renewed time.Time
	acked   int64
}

// run takes part until ctx ends, then releases what it holds and leaves.
// Errors are retried on the next second: the operator's steady state is
// what is measured, not the member.
func (m *simMember) run(ctx context.Context) {
	m.held = map[string]poolctl.Token{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for ctx.Err() == nil {
		m.step(ctx)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	m.leave()
}

func (m *simMember) step(ctx context.Context) {
	if m.lease.Incarnation == 0 || time.Since(m.renewed) > m.lease.TTL {
		l, err := m.reg.Join(ctx, m.topology, m.name)
		if err != nil {
			return
		}
		m.lease, m.renewed, m.held = l, time.Now(), map[string]poolctl.Token{}
	}
	if time.Since(m.renewed) >= m.lease.Params.RenewInterval*8/10 {
		if l, err := m.reg.Renew(ctx, m.lease.MemberRef); err == nil {
			m.lease, m.renewed = l, time.Now()
			m.report(ctx)
		}
	}
	snap, err := m.reg.Snapshot(ctx, m.topology)
	if err != nil {
		return
	}
	if p := snap.Pending; p != nil {
		if m.acked != p.Number && m.reg.AckFreeze(ctx, m.lease.MemberRef, p.Number) == nil {
			m.acked = p.Number
		}
		return
	}
	m.claim(ctx, snap)
}

// claim takes the units placement gives this member that it lacks.
func (m *simMember) claim(ctx context.Context, snap poolctl.Snapshot) {
	me := snap.Member(m.name)
	if snap.Active == nil || me == nil || me.Slot < 0 {
		return
	}
	var slots []ownership.Slot
	for _, s := range snap.PlacementSlots() {
		slots = append(slots, ownership.Slot(s))
	}
	topo := ownership.Topology{Partitions: snap.Active.Partitions, Shards: snap.Active.Shards}
	var want []string
	for _, u := range ownership.Place(topo.Units(), slots).UnitsOf(ownership.Slot(me.Slot)) {
		if _, ok := m.held[u.String()]; !ok {
			want = append(want, u.String())
		}
	}
	if len(want) == 0 {
		return
	}
	outs, err := m.reg.ClaimMany(ctx, m.lease.MemberRef, snap.Active.Number, want)
	if err != nil {
		return
	}
	for _, o := range outs {
		if o.Err == nil {
			m.held[o.Unit] = o.Claim.Token
		}
	}
	m.report(ctx)
}

// report says every held unit was pulled half a second ago and never
// received a row (its consumer holds none).
func (m *simMember) report(ctx context.Context) {
	acts := make([]poolctl.UnitActivity, 0, len(m.held))
	for u, t := range m.held {
		acts = append(acts, poolctl.UnitActivity{Unit: u, Epoch: t.Epoch, SinceFetch: 500 * time.Millisecond, SinceRows: -1})
	}
	_ = m.reg.ReportActivity(ctx, m.lease.MemberRef, acts)
}

func (m *simMember) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	toks := make([]poolctl.Token, 0, len(m.held))
	for _, t := range m.held {
		toks = append(toks, t)
	}
	if len(toks) > 0 {
		_, _ = m.reg.ReleaseMany(ctx, toks)
	}
	_ = m.reg.Leave(ctx, m.lease.MemberRef)
}
