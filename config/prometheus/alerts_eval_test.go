package monitoring_test

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// Alerts are evaluated here with Prometheus's own PromQL engine over
// series written the way a failure really leaves them: a series that is
// absent, a condition that is Unknown or False, a timestamp of 0. A rule
// that matched only the healthy series would pass a parse check and
// never fire (issue 21: with wrong system credentials VersionFloorMet was
// Unknown and shardkeeper_census_timestamp_seconds absent, so neither
// VersionFloorNotMet nor CensusStale could fire).

// evalStep is how often the rules are evaluated, as Prometheus's default
// evaluation interval.
const evalStep = 30 * time.Second

// sample is one float sample of a test series.
type sample struct {
	t int64
	f float64
}

func (s sample) T() int64                    { return s.t }
func (sample) ST() int64                     { return 0 }
func (s sample) F() float64                  { return s.f }
func (sample) H() *histogram.Histogram       { return nil }
func (sample) FH() *histogram.FloatHistogram { return nil }
func (sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample         { return s }

// memStorage is a read-only Queryable over a few series.
type memStorage struct{ series []storage.Series }

// loadSeries parses series descriptions in the notation of Prometheus's
// test scripts ("up{job=\"x\"} 1x40", "_" for an absent sample), one
// sample per evalStep from time 0.
func loadSeries(t *testing.T, descs ...string) *memStorage {
	t.Helper()
	m := &memStorage{}
	for _, d := range descs {
		lbls, vals, err := promqlParser.ParseSeriesDesc(d)
		if err != nil {
			t.Fatalf("series %q: %v", d, err)
		}
		var ss []chunks.Sample
		for i, v := range vals {
			if !v.Omitted {
				ss = append(ss, sample{t: int64(i) * evalStep.Milliseconds(), f: v.Value})
			}
		}
		m.series = append(m.series, storage.NewListSeries(lbls, ss))
	}
	return m
}

func (m *memStorage) Querier(int64, int64) (storage.Querier, error) { return m, nil }

func (m *memStorage) Select(_ context.Context, sortSeries bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, s := range m.series {
		ok := true
		for _, mt := range ms {
			if !mt.Matches(s.Labels().Get(mt.Name)) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	if sortSeries {
		sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	}
	return &listSet{series: out, i: -1}
}

func (*memStorage) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (*memStorage) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (*memStorage) Close() error { return nil }

type listSet struct {
	series []storage.Series
	i      int
}

func (l *listSet) Next() bool                      { l.i++; return l.i < len(l.series) }
func (l *listSet) At() storage.Series              { return l.series[l.i] }
func (*listSet) Err() error                        { return nil }
func (*listSet) Warnings() annotations.Annotations { return nil }

// firing evaluates rule every evalStep from 0 to until, as Prometheus's
// rule manager does, and returns the label sets of the alerts firing at
// until: those whose expression returned them at every evaluation for at
// least the rule's `for`.
func firing(t *testing.T, rule rulefmt.Rule, st *memStorage, until time.Duration) []string {
	t.Helper()
	eng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute, Parser: promqlParser})
	since := map[string]time.Duration{}
	var fired []string
	for at := time.Duration(0); at <= until; at += evalStep {
		q, err := eng.NewInstantQuery(context.Background(), st, nil, rule.Expr, time.UnixMilli(at.Milliseconds()))
		if err != nil {
			t.Fatalf("alert %s: %v", rule.Alert, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("alert %s at %s: %v", rule.Alert, at, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("alert %s: %v", rule.Alert, err)
		}
		now := map[string]time.Duration{}
		for _, s := range vec {
			k := s.Metric.DropMetricName().String()
			start, ok := since[k]
			if !ok {
				start = at
			}
			now[k] = start
		}
		since = now
		q.Close()
	}
	for k, start := range since {
		if until-start >= time.Duration(rule.For) {
			fired = append(fired, k)
		}
	}
	slices.Sort(fired)
	return fired
}

// topo labels a topology's series.
const topo = `namespace="ingest",name="orders"`

// alertScenarios are, per alert, the series a failure leaves and the
// healthy ones it must leave alone. Each failure is written as the
// operator exports it (controllers/metrics.go): condition series per
// status, 1 for the current one; the census timestamp 0 while no census
// has succeeded.
var alertScenarios = []struct {
	alert  string
	name   string
	series []string
	until  time.Duration
	want   []string
}{
	{"ShardTopologyStalled", "a DSN that does not parse stalls the topology", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Stalled",status="true"} 1x40`,
		`shardkeeper_topology_condition{` + topo + `,type="Stalled",status="false"} 0x40`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest", status="true", type="Stalled"}`}},
	{"ShardTopologyStalled", "healthy", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Stalled",status="true"} 0x40`,
		`shardkeeper_topology_condition{` + topo + `,type="Stalled",status="false"} 1x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyVersionFloorNotMet", "wrong system credentials: the census fails closed, VersionFloorMet False", []string{
		`shardkeeper_topology_condition{` + topo + `,type="VersionFloorMet",status="false"} 1x40`,
		`shardkeeper_topology_condition{` + topo + `,type="VersionFloorMet",status="unknown"} 0x40`,
		`shardkeeper_topology_condition{` + topo + `,type="VersionFloorMet",status="true"} 0x40`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest", status="false", type="VersionFloorMet"}`}},
	{"ShardTopologyVersionFloorNotMet", "healthy", []string{
		`shardkeeper_topology_condition{` + topo + `,type="VersionFloorMet",status="true"} 1x40`,
		`shardkeeper_topology_condition{` + topo + `,type="VersionFloorMet",status="false"} 0x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyCensusStale", "no census ever succeeded: the timestamp is 0", []string{
		`shardkeeper_census_timestamp_seconds{` + topo + `} 0x40`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest"}`}},
	{"ShardTopologyCensusStale", "censuses stop after the first: the timestamp stays", []string{
		`shardkeeper_census_timestamp_seconds{` + topo + `} 0+0x40`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest"}`}},
	{"ShardTopologyCensusStale", "healthy: a census every 30s", []string{
		`shardkeeper_census_timestamp_seconds{` + topo + `} 0+30x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyNotReady", "a registry that refuses the role, retried or stalled: Ready False for good", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="true"} 0x80`,
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="false"} 1x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Pending"} 1x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Paused"} 0x80`,
	}, 40 * time.Minute, []string{`{name="orders", namespace="ingest", status="true", type="Ready"}`}},
	{"ShardTopologyNotReady", "Ready Unknown (never reconciled) counts as not Ready", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="true"} 0x80`,
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="unknown"} 1x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Pending"} 1x80`,
	}, 40 * time.Minute, []string{`{name="orders", namespace="ingest", status="true", type="Ready"}`}},
	{"ShardTopologyNotReady", "a pause holds the rollout on purpose", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="true"} 0x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Paused"} 1x80`,
	}, 40 * time.Minute, nil},
	{"ShardTopologyNotReady", "a plan waits for a person's approval", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="true"} 0x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="AwaitingApproval"} 1x80`,
	}, 40 * time.Minute, nil},
	{"ShardTopologyNotReady", "a rollout of ten minutes", []string{
		`shardkeeper_topology_condition{` + topo + `,type="Ready",status="true"} 0x20 1x60`,
		`shardkeeper_topology_phase{` + topo + `,phase="RollingOut"} 1x20 0x60`,
	}, 40 * time.Minute, nil},

	{"ShardTopologyForeignMembers", "a worker run by hand with the DSN", []string{
		`shardkeeper_members{` + topo + `,state="workload"} 3x40`,
		`shardkeeper_members{` + topo + `,state="foreign"} 0x2 1x38`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest", state="foreign"}`}},
	{"ShardTopologyForeignMembers", "healthy: only the workload's pods", []string{
		`shardkeeper_members{` + topo + `,state="workload"} 3x40`,
		`shardkeeper_members{` + topo + `,state="foreign"} 0x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyUnitsUnowned", "the only worker died: its units stay unowned", []string{
		`shardkeeper_units{` + topo + `,state="unowned"} 0x4 8x36`,
		`shardkeeper_units{` + topo + `,state="flowing"} 8x4 0x36`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest", state="unowned"}`}},
	{"ShardTopologyUnitsUnowned", "a handover leaves units unowned for seconds", []string{
		`shardkeeper_units{` + topo + `,state="unowned"} 0x10 2 0x29`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyUnitsStalled", "a worker hangs while holding units", []string{
		`shardkeeper_units{` + topo + `,state="stalled"} 0x4 3x36`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest", state="stalled"}`}},
	{"ShardTopologyUnitsStalled", "healthy", []string{
		`shardkeeper_units{` + topo + `,state="stalled"} 0x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyUnitsMultiplyOwned", "two workers pull one unit", []string{
		`shardkeeper_units_multiply_owned{` + topo + `} 0x4 1x36`,
	}, 20 * time.Minute, []string{`{name="orders", namespace="ingest"}`}},
	{"ShardTopologyUnitsMultiplyOwned", "healthy", []string{
		`shardkeeper_units_multiply_owned{` + topo + `} 0x40`,
	}, 20 * time.Minute, nil},

	{"ShardTopologyRolloutStuck", "a change waits at Freeze for a worker that never acknowledges", []string{
		`shardkeeper_rollout_step_info{` + topo + `,kind="Topology",step="Freeze"} 1x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Paused"} 0x80`,
	}, 40 * time.Minute, []string{`{kind="Topology", name="orders", namespace="ingest", step="Freeze"}`}},
	{"ShardTopologyRolloutStuck", "a paused rollout waits on purpose", []string{
		`shardkeeper_rollout_step_info{` + topo + `,kind="Topology",step="Freeze"} 1x80`,
		`shardkeeper_topology_phase{` + topo + `,phase="Paused"} 1x80`,
	}, 40 * time.Minute, nil},
	{"ShardTopologyRolloutStuck", "a rollout that moves from step to step", []string{
		`shardkeeper_rollout_step_info{` + topo + `,kind="Topology",step="Freeze"} 1x20 _x60`,
		`shardkeeper_rollout_step_info{` + topo + `,kind="Topology",step="Claim"} _x20 1x40 _x20`,
	}, 40 * time.Minute, nil},

	{"ShardkeeperWorkerFenced", "a worker that cannot reach the registry", []string{
		`shardkeeper_worker_fenced{namespace="ingest",pod="orders-1"} 0x2 1x38`,
	}, 20 * time.Minute, []string{`{namespace="ingest", pod="orders-1"}`}},
	{"ShardkeeperWorkerFenced", "a fence of seconds", []string{
		`shardkeeper_worker_fenced{namespace="ingest",pod="orders-1"} 0x10 1 0x29`,
	}, 20 * time.Minute, nil},

	{"ShardkeeperWorkerTakeoversWithoutReset", "takeovers waited for ack_wait (no census)", []string{
		`shardkeeper_worker_takeovers_total{namespace="ingest",pod="orders-1",outcome="ackwait",reason="no_census"} 0x20 2x20`,
	}, 20 * time.Minute, []string{`{namespace="ingest", pod="orders-1", reason="no_census"}`}},
	{"ShardkeeperWorkerTakeoversWithoutReset", "takeovers by RESET", []string{
		`shardkeeper_worker_takeovers_total{namespace="ingest",pod="orders-1",outcome="reset",reason=""} 0x20 2x20`,
		`shardkeeper_worker_takeovers_total{namespace="ingest",pod="orders-1",outcome="ackwait",reason="no_census"} 0x40`,
	}, 20 * time.Minute, nil},

	{"ShardkeeperOperatorAbsent", "no operator scraped at all", nil, 20 * time.Minute, []string{`{job="shardkeeper-metrics"}`}},
	{"ShardkeeperOperatorAbsent", "both replicas down", []string{
		`up{job="shardkeeper-metrics",instance="10.0.0.1:8443"} 0x40`,
		`up{job="shardkeeper-metrics",instance="10.0.0.2:8443"} 0x40`,
	}, 20 * time.Minute, []string{`{job="shardkeeper-metrics"}`}},
	{"ShardkeeperOperatorAbsent", "one replica up", []string{
		`up{job="shardkeeper-metrics",instance="10.0.0.1:8443"} 1x40`,
		`up{job="shardkeeper-metrics",instance="10.0.0.2:8443"} 0x40`,
	}, 20 * time.Minute, nil},
}

// checks P7: every alert fires on the series its failure leaves, and
// stays quiet on the healthy ones.
func TestAlertsFireOnTheSeriesTheirFailureLeaves(t *testing.T) {
	groups, _ := ruleGroups(t)
	rules := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
		}
	}
	covered, quiet := map[string]bool{}, map[string]bool{}
	for _, sc := range alertScenarios {
		t.Run(sc.alert+"/"+sc.name, func(t *testing.T) {
			rule, ok := rules[sc.alert]
			if !ok {
				t.Fatalf("rules.yaml has no alert %s", sc.alert)
			}
			if sc.want != nil {
				covered[sc.alert] = true
			} else {
				quiet[sc.alert] = true
			}
			got := firing(t, rule, loadSeries(t, sc.series...), sc.until)
			if !slices.Equal(got, sc.want) {
				t.Fatalf("firing after %s: %v, want %v\nexpr: %s", sc.until, got, sc.want, rule.Expr)
			}
		})
	}
	var uncovered, unquiet []string
	for name := range rules {
		if !covered[name] {
			uncovered = append(uncovered, name)
		}
		if !quiet[name] {
			unquiet = append(unquiet, name)
		}
	}
	slices.Sort(uncovered)
	slices.Sort(unquiet)
	if len(uncovered) > 0 {
		t.Errorf("no failure scenario makes these alerts fire: %s", strings.Join(uncovered, ", "))
	}
	if len(unquiet) > 0 {
		t.Errorf("no healthy scenario keeps these alerts quiet: %s", strings.Join(unquiet, ", "))
	}
}
