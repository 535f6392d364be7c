// Package sim is the deterministic simulator of a shardkeeper fleet's
// members (issue 20, design.md section 9): virtual time, one seed that
// decides every choice, the registry's in-memory twin (internal/poolctl),
// a model of one pinned JetStream pull consumer per unit, a publisher, a
// sink guarded by the claim's token, and faults (lost requests and
// replies, delayed and reordered replies, registry outages and clock
// steps, paused, crashed and partitioned processes, two processes under
// one pod name). Each run is judged by internal/historycheck on the
// delivery histories the members record, by a P5 invariant read from the
// twin's history, and by liveness after the last fault.
//
// The package owns the world around the members: scheduler, transport,
// consumers, sink, faults, judging and shrinking. It does not own the
// member's logic: a Member is plugged in (the worker's core, or the
// stand-in of standin.go), and the simulator only delivers its events and
// performs its actions.
package sim
