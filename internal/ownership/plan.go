package ownership

// PlanKind says what a plan changes.
type PlanKind string

// Plan kinds.
const (
	// KindTopologyChange moves a fleet from topology epoch e to e+1.
	KindTopologyChange PlanKind = "TopologyChange"
	// KindPodRoll restarts the worker pods one at a time under one epoch.
	KindPodRoll PlanKind = "PodRoll"
)

// StepName names a step. What each step does to claims and epochs, and when
// it may run, is the table stepRules in state.go.
type StepName string

// Steps of a topology change (Freeze, Activate, HandOver, Claim, Retire)
// and of a pod roll (per pod: HandOver, Claim, VerifyEmpty, Restart,
// Rejoin, HandOver, Claim). A topology change's steps carry the API's
// names (api/v1alpha1's StepFreeze...), so a plan, status.rollout.step and
// the Events speak one vocabulary. They are spelled out here rather than
// imported because the worker SDK imports this package and must not pull
// in Kubernetes; controllers' TestPlanStepsAreTheAPIs keeps them equal.
// VerifyEmpty, Restart and Rejoin are the plan's finer view of a pod's
// HandingOver, Deleting and Rejoining.
const (
	// StepFreeze: every live member stops taking new claims and
	// acknowledges the active epoch. Units already held keep flowing.
	StepFreeze StepName = "Freeze"
	// StepActivate makes Step.Epoch the active epoch, once every live
	// member has acknowledged the freeze.
	StepActivate StepName = "Activate"
	// StepHandOver: each move's From stops fetching, lets delivered rows
	// settle, unpins and releases the unit. Nobody holds it afterwards.
	StepHandOver StepName = "HandOver"
	// StepClaim: each move's To claims a unit nobody holds.
	StepClaim StepName = "Claim"
	// StepRetire: units that left the topology, drained to zero pending,
	// are released and their consumers deleted.
	StepRetire StepName = "Retire"
	// StepVerifyEmpty checks in the registry that Step.Member holds nothing.
	StepVerifyEmpty StepName = "VerifyEmpty"
	// StepRestart deletes Step.Member's pod; it is not live until it
	// rejoins.
	StepRestart StepName = "Restart"
	// StepRejoin: Step.Member's new pod is Ready and joins with Step.Slot,
	// its old slot when free (AssignSlot).
	StepRejoin StepName = "Rejoin"
)

// Move is one unit changing hands. In a HandOver step From releases Unit and
// To says who will claim it; in a Claim step To claims it; in a Retire step
// From releases it for good (To is empty).
type Move struct {
	Unit Unit `json:"unit"`
	// From is the member holding Unit before the move; empty when nobody
	// did (an added or unclaimed unit).
	From string `json:"from,omitempty"`
	// To is the member that will hold it; empty when nobody will (a
	// retired unit, or a fleet of one whose only pod restarts).
	To string `json:"to,omitempty"`
}

// Step is one step of a plan: the controller runs it, waits for it to be
// true in the registry, records it in status, and only then goes on.
type Step struct {
	Name StepName `json:"name"`
	// Epoch is the topology epoch the step's decisions are taken under
	// (for Freeze, the epoch acknowledged; for Activate, the new one).
	Epoch int64 `json:"epoch"`
	// Member is the pod a per-pod step acts on; empty for fleet-wide steps.
	Member string `json:"member,omitempty"`
	// Slot is the slot a Rejoin step gives Member; nil for other steps.
	Slot *Slot `json:"slot,omitempty"`
	// Moves are the units the step moves, in canonical order.
	Moves []Move `json:"moves,omitempty"`
}

// Plan is a change as data: the ordered steps the controller executes and
// status reports, and what the change does to each member.
type Plan struct {
	Kind PlanKind `json:"kind"`
	// FromEpoch is the epoch active when the plan starts, ToEpoch the one
	// active when it ends (the same for a pod roll).
	FromEpoch int64 `json:"fromEpoch"`
	ToEpoch   int64 `json:"toEpoch"`
	// From and To are the topologies of those epochs.
	From Topology `json:"from"`
	To   Topology `json:"to"`
	// Members says, per live member, what it holds before and after and
	// what the plan moves, adds and retires on it.
	Members []MemberChange `json:"members"`
	Steps   []Step         `json:"steps"`
}

// MemberChange is what a plan does to one member's units.
type MemberChange struct {
	Member string `json:"member"`
	// Before and After count the units held before the plan and after it.
	Before int `json:"before"`
	After  int `json:"after"`
	// Kept units are held before and after and never stop.
	Kept int `json:"kept"`
	// MovedIn and MovedOut count units of both topologies that change
	// owner, to and from this member.
	MovedIn  int `json:"movedIn"`
	MovedOut int `json:"movedOut"`
	// Added counts new units this member claims.
	Added int `json:"added"`
	// Retired counts units leaving the topology that this member drains
	// and releases.
	Retired int `json:"retired"`
}

// Totals sums the plan's member changes; Member is empty.
func (p Plan) Totals() MemberChange {
	var t MemberChange
	for _, m := range p.Members {
		t.Before += m.Before
		t.After += m.After
		t.Kept += m.Kept
		t.MovedIn += m.MovedIn
		t.MovedOut += m.MovedOut
		t.Added += m.Added
		t.Retired += m.Retired
	}
	return t
}
