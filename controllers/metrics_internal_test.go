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
