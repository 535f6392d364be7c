package controllers

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// Metrics the operator exports on controller-runtime's registry (served
// at the manager's /metrics). Every series carries the ShardTopology's
// namespace and name and is deleted with the object. The label scheme,
// and why the monitors set honorLabels, is in README.md (Monitoring).
//
//	shardkeeper_units{namespace,name,state}                 units of the active epoch by state: flowing, stalled, unowned (they sum to N x V)
//	shardkeeper_units_multiply_owned{namespace,name}        units pulled under two or more claim tokens at once: overlapping pull windows in the activity reports (a bug if not 0)
//	shardkeeper_units_retiring{namespace,name}              units that left the topology whose consumers still exist
//	shardkeeper_members{namespace,name,state}               live members: workload (pods of the StatefulSet), foreign (anyone else with the DSN)
//	shardkeeper_topology_phase{namespace,name,phase}        1 for the current status.phase, 0 for the others
//	shardkeeper_topology_condition{namespace,name,type,status}  1 for each condition's current status (true, false, unknown), 0 for the others
//	shardkeeper_topology_epoch{namespace,name,state}        number of the active and the target (pending) epoch
//	shardkeeper_rollout_step_info{namespace,name,kind,step} 1 for the step the current rollout is at; absent when nothing rolls
//	shardkeeper_rollout_units_moved{namespace,name}         moved units held by their new owner, of the current topology change
//	shardkeeper_rollout_units_to_move{namespace,name}       units the current topology change moves or adds
//	shardkeeper_rollout_pods_done{namespace,name}           pods of the current pod-by-pod roll that are done
//	shardkeeper_rollout_pods_total{namespace,name}          pods the roll covers
//	shardkeeper_census_server_info{namespace,name,server,version,cluster,role}  1 per server the last census saw
//	shardkeeper_census_min_version_info{namespace,name,version}  1, labelled with the lowest version the last census saw
//	shardkeeper_census_servers_below_floor{namespace,name}  servers the last census counted below the floor (unknown included)
//	shardkeeper_census_timestamp_seconds{namespace,name}    when the last census was taken (Unix seconds), 0 while none has been; its age is time() minus this
//	shardkeeper_reset_permission_allowed{namespace,name}    1 when the published verdict allows RESET-based takeover
//	shardkeeper_takeover_reset_blocked{namespace,name,reason}     1 for the reason RESET is refused now, 0 for the others
//	shardkeeper_reset_permission_denials_total{namespace,name,reason}  verdicts published that refused RESET, by reason
//	shardkeeper_reconcile_step_duration_seconds{step}       wall-clock time of each reconcile step over every topology (the status patch is step PatchStatus)
//
// Takeovers themselves happen in the workers (shardkeeper_worker_takeovers_total
// by outcome); the operator reports only what it decided: whether the
// workers may RESET, and why not.
var (
	unitsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_units",
		Help: "Units of the active topology epoch by state: flowing (owned and pulled), stalled (owned but the owner's reports are stale, or rows wait and it received none within the stall bound), unowned (no valid claim). The states sum to N x V.",
	}, []string{"namespace", "name", "state"})
	unitsMultiplyOwnedGauge = topologyGauge("shardkeeper_units_multiply_owned", "Units pulled under two or more claim tokens at once, as the workers' activity reports show (pull windows under different tokens that overlap by more than the query bound plus 1s; a handover's never do); anything but 0 is a bug.")
	unitsRetiringGauge      = topologyGauge("shardkeeper_units_retiring", "Units that left the topology whose consumers are not retired yet (kept until drained).")
	podsDoneGauge           = topologyGauge("shardkeeper_rollout_pods_done", "Pods of the current pod-by-pod roll that are done.")
	podsTotalGauge          = topologyGauge("shardkeeper_rollout_pods_total", "Pods the current pod-by-pod roll covers.")
	unitsMovedGauge         = topologyGauge("shardkeeper_rollout_units_moved", "Units the current topology change moved that are held by their new owner.")
	unitsToMoveGauge        = topologyGauge("shardkeeper_rollout_units_to_move", "Units the current topology change moves or adds.")
	censusBelowFloorGauge   = topologyGauge("shardkeeper_census_servers_below_floor", "Servers the last census counted below the version floor, unknown ones included.")
	censusTimestampGauge    = topologyGauge("shardkeeper_census_timestamp_seconds", "When the last census of NATS server versions was taken (its first reply), in Unix seconds; 0 while none has succeeded.")
	membersGauge            = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_members",
		Help: "Live members of the topology's registry: state workload for pods of the workload StatefulSet, foreign for anyone else who joined with the DSN (status.members).",
	}, []string{"namespace", "name", "state"})
	resetAllowedGauge = topologyGauge("shardkeeper_reset_permission_allowed", "1 when the RESET permission published for the workers allows RESET-based takeover.")

	phaseGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_topology_phase",
		Help: "1 for the ShardTopology's current phase, 0 for the others.",
	}, []string{"namespace", "name", "phase"})
	conditionGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_topology_condition",
		Help: "1 for the current status (true, false, unknown) of each of the ShardTopology's conditions, 0 for the other two.",
	}, []string{"namespace", "name", "type", "status"})
	epochGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_topology_epoch",
		Help: "Number of the active and of the target (pending) topology epoch; the target is absent when nothing rolls.",
	}, []string{"namespace", "name", "state"})
	rolloutStepGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_rollout_step_info",
		Help: "Always 1; kind and step say where the current rollout stands (status.rollout). Absent when nothing rolls.",
	}, []string{"namespace", "name", "kind", "step"})
	censusServerGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_census_server_info",
		Help: "Always 1; one series per NATS server the last census saw, labelled with its version, cluster and role (status.census.servers).",
	}, []string{"namespace", "name", "server", "version", "cluster", "role"})
	censusMinVersionGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_census_min_version_info",
		Help: "Always 1; the version label is the lowest NATS server version the last census saw (unknown if any server that matters did not answer).",
	}, []string{"namespace", "name", "version"})
	resetBlockedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardkeeper_takeover_reset_blocked",
		Help: "1 for the reason the operator currently refuses RESET-based takeover (takeovers then wait for ack_wait), 0 for the others.",
	}, []string{"namespace", "name", "reason"})
	strandedRowsGauge = topologyGauge("shardkeeper_topology_stranded_rows",
		"Rows the topology's streams hold where no unit consumer will deliver them (status.strandedRows), as of the operator's last check.")
	resetDenialsCounter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardkeeper_reset_permission_denials_total",
		Help: "RESET permissions published that refused RESET-based takeover, by reason.",
	}, []string{"namespace", "name", "reason"})
	// reconcileStepSeconds splits controller-runtime's reconcile time by
	// step, so a slow reconcile says where it waited (issue 23). Not per
	// topology: the series would grow with the topologies.
	reconcileStepSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "shardkeeper_reconcile_step_duration_seconds",
		Help:    "Wall-clock time of each step of a ShardTopology reconcile, over every topology; the status patch that ends a reconcile is step PatchStatus.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .2, .5, 1, 2.5, 5, 10, 30},
	}, []string{"step"})
)

// stepPatchStatus is the step label of the status patch that ends a reconcile.
const stepPatchStatus = "PatchStatus"

// Unit states, the values of shardkeeper_units' state label.
const (
	unitStateFlowing = "flowing"
	unitStateStalled = "stalled"
	unitStateUnowned = "unowned"
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
	topologyv1.PhasePending, topologyv1.PhaseProvisioning, topologyv1.PhaseAwaitingApproval, topologyv1.PhaseRollingOut,
	topologyv1.PhaseReady, topologyv1.PhasePaused, topologyv1.PhaseStalled, topologyv1.PhaseDeleting,
}

// gaugeVecs are every per-topology gauge, for forgetMetrics.
var gaugeVecs = []*prometheus.GaugeVec{
	unitsGauge, unitsMultiplyOwnedGauge, unitsRetiringGauge, podsDoneGauge, podsTotalGauge, unitsMovedGauge, unitsToMoveGauge,
	censusBelowFloorGauge, censusTimestampGauge, resetAllowedGauge, membersGauge, phaseGauge, conditionGauge, epochGauge, rolloutStepGauge,
	censusServerGauge, censusMinVersionGauge, resetBlockedGauge, strandedRowsGauge,
}

// Collectors returns every collector the operator registers, so a test can
// check dashboards and alerts against the names it really exports.
func Collectors() []prometheus.Collector {
	cs := []prometheus.Collector{resetDenialsCounter, reconcileStepSeconds}
	for _, g := range gaugeVecs {
		cs = append(cs, g)
	}
	return cs
}

func init() {
	metrics.Registry.MustRegister(Collectors()...)
}

func topologyGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"namespace", "name"})
}

// recordStatusMetrics sets the status-derived series from the status just
// written, so metrics and status always tell the same story.
func recordStatusMetrics(key types.NamespacedName, st *topologyv1.ShardTopologyStatus) {
	ns, name := key.Namespace, key.Name
	topo := prometheus.Labels{"namespace": ns, "name": name}
	for _, p := range allPhases {
		phaseGauge.WithLabelValues(ns, name, string(p)).Set(boolValue(st.Phase == p))
	}
	for _, c := range st.Conditions {
		for _, s := range []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown} {
			conditionGauge.WithLabelValues(ns, name, c.Type, strings.ToLower(string(s))).Set(boolValue(c.Status == s))
		}
	}
	if u := st.Units; u != nil {
		unitsGauge.WithLabelValues(ns, name, unitStateFlowing).Set(float64(u.Owned - u.Stalled))
		unitsGauge.WithLabelValues(ns, name, unitStateStalled).Set(float64(u.Stalled))
		unitsGauge.WithLabelValues(ns, name, unitStateUnowned).Set(float64(u.Unowned))
		unitsMultiplyOwnedGauge.WithLabelValues(ns, name).Set(float64(u.MultiplyOwned))
		unitsRetiringGauge.WithLabelValues(ns, name).Set(float64(u.Retiring))
	} else {
		// Unknown (the registry was not read, or no epoch is active):
		// absent, not the last reading's counts.
		unitsGauge.DeletePartialMatch(topo)
		unitsMultiplyOwnedGauge.DeletePartialMatch(topo)
		unitsRetiringGauge.DeletePartialMatch(topo)
	}
	if m := st.Members; m != nil {
		membersGauge.WithLabelValues(ns, name, "workload").Set(float64(m.Live - m.Foreign))
		membersGauge.WithLabelValues(ns, name, "foreign").Set(float64(m.Foreign))
	}
	var done, total, moved, toMove int32
	rolloutStepGauge.DeletePartialMatch(topo)
	if r := st.Rollout; r != nil {
		rolloutStepGauge.WithLabelValues(ns, name, r.Kind, r.Step).Set(1)
		if r.Kind == topologyv1.RolloutKindPods {
			done, total = r.PodsDone, r.PodsTotal
		} else {
			moved, toMove = r.UnitsMoved, r.UnitsToMove
		}
	}
	podsDoneGauge.WithLabelValues(ns, name).Set(float64(done))
	podsTotalGauge.WithLabelValues(ns, name).Set(float64(total))
	unitsMovedGauge.WithLabelValues(ns, name).Set(float64(moved))
	unitsToMoveGauge.WithLabelValues(ns, name).Set(float64(toMove))
	if st.ActiveEpoch != nil {
		epochGauge.WithLabelValues(ns, name, "active").Set(float64(st.ActiveEpoch.Number))
	}
	if st.TargetEpoch != nil {
		epochGauge.WithLabelValues(ns, name, "target").Set(float64(st.TargetEpoch.Number))
	} else {
		epochGauge.DeleteLabelValues(ns, name, "target")
	}
	if st.Census == nil || st.Census.ObservedAt == nil {
		// No census ever succeeded (no or wrong system credentials, or
		// none taken yet): the epoch, so its age is now and
		// ShardTopologyCensusStale fires; an absent series matched no
		// alert.
		censusTimestampGauge.WithLabelValues(ns, name).Set(0)
	}
	if sr := st.StrandedRows; sr != nil {
		strandedRowsGauge.WithLabelValues(ns, name).Set(float64(sr.Rows))
	}
	if c := st.Census; c != nil && c.MinVersion != "" {
		censusMinVersionGauge.DeletePartialMatch(topo)
		censusMinVersionGauge.WithLabelValues(ns, name, c.MinVersion).Set(1)
		censusServerGauge.DeletePartialMatch(topo)
		for _, s := range c.Servers {
			censusServerGauge.WithLabelValues(ns, name, s.Name, s.Version, s.Cluster, s.Role).Set(1)
		}
		censusBelowFloorGauge.WithLabelValues(ns, name).Set(float64(len(c.BelowFloor)))
		if c.ObservedAt != nil {
			censusTimestampGauge.WithLabelValues(ns, name).Set(float64(c.ObservedAt.Unix()))
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
	for _, v := range gaugeVecs {
		v.DeletePartialMatch(labels)
	}
	resetDenialsCounter.DeletePartialMatch(labels)
}
