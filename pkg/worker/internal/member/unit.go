package member

import (
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// unitState is where one unit is in its life with this member.
type unitState int

const (
	stClaiming  unitState = iota // a Claim is in flight (req)
	stUnsure                     // a Claim's outcome is unknown: a confirmation decides
	stHeld                       // held at token; delivering unless fenced
	stDraining                   // handing over: the puller settles what it delivered
	stUnpinning                  // handing over: UNPIN in flight (req), delivery revoked
	stReleasing                  // handing over: Release queued (req 0) or in flight
)

// stateRules is the table of what each state allows. Every rule of the
// core that depends on a unit's state reads it from here.
var stateRules = [...]struct {
	name string
	// token: the member has a token for the unit (it is in the
	// confirmation's expected set).
	token bool
	// delivering: the unit is in the delivery permission (unless fenced).
	delivering bool
	// confirmable: a confirmation listing the unit as held may make it
	// (stay) held and delivering. Handover states are not: the member
	// already gave the unit up, and a confirmation read before the
	// handover's end must not bring it back (issue 20 defects 1 and 2).
	confirmable bool
	// handover: the unit is being given up.
	handover bool
}{
	stClaiming:  {name: "claiming", confirmable: true},
	stUnsure:    {name: "unsure", confirmable: true},
	stHeld:      {name: "held", token: true, delivering: true, confirmable: true},
	stDraining:  {name: "draining", token: true, delivering: true, handover: true},
	stUnpinning: {name: "unpinning", token: true, handover: true},
	stReleasing: {name: "releasing", token: true, handover: true},
}

func (s unitState) String() string { return stateRules[s].name }

// unit is one unit the member claims, holds or hands over.
type unit struct {
	state unitState
	// req is the request the state waits on (Claim, Unpin, Release).
	req   ReqID
	token poolctl.Token
	// under is the topology epoch the claim was decided under (0 when a
	// confirmation brought it), for the history.
	under int64
	// takeover: the next puller lifts the previous process's unacked
	// rows too (RESET when the census allows).
	takeover bool
	from     string
	puller   *pullerRef
	// deadline: a draining unit stops waiting for its puller then.
	deadline time.Duration
	// parked: a failed release waits for the next tick.
	parked     bool
	handoverAt time.Duration
	// lastFetch and lastRows are when the puller last made progress (a
	// pull completed, or rows of one handled) and last received rows (0:
	// never), for the activity report.
	lastFetch, lastRows time.Duration
	fetched, gotRows    bool
}

func (x *unit) hasToken() bool   { return stateRules[x.state].token }
func (x *unit) delivering() bool { return stateRules[x.state].delivering }
func (x *unit) confirmable() bool {
	return stateRules[x.state].confirmable
}

// pullerState is where a puller is.
type pullerState int

const (
	pRunning pullerState = iota
	pDraining
	pStopping
)

// pullerRef is a puller the core started and has not heard stop.
type pullerRef struct {
	id    PullerID
	state pullerState
	// token is the claim token it pulls under and started when it was
	// started: its pull window, for the activity report.
	token   poolctl.Token
	started time.Duration
	// deadline: stop waiting for its report then (0: none).
	deadline time.Duration
	stuck    bool
}
