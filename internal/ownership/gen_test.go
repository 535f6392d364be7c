package ownership

import (
	"fmt"
	"slices"

	"pgregory.net/rapid"
)

// Generators shared by the property tests. Sizes stay small so that rapid's
// 100 cases per property run in well under a second.

func genTopology(maxN, maxV int) *rapid.Generator[Topology] {
	return rapid.Custom(func(t *rapid.T) Topology {
		return Topology{
			Partitions: rapid.IntRange(1, maxN).Draw(t, "partitions"),
			Shards:     rapid.IntRange(1, maxV).Draw(t, "shards"),
		}
	})
}

// genSlots draws between 1 and max distinct slots from [0, 2*max), so slot
// sets have gaps like a fleet whose members came and went.
func genSlots(max int) *rapid.Generator[[]Slot] {
	return rapid.SliceOfNDistinct(rapid.Map(rapid.IntRange(0, 2*max-1), func(i int) Slot { return Slot(i) }), 1, max, rapid.ID[Slot])
}

// genMembers draws live members with distinct names, ordinals and slots.
func genMembers(max int) *rapid.Generator[[]Member] {
	return rapid.Custom(func(t *rapid.T) []Member {
		slots := genSlots(max).Draw(t, "slots")
		out := make([]Member, len(slots))
		for i, s := range slots {
			out[i] = Member{Name: fmt.Sprintf("m-%d", i), Ordinal: i, Slot: s}
		}
		return out
	})
}

// drawClaims returns claims on units of t by members: either the fleet at
// rest (ClaimsOf), or each unit held by a random member or by nobody, as
// after crashes and takeovers.
func drawClaims(t *rapid.T, top Topology, members []Member) Claims {
	if rapid.Bool().Draw(t, "atRest") {
		return ClaimsOf(top, members)
	}
	names := make([]string, 0, len(members)+1)
	for _, m := range members {
		names = append(names, m.Name)
	}
	names = append(names, "") // nobody
	c := Claims{}
	for _, u := range top.Units() {
		if m := rapid.SampledFrom(names).Draw(t, "owner"); m != "" {
			c[u] = m
		}
	}
	return c
}

// unitsOf returns a random subset of t's units, shuffled and with some
// duplicates, to check that Place ignores order and repetition.
func drawUnits(t *rapid.T, top Topology) []Unit {
	all := top.Units()
	keep := rapid.SliceOfN(rapid.Bool(), len(all), len(all)).Draw(t, "keep")
	var us []Unit
	for i, u := range all {
		if keep[i] {
			us = append(us, u)
		}
	}
	if len(us) > 0 && rapid.Bool().Draw(t, "dup") {
		us = append(us, us[0])
	}
	return rapid.Permutation(us).Draw(t, "order")
}

func slotRange(n int) []Slot {
	out := make([]Slot, n)
	for i := range out {
		out[i] = Slot(i)
	}
	return out
}

func without(slots []Slot, s Slot) []Slot {
	return slices.DeleteFunc(slices.Clone(slots), func(x Slot) bool { return x == s })
}
