package ownership

import (
	"cmp"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestPlaceProperties checks the promises of placement on random unit and
// slot sets: every unit gets exactly one slot of the set, no slot holds more
// than ceil(units/slots), and the result does not depend on the order or
// repetition of either input.
func TestPlaceProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		units := drawUnits(t, genTopology(6, 40).Draw(t, "topology"))
		slots := genSlots(24).Draw(t, "slots")
		pl := Place(units, slots)

		distinct := sortedUnits(units)
		if pl.Len() != len(distinct) {
			t.Fatalf("placed %d units, want %d", pl.Len(), len(distinct))
		}
		want := (len(distinct) + len(slots) - 1) / len(slots)
		if pl.Cap() != want && len(distinct) > 0 {
			t.Fatalf("cap %d, want ceil(%d/%d) = %d", pl.Cap(), len(distinct), len(slots), want)
		}
		for _, s := range slots {
			if pl.Load(s) > want {
				t.Fatalf("slot %d holds %d units, cap %d", s, pl.Load(s), want)
			}
		}
		for _, u := range distinct {
			s, ok := pl.Owner(u)
			if !ok || !slices.Contains(slots, s) {
				t.Fatalf("unit %s placed on %d (%t), not one of %v", u, s, ok, slots)
			}
		}
		again := Place(rapid.Permutation(units).Draw(t, "units2"), rapid.Permutation(append(slots, slots[0])).Draw(t, "slots2"))
		if !samePlacement(pl, again, distinct) {
			t.Fatalf("placement depends on input order")
		}
	})
}

// TestPlaceIsTheGreedyMatching checks the algorithm against its definition:
// walking all (unit, slot) pairs from the highest weight down and keeping
// each pair whose unit is free and whose slot has room.
func TestPlaceIsTheGreedyMatching(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		units := drawUnits(t, genTopology(4, 30).Draw(t, "topology"))
		slots := genSlots(16).Draw(t, "slots")
		pl := Place(units, slots)
		ref := greedyPlace(units, slots)
		for u, s := range ref {
			if got, _ := pl.Owner(u); got != s {
				t.Fatalf("unit %s: Place says slot %d, greedy says %d", u, got, s)
			}
		}
	})
}

func TestPlaceWithoutSlotsOrUnits(t *testing.T) {
	tests := []struct {
		name  string
		units []Unit
		slots []Slot
	}{
		{name: "no slots leaves every unit unplaced", units: Topology{2, 2}.Units()},
		{name: "only NoSlot counts as no slots", units: Topology{2, 2}.Units(), slots: []Slot{NoSlot}},
		{name: "no units places nothing", slots: []Slot{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl := Place(tt.units, tt.slots)
			if pl.Len() != 0 {
				t.Fatalf("placed %d units, want 0", pl.Len())
			}
			if _, ok := pl.Owner(Unit{Partition: 0, Shard: 0}); ok {
				t.Fatalf("unit 0.0 has an owner")
			}
		})
	}
}

// TestPlaceGolden pins placements. The hash is a wire format: every worker
// and the operator must agree across versions, so a change here breaks
// running fleets and must be deliberate.
func TestPlaceGolden(t *testing.T) {
	pl := Place(Topology{Partitions: 2, Shards: 4}.Units(), slotRange(3))
	got := map[Slot][]string{}
	for _, s := range pl.Slots() {
		for _, u := range pl.UnitsOf(s) {
			got[s] = append(got[s], u.String())
		}
	}
	want := map[Slot][]string{0: {"0.0", "0.2", "1.2"}, 1: {"0.1", "0.3", "1.1"}, 2: {"1.0", "1.3"}}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("placement of 2x4 over slots 0..2 changed:\n got %v\nwant %v", got, want)
	}
	if w := weight(unitKey(Unit{Partition: 3, Shard: 11}), slotKey(7)); w != 0xbd3697e1a94a32af {
		t.Fatalf("weight(3.11, slot 7) = %#x, want 0xbd3697e1a94a32af", w)
	}
}

func samePlacement(a, b Placement, units []Unit) bool {
	for _, u := range units {
		x, _ := a.Owner(u)
		y, _ := b.Owner(u)
		if x != y {
			return false
		}
	}
	return true
}

// greedyPlace is the definition of the placement, computed the slow way.
func greedyPlace(units []Unit, slots []Slot) map[Unit]Slot {
	us, ss := sortedUnits(units), sortedSlots(slots)
	type pair struct {
		w    uint64
		i, j int
	}
	pairs := make([]pair, 0, len(us)*len(ss))
	for i, u := range us {
		for j, s := range ss {
			pairs = append(pairs, pair{weight(unitKey(u), slotKey(s)), i, j})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		return cmp.Or(cmp.Compare(b.w, a.w), cmp.Compare(a.i, b.i), cmp.Compare(a.j, b.j))
	})
	out := make(map[Unit]Slot, len(us))
	if len(ss) == 0 {
		return out
	}
	limit := (len(us) + len(ss) - 1) / len(ss)
	load := make([]int, len(ss))
	for _, p := range pairs {
		if _, done := out[us[p.i]]; done || load[p.j] == limit {
			continue
		}
		out[us[p.i]] = ss[p.j]
		load[p.j]++
	}
	return out
}
