package ownership

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// ErrInvalidPlanInput is wrapped by every error a planner returns for input
// it cannot plan from.
var ErrInvalidPlanInput = errors.New("invalid plan input")

// Member is one live worker process: its pod name, the pod's ordinal in the
// StatefulSet (rolls go from the highest ordinal down), and its slot.
type Member struct {
	// Name is the pod name, which is also the claim owner's name.
	Name string `json:"name"`
	// Ordinal is the pod's StatefulSet ordinal.
	Ordinal int `json:"ordinal"`
	// Slot is the member's position in the placement hash.
	Slot Slot `json:"slot"`
}

// Claims is who does own each unit: the registry's one row per unit, unit
// to member name. A unit nobody holds is absent.
type Claims map[Unit]string

// Clone returns a copy that can be changed without changing c.
func (c Claims) Clone() Claims {
	return maps.Clone(c)
}

// Held returns the units member holds, in canonical order.
func (c Claims) Held(member string) []Unit {
	var out []Unit
	for u, m := range c {
		if m == member {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, CompareUnits)
	return out
}

// ClaimsOf returns the claims of a fleet at rest: every unit of t held by
// the member its placement over the members' slots names.
func ClaimsOf(t Topology, members []Member) Claims {
	pl := Place(t.Units(), slotsOf(members))
	bySlot := membersBySlot(members)
	c := make(Claims, pl.Len())
	for _, u := range t.Units() {
		if s, ok := pl.Owner(u); ok {
			c[u] = bySlot[s]
		}
	}
	return c
}

// validateMembers checks what every planner needs of the live members: at
// least one, each with a name and a slot of its own.
func validateMembers(members []Member) error {
	if len(members) == 0 {
		return fmt.Errorf("%w: no live members to place units on", ErrInvalidPlanInput)
	}
	names := make(map[string]bool, len(members))
	slots := make(map[Slot]string, len(members))
	for _, m := range members {
		switch {
		case m.Name == "":
			return fmt.Errorf("%w: member with slot %d has no name", ErrInvalidPlanInput, m.Slot)
		case names[m.Name]:
			return fmt.Errorf("%w: member %s is listed twice", ErrInvalidPlanInput, m.Name)
		case m.Slot < 0:
			return fmt.Errorf("%w: member %s has no slot", ErrInvalidPlanInput, m.Name)
		case slots[m.Slot] != "":
			return fmt.Errorf("%w: members %s and %s share slot %d", ErrInvalidPlanInput, slots[m.Slot], m.Name, m.Slot)
		}
		names[m.Name] = true
		slots[m.Slot] = m.Name
	}
	return nil
}

// validateClaims checks that every claim is on a unit of t and held by a
// live member. A claim by anyone else is a takeover (P5), not a plan.
func validateClaims(c Claims, t Topology, members []Member) error {
	live := make(map[string]bool, len(members))
	for _, m := range members {
		live[m.Name] = true
	}
	for u, m := range c {
		if !t.Contains(u) {
			return fmt.Errorf("%w: claim on unit %s, which topology %s does not have", ErrInvalidPlanInput, u, t)
		}
		if !live[m] {
			return fmt.Errorf("%w: unit %s is claimed by %q, which is not a live member", ErrInvalidPlanInput, u, m)
		}
	}
	return nil
}

func slotsOf(members []Member) []Slot {
	out := make([]Slot, len(members))
	for i, m := range members {
		out[i] = m.Slot
	}
	return out
}

func membersBySlot(members []Member) map[Slot]string {
	out := make(map[Slot]string, len(members))
	for _, m := range members {
		out[m.Slot] = m.Name
	}
	return out
}
