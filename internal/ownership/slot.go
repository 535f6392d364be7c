package ownership

// Slot is a member's position in the placement hash. Slots are small
// non-negative integers; a member keeps its slot across restarts when it can
// (AssignSlot), so a restart does not reshuffle everyone else's units.
type Slot int

// NoSlot stands for "no slot": a member that never had one.
const NoSlot Slot = -1

// AssignSlot returns the slot a joining member gets: its previous slot when
// it had one and nobody holds it now, otherwise the lowest free slot.
// taken holds the slots of the other live members.
func AssignSlot(previous Slot, taken map[Slot]bool) Slot {
	if previous >= 0 && !taken[previous] {
		return previous
	}
	s := Slot(0)
	for taken[s] {
		s++
	}
	return s
}
