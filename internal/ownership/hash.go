package ownership

// The placement hash. Every worker, the operator and the simulator must
// compute the same weights in every process and every Go version, so the
// hash is written out here instead of using the runtime's map hash or a
// randomly seeded hash/maphash. Changing any constant or step below changes
// every placement in every fleet at once: treat it as a wire format (the
// golden test in placement_test.go pins it).

// Salts keep unit keys and slot keys apart, so unit 0.0 and slot 0 do not
// start from the same bits.
const (
	unitSalt = 0x9e3779b97f4a7c15
	slotSalt = 0xc2b2ae3d27d4eb4f
)

// mix64 is the splitmix64 finalizer (Stafford's variant 13): a bijection on
// 64 bits with full avalanche, so nearby inputs give unrelated outputs.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unitKey hashes a unit from its numbers, not its name, so that hashing
// needs no allocation; the name and the numbers are one-to-one.
func unitKey(u Unit) uint64 {
	return mix64(uint64(uint32(u.Partition))<<32 | uint64(uint32(u.Shard)) ^ unitSalt)
}

func slotKey(s Slot) uint64 {
	return mix64(uint64(s) ^ slotSalt)
}

// weight is the rendezvous weight of a unit (by its key) on a slot (by its
// key): the higher, the more the two prefer each other.
func weight(uk, sk uint64) uint64 {
	return mix64(uk ^ sk)
}
