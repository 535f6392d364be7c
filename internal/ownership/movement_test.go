package ownership

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// movementCase is one join or leave of a slot and what it moved.
type movementCase struct {
	units, slots int // before the change
	join         bool
	moved, ideal int
	capChanged   bool
}

// measureMovement places units over slots, then over slots with one slot
// added (join) or removed (leave), and counts units whose slot changed. The
// ideal is the fewest any placement could move: the units the new slot
// takes (join) or the units the old slot had (leave).
func measureMovement(units []Unit, slots []Slot, changed Slot, join bool) movementCase {
	before, after := slots, slices.Concat(slots, []Slot{changed})
	if !join {
		before, after = slots, without(slots, changed)
	}
	a, b := Place(units, before), Place(units, after)
	c := movementCase{units: len(units), slots: len(slots), join: join, capChanged: a.Cap() != b.Cap()}
	for _, u := range units {
		x, _ := a.Owner(u)
		y, _ := b.Owner(u)
		if x != y {
			c.moved++
		}
	}
	if join {
		c.ideal = b.Load(changed)
	} else {
		c.ideal = a.Load(changed)
	}
	return c
}

// movementCases is a fixed sweep (fixed seed, so the test cannot flake):
// fleets of 2..64 slots with arbitrary slot numbers and 1..64 units per
// slot, a third of them with units an exact multiple of slots (the tight
// case), plus the sizes design.md and the field reports name.
func movementCases() []movementCase {
	rng := rand.New(rand.NewPCG(3, 11))
	var out []movementCase
	run := func(u, s int) {
		units := Topology{Partitions: 1, Shards: u}.Units()
		slots := make([]Slot, 0, s)
		for _, x := range rng.Perm(4 * s)[:s] {
			slots = append(slots, Slot(x))
		}
		out = append(out,
			measureMovement(units, slots, Slot(4*s), true),
			measureMovement(units, slots, slots[rng.IntN(s)], false))
	}
	for _, c := range [][2]int{{64, 4}, {192, 4}, {4096, 256}, {4096, 255}, {1024, 32}} {
		run(c[0], c[1])
	}
	for range 200 {
		s := 2 + rng.IntN(63)
		per := 1 + rng.IntN(64)
		u := s*per - rng.IntN(s)
		if rng.IntN(3) == 0 {
			u = s * per
		}
		if u <= s {
			u = s + 1
		}
		run(min(u, MaxShards), s)
	}
	return out
}

// TestPlaceMovementBound measures how many units one slot joining or
// leaving moves, against the ideal, and holds placement to the documented
// bound:
//
//   - when ceil(units/slots) does not change: moved <= 4 x ideal, and over
//     the whole sweep moved <= 2 x ideal (measured: 1.86 overall, median
//     1.80, p90 2.17, worst 3.19);
//   - when it changes: moved <= 3 x ideal + slots. Units turned away from a
//     full slot under the old cap return to it under the new one, about
//     one per slot at most (measured worst: 4096 units, 256 to 255 slots,
//     moved 255 against an ideal of 16).
func TestPlaceMovementBound(t *testing.T) {
	var moved, ideal, worstMoved, worstIdeal int
	var ratios []float64
	for _, c := range movementCases() {
		bound := 4 * c.ideal
		if c.capChanged {
			bound = 3*c.ideal + c.slots
		}
		if c.moved > bound {
			t.Errorf("%d units over %d slots, join %t: moved %d, ideal %d, bound %d", c.units, c.slots, c.join, c.moved, c.ideal, bound)
		}
		if c.capChanged {
			if c.moved-c.ideal > worstMoved-worstIdeal {
				worstMoved, worstIdeal = c.moved, c.ideal
			}
			continue
		}
		moved += c.moved
		ideal += c.ideal
		ratios = append(ratios, float64(c.moved)/float64(max(c.ideal, 1)))
	}
	slices.Sort(ratios)
	q := func(p float64) float64 { return ratios[int(p*float64(len(ratios)-1))] }
	total := float64(moved) / float64(ideal)
	t.Logf("cap unchanged (%d cases): moved/ideal overall %.2f, median %.2f, p90 %.2f, max %.2f", len(ratios), total, q(.5), q(.9), q(1))
	t.Logf("cap changed: worst excess over ideal %d units (moved %d, ideal %d)", worstMoved-worstIdeal, worstMoved, worstIdeal)
	if total > 2 {
		t.Errorf("moved/ideal over the sweep is %.2f, bound 2", total)
	}
}
