// Package controllers holds the operator's reconcilers. The ShardTopology
// reconciler reads a ShardTopology, checks its spec against the world, runs
// the rollout steps and reports what is true as status, conditions and
// events.
//
// It owns the order of steps and the status they produce. It does not own how
// NATS or PostgreSQL are spoken to (internal/natsops, internal/poolctl) nor
// the ownership model (internal/ownership).
package controllers
