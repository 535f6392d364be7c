// Package ownership is shardkeeper's ownership model in pure Go: units and
// topologies, the placement hash, sticky slots, and the plans that move a
// fleet from one topology epoch to the next or roll its pods one by one.
//
// The operator turns plans into status and registry writes, the worker SDK
// computes placement every tick, and the rollout simulator replays plans
// step by step; all three use this package so they cannot disagree.
//
// It owns what should happen and the checks that a plan keeps promises P1
// (one owner) and P2 (one unit set) of design.md. It does not own how
// anything happens: it does no I/O, reads no clock, and knows nothing of
// NATS, PostgreSQL or Kubernetes (internal/natsops, internal/poolctl and
// controllers/ do).
package ownership
