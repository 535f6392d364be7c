// Package controllers holds the operator's reconcilers. The ShardTopology
// reconciler reads a ShardTopology, checks its spec against the world, runs
// the rollouts of design.md section 8 (a topology change from epoch e to
// e+1, and pod-by-pod rolls of the workload), takes the version census and
// publishes its RESET verdict, and reports what is true as status,
// conditions, events and metrics (P7).
//
// One file per concern:
//
//   - shardtopology_controller.go: the entry point, the finalizer, the
//     status patch (optimistic lock, events on condition transitions);
//   - shardtopology_phases.go: the scope and the list of steps, which all
//     share one signature;
//   - shardtopology_rollout.go: the topology change as a table of
//     (state, condition) -> action;
//   - shardtopology_roll.go: the pod-by-pod roll;
//   - shardtopology_census.go: the census and the RESET verdict (with the
//     floor and every server's version, for the workers' GuardedReset);
//   - census_runs.go: censuses running off the reconcile path, each at
//     its topology's slot, and which finished one may be published;
//   - shardtopology_flow.go: whether owned units flow, judged from the
//     workers' activity reports and the census's pending rows (stalled and
//     multiply-owned units);
//   - shardtopology_history.go: pruning the registry's history;
//   - shardtopology_finalizer.go: what deletion retires and what it keeps;
//   - shardtopology_status.go: pure status functions;
//   - registry_bound.go: the deadline every registry call carries;
//   - connections.go: the per-topology cache of registry pools and NATS
//     connections;
//   - metrics.go: the Prometheus series.
//
// Every step derives its state from the registry, the cluster and status
// afresh each reconcile, so an operator restart resumes at any step. What
// the operator remembers between reconciles (Connections) only saves work:
// when a provisioning, a census or a prune was last done.
//
// It owns the order of steps and the status they produce. It does not own how
// NATS or PostgreSQL are spoken to (internal/natsops, internal/poolctl) nor
// the ownership model (internal/ownership).
package controllers
