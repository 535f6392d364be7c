package member

import (
	"fmt"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// ReqID names one registry call (or one UNPIN or probe); a reply carries
// the id of the request it answers. Ids are never reused by a Core.
type ReqID uint64

// PullerID names one puller the core started; a puller's reports carry it.
type PullerID uint64

// Event is something that happened, fed to Core.Step. Every event carries
// the instant it is handled on the caller's monotonic clock.
type Event interface{ at() time.Duration }

// Tick asks the core to read the registry, place, hand over and claim.
type Tick struct{ Now time.Duration }

// Timer fires at or after the instant of the last SetTimer.
type Timer struct{ Now time.Duration }

// Shutdown asks the member to hand every unit over and leave.
type Shutdown struct{ Now time.Duration }

// JoinReply answers a Join.
type JoinReply struct {
	Now   time.Duration
	Req   ReqID
	Lease poolctl.Lease
	Err   error
}

// RenewReply answers a Renew.
type RenewReply struct {
	Now   time.Duration
	Req   ReqID
	Lease poolctl.Lease
	Err   error
}

// FenceReply answers a Fence.
type FenceReply struct {
	Now time.Duration
	Req ReqID
	Err error
}

// UnfenceReply answers an Unfence.
type UnfenceReply struct {
	Now time.Duration
	Req ReqID
	Err error
}

// ConfirmReply answers a Confirm.
type ConfirmReply struct {
	Now  time.Duration
	Req  ReqID
	Conf poolctl.Confirmation
	Err  error
}

// SnapshotReply answers a ReadSnapshot.
type SnapshotReply struct {
	Now  time.Duration
	Req  ReqID
	Snap poolctl.Snapshot
	Err  error
}

// ClaimReply answers a Claim: Outcomes in the order of its Units, or Err
// for the batch.
type ClaimReply struct {
	Now      time.Duration
	Req      ReqID
	Outcomes []poolctl.ClaimOutcome
	Err      error
}

// ReleaseReply answers a Release: Errs[i] is the outcome of Tokens[i], or
// Err is for the batch.
type ReleaseReply struct {
	Now  time.Duration
	Req  ReqID
	Errs []error
	Err  error
}

// AckFreezeReply answers an AckFreeze.
type AckFreezeReply struct {
	Now time.Duration
	Req ReqID
	Err error
}

// LeaveReply answers a Leave.
type LeaveReply struct {
	Now time.Duration
	Req ReqID
	Err error
}

// ActivityReply answers a ReportActivity.
type ActivityReply struct {
	Now time.Duration
	Req ReqID
	Err error
}

// ProbeReply answers a Probe: Busy lists the probed units whose consumers
// hold rows (pending or unacknowledged), or could not be read.
type ProbeReply struct {
	Now  time.Duration
	Req  ReqID
	Busy []ownership.Unit
}

// UnpinDone answers an Unpin, whatever its outcome: a failed UNPIN only
// delays the next holder until the pin times out.
type UnpinDone struct {
	Now time.Duration
	Req ReqID
}

// PullerPrepared reports that a puller lifted the pin (and RESET the
// consumer when it was a takeover) and pulls from now on.
type PullerPrepared struct {
	Now    time.Duration
	Unit   ownership.Unit
	Puller PullerID
}

// PullerFetched reports a pull's progress and how many rows it brought
// since the last report: a pull that brought nothing completed, or rows
// were handled (reported at most every 100 ms, within a batch too, for
// a slow handler). Either is progress; a unit with none for the
// operator's stall bound counts as stalled.
type PullerFetched struct {
	Now    time.Duration
	Unit   ownership.Unit
	Puller PullerID
	Rows   int
}

// PullerStopped reports that a puller's goroutine ended: after a
// DrainPuller or StopPuller, or on its own. Withheld says it left rows
// neither delivered nor settled (the next puller should RESET).
type PullerStopped struct {
	Now      time.Duration
	Unit     ownership.Unit
	Puller   PullerID
	Withheld bool
	// DrainTimedOut says a drain gave up and nak'd the rest of its batch.
	DrainTimedOut bool
}

func (e Tick) at() time.Duration           { return e.Now }
func (e Timer) at() time.Duration          { return e.Now }
func (e Shutdown) at() time.Duration       { return e.Now }
func (e JoinReply) at() time.Duration      { return e.Now }
func (e RenewReply) at() time.Duration     { return e.Now }
func (e FenceReply) at() time.Duration     { return e.Now }
func (e UnfenceReply) at() time.Duration   { return e.Now }
func (e ConfirmReply) at() time.Duration   { return e.Now }
func (e SnapshotReply) at() time.Duration  { return e.Now }
func (e ClaimReply) at() time.Duration     { return e.Now }
func (e ReleaseReply) at() time.Duration   { return e.Now }
func (e AckFreezeReply) at() time.Duration { return e.Now }
func (e LeaveReply) at() time.Duration     { return e.Now }
func (e ActivityReply) at() time.Duration  { return e.Now }
func (e ProbeReply) at() time.Duration     { return e.Now }
func (e UnpinDone) at() time.Duration      { return e.Now }
func (e PullerPrepared) at() time.Duration { return e.Now }
func (e PullerFetched) at() time.Duration  { return e.Now }
func (e PullerStopped) at() time.Duration  { return e.Now }

// Stamp returns ev with its Now set: the driver stamps each event when it
// handles it, on its own monotonic clock.
func Stamp(ev Event, now time.Duration) Event {
	switch e := ev.(type) {
	case Tick:
		e.Now = now
		return e
	case Timer:
		e.Now = now
		return e
	case Shutdown:
		e.Now = now
		return e
	case JoinReply:
		e.Now = now
		return e
	case RenewReply:
		e.Now = now
		return e
	case FenceReply:
		e.Now = now
		return e
	case UnfenceReply:
		e.Now = now
		return e
	case ConfirmReply:
		e.Now = now
		return e
	case SnapshotReply:
		e.Now = now
		return e
	case ClaimReply:
		e.Now = now
		return e
	case ReleaseReply:
		e.Now = now
		return e
	case AckFreezeReply:
		e.Now = now
		return e
	case LeaveReply:
		e.Now = now
		return e
	case ActivityReply:
		e.Now = now
		return e
	case ProbeReply:
		e.Now = now
		return e
	case UnpinDone:
		e.Now = now
		return e
	case PullerPrepared:
		e.Now = now
		return e
	case PullerFetched:
		e.Now = now
		return e
	case PullerStopped:
		e.Now = now
		return e
	}
	panic(fmt.Sprintf("unknown event %T", ev))
}
