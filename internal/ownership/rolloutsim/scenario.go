package rolloutsim

import (
	"errors"
	"fmt"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// ErrInvalidScenario is wrapped by every error a bad Scenario causes.
var ErrInvalidScenario = errors.New("invalid scenario")

// Membership says which slots independent workers place over.
type Membership string

// Membership models.
const (
	// Fixed: every worker places over the fixed slots 0..Members-1, its
	// own slot being its ordinal, whoever runs: what a fleet with a fixed
	// replica count does, and what cmd/shardkeeper-worker --strategy
	// independent does. It is the definition of the baseline ("capped
	// rendezvous over a fixed slot set", design.md section 9).
	Fixed Membership = "fixed"
	// Live: every worker places over the slots of the members it sees
	// running, as Views says; a restart reshuffles everyone's units.
	Live Membership = "live"
)

// Views says how soon independent workers see a change of membership
// under Live membership.
type Views string

// View models.
const (
	// Stale views lag one step behind the membership.
	Stale Views = "stale"
	// Fresh views see every change at once.
	Fresh Views = "fresh"
)

// Scenario is one change to replay.
type Scenario struct {
	From, To ownership.Topology
	// Members is how many worker pods there are, with ordinals and slots
	// 0..Members-1.
	Members int
	// Order lists ordinals in restart order; empty means highest first.
	Order []int
	// Membership is which slots independent workers place over; empty
	// means Fixed.
	Membership Membership
	// Views is how independent workers see membership under Live
	// membership; empty means Stale. Fixed membership ignores it.
	Views Views
}

// MaxMembers bounds Scenario.Members; a simulation needs no more.
const MaxMembers = 1024

// Validate reports whether the scenario can be replayed.
func (sc Scenario) Validate() error {
	if err := sc.From.Validate(); err != nil {
		return fmt.Errorf("%w: from: %w", ErrInvalidScenario, err)
	}
	if err := sc.To.Validate(); err != nil {
		return fmt.Errorf("%w: to: %w", ErrInvalidScenario, err)
	}
	if sc.Members < 1 || sc.Members > MaxMembers {
		return fmt.Errorf("%w: members must be 1..%d, got %d", ErrInvalidScenario, MaxMembers, sc.Members)
	}
	switch sc.Membership {
	case "", Fixed, Live:
	default:
		return fmt.Errorf("%w: membership must be %q or %q, got %q", ErrInvalidScenario, Fixed, Live, sc.Membership)
	}
	switch sc.Views {
	case "", Stale, Fresh:
	default:
		return fmt.Errorf("%w: views must be %q or %q, got %q", ErrInvalidScenario, Stale, Fresh, sc.Views)
	}
	return validateOrder(sc.Order, sc.Members)
}

// Model returns the scenario's membership and views with the defaults
// filled in (Fixed, and Stale for Live).
func (sc Scenario) Model() (Membership, Views) {
	m, v := sc.Membership, sc.Views
	if m == "" {
		m = Fixed
	}
	if v == "" {
		v = Stale
	}
	return m, v
}

func validateOrder(order []int, members int) error {
	if len(order) == 0 {
		return nil
	}
	seen := make(map[int]bool, len(order))
	for _, o := range order {
		if o < 0 || o >= members || seen[o] {
			return fmt.Errorf("%w: restart order %v must name each ordinal 0..%d once", ErrInvalidScenario, order, members-1)
		}
		seen[o] = true
	}
	if len(order) != members {
		return fmt.Errorf("%w: restart order %v must name each ordinal 0..%d once", ErrInvalidScenario, order, members-1)
	}
	return nil
}

// RestartOrder returns the ordinals in the order pods restart.
func (sc Scenario) RestartOrder() []int {
	if len(sc.Order) > 0 {
		return sc.Order
	}
	out := make([]int, sc.Members)
	for i := range out {
		out[i] = sc.Members - 1 - i
	}
	return out
}

// members returns the fleet: pod w-i with ordinal i and slot i.
func (sc Scenario) members() []ownership.Member {
	out := make([]ownership.Member, sc.Members)
	for i := range out {
		out[i] = ownership.Member{Name: PodName(i), Ordinal: i, Slot: ownership.Slot(i)}
	}
	return out
}

// PodName is the name of the pod with ordinal i.
func PodName(i int) string {
	return fmt.Sprintf("w-%d", i)
}
