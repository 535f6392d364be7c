package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// reportingMember is a registry member the test drives by hand: it renews
// its lease and, every tick, reports the activity the test sets.
type reportingMember struct {
	reg   poolctl.Registry
	lease poolctl.Lease

	mu     sync.Mutex
	report []poolctl.UnitActivity // nil: report nothing (the report ages)
	// pulls, when report is nil, are the units the member pulls, each
	// under a claim epoch since a time: every tick reports them as a
	// worker does, pulled and received rows just now.
	pulls []pull
	err   error
}

// pull is one unit a reportingMember pulls under one claim token.
type pull struct {
	unit  string
	epoch int64
	since time.Time
}

func joinReporting(t *testing.T, f *fleet, name string) *reportingMember {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := f.reg.Join(ctx, f.key(), name)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	m := &reportingMember{reg: f.reg, lease: l}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			m.tick(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

func (m *reportingMember) tick(ctx context.Context) {
	_, err := m.reg.Renew(ctx, m.lease.MemberRef)
	m.mu.Lock()
	report := m.report
	if report == nil && m.pulls != nil {
		report = []poolctl.UnitActivity{}
		for _, p := range m.pulls {
			report = append(report, poolctl.UnitActivity{Unit: p.unit, Epoch: p.epoch, SincePullStart: time.Since(p.since)})
		}
	}
	m.mu.Unlock()
	if err == nil && report != nil {
		err = m.reg.ReportActivity(ctx, m.lease.MemberRef, report)
	}
	if err != nil && ctx.Err() == nil {
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
	}
}

// set makes every later report say units; nil stops reporting.
func (m *reportingMember) set(units ...poolctl.UnitActivity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report, m.pulls = units, nil
}

// pulling makes every later report say the member pulls these units,
// each since its own start (a worker's pull windows); none stops
// reporting, so the last report stays as a dead pod's does.
func (m *reportingMember) pulling(pulls ...pull) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report, m.pulls = nil, pulls
}

// lastReport is when the registry recorded member's latest report of
// unit (zero: none).
func lastReport(t *testing.T, f *fleet, member, unit string) time.Time {
	t.Helper()
	acts, err := f.reg.Activity(context.Background(), f.key())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		if a.Member == member && a.Unit == unit {
			return a.ReportedAt
		}
	}
	return time.Time{}
}

func (m *reportingMember) claim(t *testing.T, epoch int64, unit string) poolctl.Token {
	t.Helper()
	c, err := m.reg.Claim(context.Background(), m.lease.MemberRef, epoch, unit)
	if err != nil {
		t.Fatalf("%s claims %s: %v", m.lease.Member, unit, err)
	}
	return c.Token
}

// flowing is a report of unit pulled under the claim at epoch for the
// last 30 seconds, just now, with a row just now (or never, when rows is
// false).
func flowing(unit string, epoch int64, rows bool) poolctl.UnitActivity {
	a := poolctl.UnitActivity{Unit: unit, Epoch: epoch, SinceRows: -1, SincePullStart: 30 * time.Second}
	if rows {
		a.SinceRows = 0
	}
	return a
}

// Owned means flowing: a unit whose owner stops reporting, or whose rows
// wait while its owner receives none, is stalled, Ready says so and names
// it, and the metric counts it; a unit two members pull is multiply owned
// in status and the metric. Every figure comes from reports fed through
// the real registry and from the census's count of pending rows.
// checks P1, checks P7
func TestActivityReportsDriveStalledAndMultiplyOwnedUnits(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperatorWith(t, f.ns, operator.Options{CensusInterval: time.Second})
	f.create()
	f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.ActiveEpoch == nil {
			return errors.New("no active epoch yet")
		}
		return nil
	})
	a, b := joinReporting(t, f, "a"), joinReporting(t, f, "b")
	ta, tb := a.claim(t, 1, "0.0"), b.claim(t, 1, "0.1")
	a.set(flowing("0.0", ta.Epoch, true))
	b.set(flowing("0.1", tb.Epoch, true))

	labels := map[string]string{"namespace": f.ns, "name": "ingest"}
	metric := func(name string, want float64) error {
		l := labels
		if state, ok := strings.CutPrefix(name, "shardkeeper_units:"); ok {
			name, l = "shardkeeper_units", map[string]string{"namespace": f.ns, "name": "ingest", "state": state}
		}
		if got, ok := metricValue(t, name, l); !ok || got != want {
			return fmt.Errorf("%s = %v (present %t), want %v", name, got, ok, want)
		}
		return nil
	}
	st := f.waitReady(30 * time.Second)
	if u := st.Status.Units; u == nil || u.Owned != 2 || u.Stalled != 0 || u.MultiplyOwned != 0 {
		t.Fatalf("units %+v, want 2 owned and flowing", u)
	}
	eventually(t, 10*time.Second, func() error {
		return errors.Join(metric("shardkeeper_units:stalled", 0), metric("shardkeeper_units_multiply_owned", 0))
	})

	// a keeps its lease but stops reporting: its unit's report ages.
	a.set()
	st = f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if u := o.Status.Units; u == nil || u.Stalled != 1 || u.Owned != 2 {
			return fmt.Errorf("units %+v, want 1 of 2 owned units stalled", u)
		}
		return nil
	})
	c := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonUnitsStalled)
	if !strings.Contains(c.Message, "0.0 (a: last activity report") || !strings.Contains(st.Status.Progress, "units 1/2 owned; 1 stalled") {
		t.Fatalf("Ready message %q, progress %q: want 0.0 named and only flowing units counted as owned", c.Message, st.Status.Progress)
	}
	eventually(t, 10*time.Second, func() error { return metric("shardkeeper_units:stalled", 1) })
	a.set(flowing("0.0", ta.Epoch, true))
	f.waitReady(20 * time.Second)

	// b pulls 0.0 as well as its own unit: two members pull one unit at
	// once (b without a claim: a token of its own name).
	b.set(flowing("0.1", tb.Epoch, true), flowing("0.0", ta.Epoch, true))
	st = f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if u := o.Status.Units; u == nil || u.MultiplyOwned != 1 || !strings.Contains(o.Status.Progress, "1 multiply owned") {
			return fmt.Errorf("units %+v, want 1 multiply owned", u)
		}
		return nil
	})
	// Two members pulling one unit is a P1 signal: never Ready beside it.
	c = wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonUnitsMultiplyOwned)
	if !strings.Contains(c.Message, ": 0.0") || st.Status.Phase == topologyv1.PhaseReady {
		t.Fatalf("Ready message %q, phase %s: want 0.0 named and the phase not Ready", c.Message, st.Status.Phase)
	}
	eventually(t, 10*time.Second, func() error { return metric("shardkeeper_units_multiply_owned", 1) })
	b.set(flowing("0.1", tb.Epoch, true))
	f.waitReady(20 * time.Second)

	// a renews and reports, but its last completed pull is long past (its
	// NATS is gone): stalled, although the report itself is fresh.
	a.set(poolctl.UnitActivity{Unit: "0.0", Epoch: ta.Epoch, SinceFetch: time.Minute, SinceRows: time.Minute})
	st = f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionReady)
		if c == nil || c.Reason != topologyv1.ReasonUnitsStalled || !strings.Contains(c.Message, "0.0 (a: no pull progress for 1m0s") {
			return errors.New("want Ready=False naming 0.0 with no pull progress")
		}
		return nil
	})
	a.set(flowing("0.0", ta.Epoch, true))
	f.waitReady(20 * time.Second)

	// Rows wait in 0.1 and b, which pulls, receives none: stalled once a
	// census counted them and b's reports since say so.
	b.set(flowing("0.1", tb.Epoch, false))
	f.publish(0, 1, 5)
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionReady)
		if c == nil || c.Reason != topologyv1.ReasonUnitsStalled || !strings.Contains(c.Message, "0.1 (b: 5 rows pending") {
			return errors.New("want Ready=False naming 0.1 with 5 rows pending")
		}
		return nil
	})
	if u := st.Status.Units; u.Stalled != 1 || u.MultiplyOwned != 0 {
		t.Fatalf("units %+v, want 1 stalled and none multiply owned", u)
	}
	// b receives rows again: flowing.
	b.set(flowing("0.1", tb.Epoch, true))
	f.waitReady(30 * time.Second)
	for _, m := range []*reportingMember{a, b} {
		m.mu.Lock()
		if m.err != nil {
			t.Errorf("member %s: %v", m.lease.Member, m.err)
		}
		m.mu.Unlock()
	}
	// The operator pruned the registry's history on the way, quietly.
	if evs := listEvents(t, f.ns, "HistoryPruneFailed"); len(evs) > 0 {
		t.Fatalf("pruning the history failed: %s", evs[0].Note)
	}
}

// The "multiplyOwned trips in a normal pod roll": a handover,
// the old owner's last report still fresh when the new owner's first
// comes (a pod deleted right after it handed over), leaves multiplyOwned
// at 0 in status and the metric; a unit really pulled under two claim
// tokens at once (a process that kept pulling after it released) counts.
// Reports go through the real registry, status through the API server.
// checks P1
func TestMultiplyOwnedStaysZeroThroughAHandoverAndCountsTwoTokensPullingAtOnce(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperatorWith(t, f.ns, operator.Options{CensusInterval: time.Second})
	f.create()
	f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.ActiveEpoch == nil {
			return errors.New("no active epoch yet")
		}
		return nil
	})
	a, b := joinReporting(t, f, "a"), joinReporting(t, f, "b")
	ta, tb := a.claim(t, 1, "0.0"), b.claim(t, 1, "0.1")
	start := time.Now()
	a.pulling(pull{"0.0", ta.Epoch, start})
	b.pulling(pull{"0.1", tb.Epoch, start})
	f.waitReady(30 * time.Second)
	multiply := func() error {
		if got, ok := metricValue(t, "shardkeeper_units_multiply_owned", map[string]string{"namespace": f.ns, "name": "ingest"}); !ok || got != 0 {
			return fmt.Errorf("shardkeeper_units_multiply_owned = %v (present %t), want 0", got, ok)
		}
		return nil
	}
	eventually(t, 10*time.Second, multiply)

	// a hands 0.0 over as a pod being rolled does: it stops pulling, its
	// last report stays (the pod is gone), it releases; b claims 0.0
	// under a new token and pulls it from then on.
	eventually(t, 5*time.Second, func() error {
		if lastReport(t, f, "a", "0.0").Before(start) {
			return errors.New("no report of a's window yet")
		}
		return nil
	})
	a.pulling()
	aLast := lastReport(t, f, "a", "0.0")
	if err := f.reg.Release(context.Background(), ta); err != nil {
		t.Fatalf("a releases 0.0: %v", err)
	}
	tb0 := b.claim(t, 1, "0.0")
	if tb0.Epoch == ta.Epoch {
		t.Fatalf("b's claim on 0.0 has a's epoch %d", ta.Epoch)
	}
	b.pulling(pull{"0.1", tb.Epoch, start}, pull{"0.0", tb0.Epoch, time.Now()})

	// Until a's report is no longer fresh (two renew intervals), and a
	// census after it, every status says no unit is multiply owned; the
	// old rule (two fresh reports of recent pulls) counted 0.0 here.
	fresh := aLast.Add(2 * poolctl.DefaultParams().RenewInterval)
	assessedWhileFresh := 0
	seen := map[time.Time]bool{}
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if u := o.Status.Units; u != nil && u.MultiplyOwned != 0 {
			t.Fatalf("during the handover: units %+v, progress %q: want none multiply owned", u, o.Status.Progress)
		}
		if err := multiply(); err != nil {
			t.Fatalf("during the handover: %v", err)
		}
		c := o.Status.Census
		if c == nil || c.ObservedAt == nil {
			return errors.New("no census yet")
		}
		at := c.ObservedAt.Time
		if !seen[at] && at.After(aLast) && at.Before(fresh) {
			assessedWhileFresh++
		}
		seen[at] = true
		if !at.After(fresh.Add(time.Second)) {
			return fmt.Errorf("census at %s, want one after a's report aged (%s)", at, fresh)
		}
		return nil
	})
	if assessedWhileFresh == 0 {
		t.Fatalf("no status was computed while a's last report was fresh (%s to %s): the handover was not judged", aLast, fresh)
	}
	t.Logf("%d censuses, and the status computed with each, while a's last report was fresh: none counted 0.0", assessedWhileFresh)
	f.waitReady(20 * time.Second)

	// a pulls 0.0 again under its released token while b pulls it under
	// its own: one unit, two tokens, at once.
	a.pulling(pull{"0.0", ta.Epoch, time.Now()})
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if u := o.Status.Units; u == nil || u.MultiplyOwned != 1 {
			return fmt.Errorf("units %+v, want 1 multiply owned", u)
		}
		return nil
	})
	c := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonUnitsMultiplyOwned)
	if !strings.Contains(c.Message, "two or more claim tokens at once: 0.0") {
		t.Fatalf("Ready message %q: want 0.0 named", c.Message)
	}
	eventually(t, 10*time.Second, func() error {
		if got, ok := metricValue(t, "shardkeeper_units_multiply_owned", map[string]string{"namespace": f.ns, "name": "ingest"}); !ok || got != 1 {
			return fmt.Errorf("shardkeeper_units_multiply_owned = %v (present %t), want 1", got, ok)
		}
		return nil
	})
	// a stops: its report ages, and the count returns to 0.
	a.pulling()
	f.waitReady(30 * time.Second)
	for _, m := range []*reportingMember{a, b} {
		m.mu.Lock()
		if m.err != nil {
			t.Errorf("member %s: %v", m.lease.Member, m.err)
		}
		m.mu.Unlock()
	}
}

// A registry that stops answering (a partition, or a statement waiting on
// locks a stopped worker holds) does not hang the reconcile: each registry
// call has a deadline, and status says the registry did not answer.
// checks P7
func TestARegistryThatStopsAnsweringReachesStatusWithinTheBound(t *testing.T) {
	const bound = 2 * time.Second
	f := newFleet(t, fleetInput{partitions: 1, shards: 2, registryProxy: true})
	f.withStatefulSet(0, "w")
	startOperatorWith(t, f.ns, operator.Options{RegistryTimeout: bound})
	f.create()
	// The worker reaches the registry directly, not through the proxy.
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)

	f.proxy.Hold(true)
	held := time.Now()
	// Ready looks again every 30s; a touch brings the next reconcile now.
	f.update(func(o *topologyv1.ShardTopology) { o.Annotations = map[string]string{"test.shardkeeper.dev/poke": "1"} })
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionReconciling)
		if c == nil || c.Reason != topologyv1.ReasonRegistryUnavailable {
			return errors.New("want Reconciling with reason RegistryUnavailable")
		}
		return nil
	})
	// The next reconcile starts at once (the touch), and its first
	// registry call gives up after the bound.
	if waited := time.Since(held); waited > 2*time.Second+bound+5*time.Second {
		t.Fatalf("status reported the silent registry %s after it stopped answering", waited)
	}
	c := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonRegistryUnavailable)
	if !strings.Contains(c.Message, "the registry did not answer") || !strings.Contains(c.Message, bound.String()) {
		t.Fatalf("Ready message %q does not say the registry did not answer within %s", c.Message, bound)
	}
	// Phase and progress say the reading failed, not what the last one
	// read (the topology was Ready with 2/2 units owned).
	if st.Status.Phase == topologyv1.PhaseReady || st.Status.Units != nil ||
		!strings.Contains(st.Status.Progress, "RegistryUnavailable: registry not read, units unknown") {
		t.Fatalf("phase %s, units %+v, progress %q: want neither Ready nor the last counts", st.Status.Phase, st.Status.Units, st.Status.Progress)
	}
	// The metrics follow: the unit counts are absent, not the last ones.
	eventually(t, 10*time.Second, func() error {
		if v, ok := metricValue(t, "shardkeeper_units", map[string]string{"namespace": f.ns, "name": "ingest", "state": "flowing"}); ok {
			return fmt.Errorf("shardkeeper_units{state=flowing} = %v while the registry is not read", v)
		}
		return nil
	})
	waitEvent(t, f.ns, topologyv1.ReasonRegistryUnavailable, "did not answer")

	f.proxy.Hold(false)
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := findCondition(o, topologyv1.ConditionReconciling); c == nil || c.Reason == topologyv1.ReasonRegistryUnavailable {
			return errors.New("still reporting the registry unavailable")
		}
		return nil
	})
}
