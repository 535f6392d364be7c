package ownership

import (
	"testing"

	"pgregory.net/rapid"
)

func TestAssignSlot(t *testing.T) {
	tests := []struct {
		name     string
		previous Slot
		taken    []Slot
		want     Slot
	}{
		{"first member gets slot 0", NoSlot, nil, 0},
		{"rejoining member gets its slot back", 3, []Slot{0, 1, 2}, 3},
		{"rejoining member whose slot was taken gets the lowest free", 1, []Slot{0, 1, 3}, 2},
		{"new member fills the lowest gap", NoSlot, []Slot{0, 2}, 1},
		{"new member goes after a full range", NoSlot, []Slot{0, 1, 2}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AssignSlot(tt.previous, setOf(tt.taken)); got != tt.want {
				t.Fatalf("AssignSlot(%d, %v) = %d, want %d", tt.previous, tt.taken, got, tt.want)
			}
		})
	}
}

// TestAssignSlotIsStickyAndFree checks the sticky-slot rule on random
// fleets: the slot returned is never taken, is the previous one whenever
// that is free, and otherwise is the lowest free slot.
func TestAssignSlotIsStickyAndFree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		taken := setOf(genSlots(16).Draw(t, "taken"))
		prev := Slot(rapid.IntRange(-1, 40).Draw(t, "previous"))
		got := AssignSlot(prev, taken)
		switch {
		case taken[got]:
			t.Fatalf("got taken slot %d", got)
		case prev >= 0 && !taken[prev] && got != prev:
			t.Fatalf("previous slot %d was free, got %d", prev, got)
		}
		if prev < 0 || taken[prev] {
			for s := Slot(0); s < got; s++ {
				if !taken[s] {
					t.Fatalf("got %d, but %d is free and lower", got, s)
				}
			}
		}
	})
}

func setOf(slots []Slot) map[Slot]bool {
	m := make(map[Slot]bool, len(slots))
	for _, s := range slots {
		m[s] = true
	}
	return m
}
