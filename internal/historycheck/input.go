package historycheck

import (
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// ClaimEvent is one entry of the registry's append-only claim history: the
// state of one unit's claim row from At on.
type ClaimEvent struct {
	Unit        string
	Owner       string // "" when free
	Incarnation int64
	Epoch       int64  // fencing epoch
	State       string // "held", "handover", "free"
	// Under is the topology epoch a claim or adopt was decided under; 0 for
	// other ops.
	Under int64
	// Op is "claim", "adopt", "rehome", "release", "handover", "settle" ...;
	// only "claim" and "adopt" are decisions P2 judges.
	Op string
	At time.Time // registry wall clock
}

// Claim states that make a claim's token valid.
const (
	StateHeld     = "held"
	StateHandover = "handover"
	StateFree     = "free"
)

// Claim ops that decide ownership under a topology epoch (P2).
const (
	OpClaim = "claim"
	OpAdopt = "adopt"
)

// LeaseEvent is one join, renewal or leave of a member's lease, or a
// change of its fence: the member's lease and fence from At on.
type LeaseEvent struct {
	Member      string
	Incarnation int64
	At          time.Time
	ExpiresAt   time.Time
	Left        bool
	// Fenced says the member's fence was up; FenceLiftedAt is when it last
	// lifted (zero if never), on the same wall clock as At. P5 judges
	// adoptions by them.
	Fenced        bool
	FenceLiftedAt time.Time
}

// ExpectedProcess is one process the harness started (each incarnation of
// a pod is one), whose history must be in Input.Processes.
type ExpectedProcess struct {
	Member string
	// PID is the process's id as its history file names it
	// ("<member>-<pid>-<mono>"); 0 when the harness cannot know it (a
	// container's own pid namespace): then any history of Member not
	// claimed by another expected process matches.
	PID int
	// Abrupt says the process was killed (or still running when the
	// evidence was read), so its history may end in one partial record.
	Abrupt bool
}

// EpochSpan is one topology epoch's shape and active interval.
type EpochSpan struct {
	Number             int64
	Partitions, Shards int
	ActivatedAt        time.Time // zero: never active
	RetiredAt          time.Time // zero: still active
}

// SinkWrite is one write the sink took.
type SinkWrite struct {
	RowID, Unit, Member string
	Epoch               int64
	At                  time.Time // registry/sink wall clock at insert
}

// KeyedRow is a row's key and its place among the key's rows, as the
// publisher sent them: Seq is 1 for the key's first row, 2 for the next,
// and so on (a failed publish may leave a gap).
type KeyedRow struct {
	Key string
	Seq int64
}

// Ordering is the per-key order a run promises, as the ShardTopology's
// spec.rollout.ordering names it.
type Ordering string

const (
	// OrderingNone promises no order across a change of N or V (today's
	// behaviour): the per-key order check reports its count as
	// information. The empty Ordering means the same.
	OrderingNone Ordering = "None"
	// OrderingPerKey promises every key's rows in order across a change:
	// one cross-unit inversion fails the run.
	OrderingPerKey Ordering = "PerKey"
)

// Input is all the evidence of one run.
type Input struct {
	Processes []history.Process
	// Expected lists every process the harness started. Each must have a
	// history in Processes, complete but for one partial last record of an
	// Abrupt process; nil means the harness listed none, and fails.
	Expected []ExpectedProcess
	// Grace is the topology's adoption grace (poolctl.Params.Grace): P5's
	// "lease expiry plus the grace". Zero fails P5: no grace, no verdict.
	Grace     time.Duration
	Claims    []ClaimEvent
	Leases    []LeaseEvent
	Epochs    []EpochSpan
	Sink      []SinkWrite
	Published map[string]string // row id -> unit it was published to
	// Keys maps row ids to their key and per-key sequence number, from
	// the publisher's own record of what it sent; rows without an entry
	// are not judged for order.
	Keys map[string]KeyedRow
	// Ordering is the order the run promises per key; PerKey makes the
	// per-key order check a check, anything else information.
	Ordering Ordering
	// NoRegistry marks a baseline without claims (the independent strategy):
	// the claim-based checks are reported n/a.
	NoRegistry bool
}
