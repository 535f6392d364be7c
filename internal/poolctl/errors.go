package poolctl

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Typed errors below match them with errors.Is.
var (
	ErrUnknownTopology  = errors.New("unknown topology")
	ErrNotMember        = errors.New("not a member")
	ErrStaleIncarnation = errors.New("incarnation superseded by a later join")
	ErrDisplaced        = errors.New("another process joined under this member name and is live")
	ErrLeaseExpired     = errors.New("lease expired; join again")
	ErrFenced           = errors.New("member is fenced")
	ErrDraining         = errors.New("member is draining and may not claim")
	ErrNoActiveEpoch    = errors.New("no active topology epoch")
	ErrEpochMoved       = errors.New("active topology epoch moved")
	ErrFrozen           = errors.New("claims frozen while a topology epoch is pending")
	ErrUnitOutOfRange   = errors.New("unit not in the active topology epoch")
	ErrHeld             = errors.New("unit held by another member")
	ErrStaleEpoch       = errors.New("stale fencing epoch")
	ErrStillHolding     = errors.New("member still holds claims")
	ErrPendingExists    = errors.New("another topology epoch is pending")
	ErrEpochState       = errors.New("topology epoch in the wrong state")
	ErrFreezeIncomplete = errors.New("not every live member acknowledged the freeze")
	ErrConflict         = errors.New("concurrent registry change; retry")
	ErrInvalid          = errors.New("invalid argument")
	ErrSchemaTooNew     = errors.New("registry schema is newer than this binary")
)

// HeldReason says why a held unit cannot be taken.
type HeldReason string

// Reasons a claim on a held unit is refused.
const (
	// HeldOwnerLive: the owner's lease has not expired.
	HeldOwnerLive HeldReason = "owner-live"
	// HeldOwnerGrace: the owner's lease expired less than the grace ago.
	HeldOwnerGrace HeldReason = "owner-grace"
	// HeldClaimerFenceGrace: the claimer's own fence lifted less than the
	// grace ago.
	HeldClaimerFenceGrace HeldReason = "claimer-fence-grace"
	// HeldHandoverToOther: the owner handed the unit to another member
	// and its lease has not lapsed past the grace.
	HeldHandoverToOther HeldReason = "handover-to-other"
	// HeldPreviousIncarnation: an earlier incarnation of the claimer holds
	// the unit and its lease has not lapsed past the grace, so a second
	// process under the same name may still be delivering.
	HeldPreviousIncarnation HeldReason = "previous-incarnation-grace"
	// HeldRecovered: nobody took the unit since the registry was
	// recovered, and a lease the lost primary granted may not have lapsed
	// past the grace.
	HeldRecovered HeldReason = "recovered-grace"
)

// HeldError refuses a claim on a unit another member holds.
type HeldError struct {
	Unit   string
	Owner  string
	Epoch  int64
	Reason HeldReason
	// AdoptableAt is the earliest registry time adoption may happen, zero
	// when it does not depend on time alone.
	AdoptableAt time.Time
}

// Error implements error.
func (e *HeldError) Error() string {
	owner := e.Owner
	if owner == "" {
		owner = "nobody"
	}
	return fmt.Sprintf("unit %s held by %s at epoch %d (%s)", e.Unit, owner, e.Epoch, e.Reason)
}

// Is matches ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// StaleReason says why a token is no longer valid.
type StaleReason string

// Reasons a token is stale.
const (
	// StaleMoved: the claim is at another epoch or with another owner.
	StaleMoved StaleReason = "moved"
	// StaleFree: the unit was released.
	StaleFree StaleReason = "free"
	// StaleAbsent: the unit was never claimed.
	StaleAbsent StaleReason = "absent"
	// StaleLease: the holder's lease expired, it left, or a later
	// incarnation of it joined and has not re-homed the claim.
	StaleLease StaleReason = "lease"
)

// StaleEpochError refuses a write, release or handover from a token that is
// not current.
type StaleEpochError struct {
	Token  Token
	Reason StaleReason
	// Owner and Epoch are the claim's current owner and epoch.
	Owner string
	Epoch int64
}

// Error implements error.
func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("token %s refused (%s): claim is at epoch %d owned by %q", e.Token, e.Reason, e.Epoch, e.Owner)
}

// Is matches ErrStaleEpoch.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// DisplacedError refuses a Rejoin by a process that another process under
// the same member name (pod name) has displaced: it joined after this
// process's incarnation. The refusal is for good: the caller is the old
// pod's process.
type DisplacedError struct {
	Member string
	// Incarnation is the caller's (the one Rejoin was given), Current the
	// later incarnation that holds the name.
	Incarnation, Current int64
	// LiveUntil is the current incarnation's lease expiry on the
	// registry's clock (in the past when it lapsed), for the log.
	LiveUntil time.Time
}

// Error implements error.
func (e *DisplacedError) Error() string {
	return fmt.Sprintf("member %s incarnation %d displaced by incarnation %d, live until %s",
		e.Member, e.Incarnation, e.Current, e.LiveUntil.Format(time.RFC3339Nano))
}

// Is matches ErrDisplaced.
func (e *DisplacedError) Is(target error) bool { return target == ErrDisplaced }

// HoldingError refuses Leave while the member holds claims.
type HoldingError struct {
	Member string
	Units  int
}

// Error implements error.
func (e *HoldingError) Error() string {
	return fmt.Sprintf("member %s still holds %d claims: hand over or release them first", e.Member, e.Units)
}

// Is matches ErrStillHolding.
func (e *HoldingError) Is(target error) bool { return target == ErrStillHolding }

// FreezeIncompleteError refuses activation while live members have not
// acknowledged the freeze.
type FreezeIncompleteError struct {
	Epoch   int64
	Missing []string
}

// Error implements error.
func (e *FreezeIncompleteError) Error() string {
	return fmt.Sprintf("epoch %d: members %s have not acknowledged the freeze", e.Epoch, strings.Join(e.Missing, ", "))
}

// Is matches ErrFreezeIncomplete.
func (e *FreezeIncompleteError) Is(target error) bool { return target == ErrFreezeIncomplete }
