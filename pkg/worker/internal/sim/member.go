package sim

import (
	"context"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Member is one process's member logic as the simulator drives it: events
// in, actions out, no IO, time passed in. The worker's core is plugged in
// through an adapter; standin.go is a small member of the simulator's own.
type Member interface {
	// Start is the process's first step.
	Start(now time.Duration) []Action
	// Step applies one event.
	Step(now time.Duration, ev Event) []Action
	// May reports whether rows of unit may be delivered or settled now
	// under tok: the permission the member publishes to its pullers.
	// Pullers call it at every row, before they record.
	May(now time.Duration, unit string, tok poolctl.Token) bool
	// Holds reports whether the row of key at stream sequence seq in
	// unit must wait for the order barrier now (issue 24). Pullers ask
	// at every row of an ordered run, after May.
	Holds(now time.Duration, unit string, seq uint64, key string) bool
	// Barrier is the order barrier Holds applies (nil: none): a holder
	// of an old unit of a change of N records its drained-to mark for it.
	Barrier() *poolctl.OrderBarrier
}

// EventKind says what an Event carries.
type EventKind int

// The events the simulator delivers to a member.
const (
	// EvTimer is a timer the member set (Timer names it).
	EvTimer EventKind = iota
	// EvReply is a registry call's outcome (Reply).
	EvReply
	// EvNATS is an UNPIN or RESET that finished (Unit, Op; Err when NATS
	// did not answer).
	EvNATS
	// EvPullerStopped says the puller of Unit stopped: it delivers and
	// settles nothing more. Withheld: it left rows neither delivered nor
	// settled.
	EvPullerStopped
	// EvPullerPrepared says the puller lifted the pin (and RESET the
	// consumer when asked) and pulls from now on.
	EvPullerPrepared
	// EvPullerFetched reports one completed pull (Rows).
	EvPullerFetched
	// EvProbe answers an ActProbe: Busy lists the probed units whose
	// consumers hold rows.
	EvProbe
)

// Event is one input of a Member.
type Event struct {
	Kind  EventKind
	Timer string
	Reply Reply
	Unit  string
	Op    Op
	Err   error
	// Req is the request an EvNATS or EvProbe answers.
	Req uint64
	// Puller names the puller a puller event is about.
	Puller                  uint64
	Rows                    int
	Withheld, DrainTimedOut bool
	Busy                    []string
}

// Op names a registry call or a NATS operation.
type Op string

// The registry calls and NATS operations members make.
const (
	OpJoin        Op = "Join"
	OpRenew       Op = "Renew"
	OpSnapshot    Op = "Snapshot"
	OpClaimMany   Op = "ClaimMany"
	OpReleaseMany Op = "ReleaseMany"
	OpConfirm     Op = "ConfirmOwned"
	OpFence       Op = "Fence"
	OpUnfence     Op = "Unfence"
	OpAckFreeze   Op = "AckFreeze"
	OpLeave       Op = "Leave"
	OpHandover    Op = "Handover"
	OpReport      Op = "ReportActivity"
	OpUnpin       Op = "UNPIN"
	OpReset       Op = "RESET"
)

// Reply is a registry call's outcome. Unknown means the member cannot
// tell whether the call committed (its request or its reply was lost, or
// it timed out); Err is then a timeout.
type Reply struct {
	ID      uint64
	Op      Op
	Value   any
	Err     error
	Unknown bool
	// Sent is when the member sent the call, on its own clock.
	Sent time.Duration
}

// ActionKind says what an Action asks for.
type ActionKind int

// The actions a member asks the simulator to perform.
const (
	// ActCall sends a registry call (Call). Its Reply comes back as an
	// EvReply with the call's ID.
	ActCall ActionKind = iota
	// ActTimer sets the named timer to fire at At (replacing an earlier
	// setting of the same name).
	ActTimer
	// ActUnpin and ActReset send UNPIN or RESET for Unit's consumer.
	ActUnpin
	ActReset
	// ActStartPuller starts pulling Unit under Token.
	ActStartPuller
	// ActStopPuller stops the puller of Unit at once: it settles nothing
	// more; EvPullerStopped follows.
	ActStopPuller
	// ActDrainPuller stops the puller's fetching and lets delivered rows
	// settle for at most Timeout, naking the rest; EvPullerStopped
	// follows.
	ActDrainPuller
	// ActProbe asks which of Units' consumers hold rows (EvProbe, Req).
	ActProbe
	// ActNote is a line for the trace (Detail).
	ActNote
	// ActExit ends the process (the member gave up).
	ActExit
)

// Action is one output of a Member.
type Action struct {
	Kind  ActionKind
	Call  Call
	Timer string
	At    time.Duration
	Unit  string
	Token poolctl.Token
	// Incarnation and TopologyEpoch are a started puller's incarnation
	// and the topology epoch its claim was decided under, for its history
	// records.
	Incarnation, TopologyEpoch int64
	// Puller names a started puller (its events carry it); Unpin and
	// Reset ask it to UNPIN and RESET the consumer before its first pull.
	Puller       uint64
	Unpin, Reset bool
	// Req tags an ActUnpin, ActReset or ActProbe's answer.
	Req     uint64
	Timeout time.Duration
	Units   []string
	Detail  string
}

// Call is one registry call: ID tags its reply, Do runs it against the
// registry at the instant the request arrives.
type Call struct {
	ID uint64
	Op Op
	Do func(ctx context.Context, r poolctl.Registry) (any, error)
}
