package controllers

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// Metrics the operator exports on controller-runtime's registry (served
// at the manager's /metrics). Every series carries the ShardTopology's
// namespace and name and is deleted with the object.
//
//	shardkeeper_units_owned{namespace,name}                 units of the active epoch with a valid claim
//	shardkeeper_units_unowned{namespace,name}               units of the active epoch without one
//	shardkeeper_units_multiply_owned{namespace,name}        units two or more members pulled at once, from their activity reports (a bug if not 0)
//	shardkeeper_units_stalled{namespace,name}               owned units that do not flow (activity report stale or missing, or rows pending and none received)
//	shardkeeper_units_retiring{namespace,name}              units that left the topology whose consumers still exist
//	shardkeeper_rollout_phase{namespace,name,phase}         1 for the current status.phase, 0 for the others
//	shardkeeper_rollout_pods_done{namespace,name}           pods of the current pod-by-pod roll that are done
//	shardkeeper_rollout_pods_total{namespace,name}          pods the roll covers
//	shardkeeper_topology_epoch{namespace,name,state}        number of the active and the target (pending) epoch
//	shardkeeper_census_min_version_info{namespace,name,version}  1, labelled with the lowest version the last census saw
//	shardkeeper_census_servers_below_floor{namespace,name}  servers the last census counted below the floor (unknown included)
//	shardkeeper_census_age_seconds{namespace,name}          age of the last census, computed at scrape time
//	shardkeeper_reset_permission_allowed{namespace,name}    1 when the published verdict allows RESET-based takeover
//	shardkeeper_takeover_reset_blocked{namespace,name,reason}     1 for the reason RESET is refused now, 0 for the others
//	shardkeeper_reset_permission_denials_total{namespace,name,reason}  verdicts published that refused RESET, by reason
//
// Takeovers themselves happen in the workers (shardkeeper_worker_takeovers_total
// by outcome); the operator reports only what it decided: whether the
// workers may RESET, and why not.
var (
	unitsOwnedGauge         = topologyGauge("shardkeeper_units_owned", "Units of the active topology epoch with exactly one valid claim.")
	unitsUnownedGauge       = topologyGauge("shardkeeper_units_unowned", "Units of the active topology epoch without a valid claim.")
	unitsMultiplyOwnedGauge = topologyGauge("shardkeeper_units_multiply_owned", "Units pulled by two or more members at once, as their activity reports show (fresh reports of pulls within two renew intervals); anything but 0 is a bug.")
	unitsStalledGauge       = topologyGauge("shardkeeper_units_stalled", "Owned units of the active epoch that do not flow: the owner's activity report is stale or missing, or rows wait in the unit's consumer and the owner received none within the stall bound.")
	unitsRetiringGauge      = topologyGauge("shardkeeper_units_retiring", "Units that left the topology whose consumers are not retired yet (kept until drained).")
	podsDoneGauge           = topologyGauge("shardkeeper_rollout_pods_done", "Pods of the current pod-by-pod roll that are done.")
	podsTotalGauge          = topologyGauge("shardkeeper_rollout_pods_total", "Pods the current pod-by-pod roll covers.")
	censusBelowFloorGauge   = topologyGauge("shardkeeper_census_servers_below_floor", "Servers the last census counted below the version floor, unknown ones included.")
	resetAllowedGauge       = topologyGauge("shardkeeper_reset_permission_allowed", "1 when the RESET permission published for the workers allows RESET-based takeover.")

	rolloutPhaseGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_rollout_phase",
		Help: "1 for the ShardTopology's current phase, 0 for the others.",
	}, []string{"namespace", "name", "phase"})
	epochGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_topology_epoch",
		Help: "Number of the active and of the target (pending) topology epoch; the target is absent when nothing rolls.",
	}, []string{"namespace", "name", "state"})
	censusMinVersionGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_census_min_version_info",
		Help: "Always 1; the version label is the lowest NATS server version the last census saw (unknown if any server that matters did not answer).",
	}, []string{"namespace", "name", "version"})
	resetBlockedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_takeover_reset_blocked",
		Help: "1 for the reason the operator currently refuses RESET-based takeover (takeovers then wait for ack_wait), 0 for the others.",
	}, []string{"namespace", "name", "reason"})
	resetDenialsCounter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardkeeper_reset_permission_denials_total",
		Help: "RESET permissions published that refused RESET-based takeover, by reason.",
	}, []string{"namespace", "name", "reason"})

	censusAge = &censusAgeCollector{takenAt: map[types.NamespacedName]time.Time{}}
)

// Reasons RESET is refused, as metric labels.
const (
	resetBlockedNoSystemCredentials = "no_system_credentials"
	resetBlockedCensusFailed        = "census_failed"
	resetBlockedBelowFloor          = "below_floor"
	resetBlockedConsumerNotCovered  = "consumer_not_covered"
)

var resetBlockedReasons = []string{resetBlockedNoSystemCredentials, resetBlockedCensusFailed, resetBlockedBelowFloor, resetBlockedConsumerNotCovered}

var allPhases = []topologyv1.Phase{
	topologyv1.PhasePending, topologyv1.PhaseProvisioning, topologyv1.PhaseRollingOut, topologyv1.PhaseReady,
	topologyv1.PhasePaused, topologyv1.PhaseStalled, topologyv1.PhaseDeleting,
}

func init() {
	metrics.Registry.MustRegister(
		unitsOwnedGauge, unitsUnownedGauge, unitsMultiplyOwnedGauge, unitsStalledGauge, unitsRetiringGauge,
		podsDoneGauge, podsTotalGauge, censusBelowFloorGauge, resetAllowedGauge,
		rolloutPhaseGauge, epochGauge, censusMinVersionGauge, resetBlockedGauge, resetDenialsCounter,
		censusAge,
	)
}

func topologyGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"namespace", "name"})
}

// recordStatusMetrics sets the status-derived series from the status just
// written, so metrics and status always tell the same story.
func recordStatusMetrics(key types.NamespacedName, st *topologyv1.ShardTopologyStatus) {
	ns, name := key.Namespace, key.Name
	for _, p := range allPhases {
		v := 0.0
		if st.Phase == p {
			v = 1
		}
		rolloutPhaseGauge.WithLabelValues(ns, name, string(p)).Set(v)
	}
	if u := st.Units; u != nil {
		unitsOwnedGauge.WithLabelValues(ns, name).Set(float64(u.Owned))
		unitsUnownedGauge.WithLabelValues(ns, name).Set(float64(u.Unowned))
		unitsMultiplyOwnedGauge.WithLabelValues(ns, name).Set(float64(u.MultiplyOwned))
		unitsStalledGauge.WithLabelValues(ns, name).Set(float64(u.Stalled))
		unitsRetiringGauge.WithLabelValues(ns, name).Set(float64(u.Retiring))
	}
	var done, total int32
	if r := st.Rollout; r != nil && r.Kind == topologyv1.RolloutKindPods {
		done, total = r.PodsDone, r.PodsTotal
	}
	podsDoneGauge.WithLabelValues(ns, name).Set(float64(done))
	podsTotalGauge.WithLabelValues(ns, name).Set(float64(total))
	if st.ActiveEpoch != nil {
		epochGauge.WithLabelValues(ns, name, "active").Set(float64(st.ActiveEpoch.Number))
	}
	if st.TargetEpoch != nil {
		epochGauge.WithLabelValues(ns, name, "target").Set(float64(st.TargetEpoch.Number))
	} else {
		epochGauge.DeleteLabelValues(ns, name, "target")
	}
	if c := st.Census; c != nil && c.MinVersion != "" {
		censusMinVersionGauge.DeletePartialMatch(prometheus.Labels{"namespace": ns, "name": name})
		censusMinVersionGauge.WithLabelValues(ns, name, c.MinVersion).Set(1)
		censusBelowFloorGauge.WithLabelValues(ns, name).Set(float64(len(c.BelowFloor)))
		if c.ObservedAt != nil {
			censusAge.set(key, c.ObservedAt.Time)
		}
	}
}

// recordResetVerdict sets the RESET-permission series after a verdict was
// published; blockedBy is "" when RESET is allowed.
func recordResetVerdict(key types.NamespacedName, blockedBy string) {
	ns, name := key.Namespace, key.Name
	allowed := 0.0
	if blockedBy == "" {
		allowed = 1
	} else {
		resetDenialsCounter.WithLabelValues(ns, name, blockedBy).Inc()
	}
	resetAllowedGauge.WithLabelValues(ns, name).Set(allowed)
	for _, r := range resetBlockedReasons {
		v := 0.0
		if r == blockedBy {
			v = 1
		}
		resetBlockedGauge.WithLabelValues(ns, name, r).Set(v)
	}
}

// forgetMetrics deletes every series of a topology that is gone.
func forgetMetrics(key types.NamespacedName) {
	labels := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	for _, v := range []*prometheus.GaugeVec{
		unitsOwnedGauge, unitsUnownedGauge, unitsMultiplyOwnedGauge, unitsStalledGauge, unitsRetiringGauge, podsDoneGauge, podsTotalGauge,
		censusBelowFloorGauge, resetAllowedGauge, rolloutPhaseGauge, epochGauge, censusMinVersionGauge, resetBlockedGauge,
	} {
		v.DeletePartialMatch(labels)
	}
	resetDenialsCounter.DeletePartialMatch(labels)
	censusAge.forget(key)
}

// censusAgeCollector exports each topology's census age as of the scrape,
// so the series does not freeze between reconciles.
type censusAgeCollector struct {
	mu      sync.Mutex
	takenAt map[types.NamespacedName]time.Time
}

var censusAgeDesc = prometheus.NewDesc("shardkeeper_census_age_seconds",
	"Seconds since the last census of NATS server versions was taken, as of the scrape.", []string{"namespace", "name"}, nil)

func (c *censusAgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- censusAgeDesc }

func (c *censusAgeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for k, t := range c.takenAt {
		ch <- prometheus.MustNewConstMetric(censusAgeDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), k.Namespace, k.Name)
	}
}

func (c *censusAgeCollector) set(key types.NamespacedName, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.takenAt[key] = t
}

func (c *censusAgeCollector) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.takenAt, key)
}
