package controllers

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// A census that cannot be taken leaves the series the alerts match
// (config/prometheus/alerts_eval_test.go): VersionFloorMet false, and a
// census timestamp of 0. With wrong system credentials the condition was
// Unknown and the timestamp absent, so neither ShardTopologyVersionFloorNotMet
// nor ShardTopologyCensusStale could fire.
//
// checks P7
func TestAFailedCensusLeavesTheSeriesItsAlertsMatch(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		census *censusReport
	}{
		{"wrong system credentials", &censusReport{failed: "connect with spec.nats.systemCredentialsSecretRef: nats: Authorization Violation"}},
		{"no system credentials", &censusReport{noSystemCredentials: true}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := types.NamespacedName{Namespace: "metrics-test", Name: tt.name}
			defer forgetMetrics(key)
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Generation: 1}}
			st := computeStatus(topo, observation{census: tt.census, registry: registryWith(1, 1, 1, 1, nil)}, now.Add(time.Duration(i)))
			recordStatusMetrics(key, &st)
			if v := testutil.ToFloat64(conditionGauge.WithLabelValues(key.Namespace, key.Name, topologyv1.ConditionVersionFloorMet, "false")); v != 1 {
				t.Errorf("shardkeeper_topology_condition{type=VersionFloorMet,status=false} = %v, want 1", v)
			}
			v, ok := seriesValue(t, censusTimestampGauge, key)
			if !ok || v != 0 {
				t.Errorf("shardkeeper_census_timestamp_seconds = %v (present: %v), want 0 (no census ever succeeded)", v, ok)
			}
		})
	}
}

// seriesValue reads the topology's series of a per-topology gauge without
// creating it, and says whether it exists.
func seriesValue(t *testing.T, g *prometheus.GaugeVec, key types.NamespacedName) (float64, bool) {
	t.Helper()
	ch := make(chan prometheus.Metric, 256)
	go func() { g.Collect(ch); close(ch) }()
	var v float64
	found := false
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, l := range d.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if got["namespace"] == key.Namespace && got["name"] == key.Name {
			v, found = d.GetGauge().GetValue(), true
		}
	}
	return v, found
}

// Which member names are pods of the workload: <statefulSet>-<ordinal>
// within the replicas (spec or status, whichever is larger), from
// spec.ordinals.start.
func TestWorkloadPodsAreTheStatefulSetsOrdinals(t *testing.T) {
	w := &workloadPods{name: "ingest", start: 0, replicas: 3}
	shifted := &workloadPods{name: "ingest", start: 5, replicas: 2}
	tests := []struct {
		w      *workloadPods
		member string
		want   bool
	}{
		{w, "ingest-0", true},
		{w, "ingest-2", true},
		{w, "ingest-3", false},
		{w, "ingest-01", false},
		{w, "ingest-x", false},
		{w, "ingest-", false},
		{w, "ingest-canary-0", false},
		{w, "laptop-debug", false},
		{w, "other-0", false},
		{shifted, "ingest-5", true},
		{shifted, "ingest-6", true},
		{shifted, "ingest-0", false},
	}
	for _, tt := range tests {
		if got := tt.w.isPod(tt.member); got != tt.want {
			t.Errorf("%+v isPod(%q) = %v, want %v", *tt.w, tt.member, got, tt.want)
		}
	}
}
