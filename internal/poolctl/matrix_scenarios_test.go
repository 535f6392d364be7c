package poolctl

import (
	"strings"
	"time"
)

// This file is the fault matrix's data: scenarios as lists of steps, the
// fault kinds and the continuations. matrix_test.go runs them.

// opKind is what a step does. Durable kinds call the registry and may have
// a fault injected; the others only move the world.
type opKind string

const (
	opJoin          opKind = "join"
	opRenew         opKind = "renew"
	opLeave         opKind = "leave"
	opFence         opKind = "fence"
	opUnfence       opKind = "unfence"
	opClaim         opKind = "claim"
	opHandover      opKind = "handover"
	opRelease       opKind = "release"
	opConfirm       opKind = "confirm"
	opCheckpoint    opKind = "checkpoint"
	opCreatePending opKind = "create-pending"
	opAck           opKind = "ack-freeze"
	opActivate      opKind = "activate"
	opLateFence     opKind = "late-fence"
	opClaimMany     opKind = "claim-many"
	opReleaseMany   opKind = "release-many"
	opSetRetiring   opKind = "set-retiring"

	opAdvance opKind = "advance" // time passes; members not stalled renew
	opStall   opKind = "stall"   // the actor is cut off from the registry but keeps running
	opWake    opKind = "wake"    // the stall ends
	opRestart opKind = "restart" // the actor's process restarts, forgetting everything
)

func (k opKind) durable() bool {
	switch k {
	case opAdvance, opStall, opWake, opRestart:
		return false
	}
	return true
}

// step is one scenario step by one actor ("a", "b" or the operator "op").
type step struct {
	actor string
	op    opKind
	unit  string
	units []string      // batches and the retiring set
	to    string        // handover target
	d     time.Duration // advance
	shape [2]int        // create-pending
}

func (s step) String() string {
	out := s.actor + ":" + string(s.op)
	if s.unit != "" {
		out += " " + s.unit
	}
	if len(s.units) > 0 {
		out += " " + strings.Join(s.units, ",")
	}
	if s.op == opHandover {
		out += "->" + s.to
	}
	return out
}

// scenario is a named list of steps over an initial topology shape.
type scenario struct {
	name  string
	shape [2]int
	steps []step
}

func join(a string) step            { return step{actor: a, op: opJoin} }
func renew(a string) step           { return step{actor: a, op: opRenew} }
func leave(a string) step           { return step{actor: a, op: opLeave} }
func fence(a string) step           { return step{actor: a, op: opFence} }
func unfence(a string) step         { return step{actor: a, op: opUnfence} }
func claim(a, u string) step        { return step{actor: a, op: opClaim, unit: u} }
func handover(a, u, to string) step { return step{actor: a, op: opHandover, unit: u, to: to} }
func release(a, u string) step      { return step{actor: a, op: opRelease, unit: u} }
func confirm(a string) step         { return step{actor: a, op: opConfirm} }
func checkpoint(a, u string) step   { return step{actor: a, op: opCheckpoint, unit: u} }
func createPending(n, v int) step   { return step{actor: "op", op: opCreatePending, shape: [2]int{n, v}} }
func ackFreeze(a string) step       { return step{actor: a, op: opAck} }
func activate() step                { return step{actor: "op", op: opActivate} }
func advance(d time.Duration) step  { return step{op: opAdvance, d: d} }
func stall(a string) step           { return step{actor: a, op: opStall} }
func wake(a string) step            { return step{actor: a, op: opWake} }
func restartProcess(a string) step  { return step{actor: a, op: opRestart} }
func lateFence(a string) step       { return step{actor: a, op: opLateFence} }
func claimMany(a string, units ...string) step {
	return step{actor: a, op: opClaimMany, units: units}
}
func releaseMany(a string, units ...string) step {
	return step{actor: a, op: opReleaseMany, units: units}
}
func setRetiring(units ...string) step { return step{actor: "op", op: opSetRetiring, units: units} }

// matrixScenarios are the seven scenarios, and four for the
// registry's later defects: batches, the retiring set, a crash-restart
// under the same name, and a late Fence (in fence-lift). Times are against
// matrixParams: a 60s lease renewed every 20s, a 30s grace.
var matrixScenarios = []scenario{
	{name: "claim", shape: [2]int{1, 4}, steps: []step{
		join("a"), claim("a", "0.0"), claim("a", "0.1"), checkpoint("a", "0.0"), renew("a"),
	}},
	{name: "renew", shape: [2]int{1, 4}, steps: []step{
		join("a"), claim("a", "0.0"), advance(15 * time.Second), renew("a"),
		advance(15 * time.Second), renew("a"), advance(15 * time.Second), renew("a"), checkpoint("a", "0.0"),
	}},
	{name: "handover", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claim("a", "0.0"), claim("a", "0.1"), handover("a", "0.0", "b"), claim("b", "0.0"),
		handover("a", "0.1", ""), release("a", "0.1"), claim("b", "0.1"), leave("a"),
	}},
	{name: "takeover", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claim("a", "0.0"), claim("a", "0.1"), stall("a"), advance(100 * time.Second),
		claim("b", "0.0"), claim("b", "0.1"), wake("a"), join("a"), confirm("a"), checkpoint("b", "0.0"),
	}},
	{name: "fence-lift", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claim("a", "0.0"), claim("b", "0.1"), fence("b"), stall("a"),
		advance(100 * time.Second), claim("b", "0.0"), unfence("b"), lateFence("b"), claim("b", "0.0"), confirm("b"),
		advance(40 * time.Second), claim("b", "0.0"), wake("a"), join("a"), confirm("a"),
	}},
	{name: "topology-change", shape: [2]int{1, 2}, steps: []step{
		join("a"), join("b"), claim("a", "0.0"), claim("b", "0.1"), createPending(1, 4), ackFreeze("a"),
		ackFreeze("b"), activate(), claim("a", "0.2"), claim("b", "0.3"),
	}},
	{name: "restart-mid-handover", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claim("a", "0.0"), claim("a", "0.1"), handover("a", "0.0", "b"), restartProcess("a"),
		join("a"), confirm("a"), claim("b", "0.0"), advance(100 * time.Second), release("a", "0.1"), claim("b", "0.1"),
	}},
	{name: "batch", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claimMany("a", "0.0", "0.1", "0.2"), checkpoint("a", "0.0"), handover("a", "0.1", "b"),
		claimMany("b", "0.1", "0.2", "0.3"), releaseMany("a", "0.0", "0.2"), claimMany("b", "0.0", "0.2"),
	}},
	{name: "shrink-retiring", shape: [2]int{1, 4}, steps: []step{
		join("a"), join("b"), claim("a", "0.3"), claim("a", "0.1"), createPending(1, 2), ackFreeze("a"), ackFreeze("b"),
		activate(), setRetiring("0.3"), stall("a"), advance(100 * time.Second), claimMany("b", "0.1", "0.3"),
		wake("a"), join("a"), confirm("a"),
	}},
	{name: "crash-restart", shape: [2]int{1, 4}, steps: []step{
		join("a"), claim("a", "0.0"), claim("a", "0.1"), restartProcess("a"), join("a"), confirm("a"), claim("a", "0.0"),
		advance(100 * time.Second), claim("a", "0.0"), claimMany("a", "0.1", "0.2"),
	}},
}

// faultKind is what goes wrong at the faulted step.
type faultKind string

const (
	faultStatement faultKind = "statement-error"   // the call fails; nothing happens
	faultReplyLost faultKind = "reply-lost"        // the call commits; the caller sees an error
	faultConnCut   faultKind = "connection-cut"    // the caller's connections are cut and refused
	faultCrash     faultKind = "process-crash"     // the call commits; the caller's process dies
	faultClockJump faultKind = "caller-clock-jump" // the caller's clock jumps a lease ahead
	// Wire-level faults, through the proxy (simulated on the twin): the
	// connection is cut at the call's first reply (a multi-round-trip
	// transaction rolls back, a single statement has committed), or the
	// reply that ends the call's transaction is lost after the commit.
	faultWireCut  faultKind = "wire-cut-mid-statement"
	faultWireLost faultKind = "wire-reply-lost"
)

var matrixFaults = []faultKind{faultStatement, faultReplyLost, faultConnCut, faultCrash, faultClockJump,
	faultWireCut, faultWireLost}

// continuation is what happens after the fault.
type continuation string

const (
	contHeal    continuation = "heal"        // the fault clears; the caller retries
	contLapse   continuation = "lease-lapse" // the caller is cut off past its lease and grace; another member adopts
	contRestart continuation = "restart"     // the caller's process restarts and rebuilds from the registry
	contRelease continuation = "release"     // the caller recovers and releases everything
)

var matrixContinuations = []continuation{contHeal, contLapse, contRestart, contRelease}

// matrixParams: a 60s lease, renewed every 20s, queries bounded at 10s,
// a 30s grace; workers fence themselves 5s before their deadline.
var (
	matrixParams = Params{LeaseTTL: 60 * time.Second, RenewInterval: 20 * time.Second, QueryBound: 10 * time.Second, Grace: 30 * time.Second}
	fenceMargin  = 5 * time.Second
	tickChunk    = 20 * time.Second
)
