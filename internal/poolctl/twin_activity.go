package poolctl

import (
	"context"
	"fmt"
	"sort"
)

// ReportActivity implements Registry: the report replaces the member's
// previous one. It needs the current incarnation, not a live lease.
func (t *Twin) ReportActivity(_ context.Context, m MemberRef, units []UnitActivity) error {
	rep, err := activityRows(units)
	if err != nil {
		return fmt.Errorf("report activity of %s: %w", m.Member, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp, err := t.topo(m.Topology)
	if err != nil {
		return err
	}
	if err := checkIncarnation(m, tp.members[m.Member]); err != nil {
		return fmt.Errorf("report activity: %w", err)
	}
	for k := range tp.activity {
		if k[0] == m.Member {
			delete(tp.activity, k)
		}
	}
	now := t.now(tp)
	for i, u := range rep.units {
		tp.activity[[2]string{m.Member, u}] = ActivityReport{Unit: u, Member: m.Member, Incarnation: m.Incarnation,
			Epoch: rep.epochs[i], ReportedAt: now, LastFetch: agoOrZero(now, rep.sinceFetch[i]),
			LastRows: agoOrZero(now, rep.sinceRows[i]), PullingSince: agoOrZero(now, rep.sincePull[i])}
	}
	return nil
}

// Activity implements Registry, sorted by unit then member.
func (t *Twin) Activity(_ context.Context, topology string) ([]ActivityReport, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.activity(topology)
}

// activity is Activity with t.mu held.
func (t *Twin) activity(topology string) ([]ActivityReport, error) {
	tp, err := t.topo(topology)
	if err != nil {
		return nil, err
	}
	out := []ActivityReport{}
	for _, r := range tp.activity {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Unit != out[j].Unit {
			return out[i].Unit < out[j].Unit
		}
		return out[i].Member < out[j].Member
	})
	return out, nil
}

// Observe implements Registry: the three reads under one hold of the
// twin's mutex.
func (t *Twin) Observe(ctx context.Context, topology string) (Observation, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var (
		o   Observation
		err error
	)
	if o.Snapshot, err = t.snapshot(topology); err != nil {
		return Observation{}, err
	}
	if o.Claims, err = t.claims(topology); err != nil {
		return Observation{}, err
	}
	if o.Activity, err = t.activity(topology); err != nil {
		return Observation{}, err
	}
	return o, nil
}
