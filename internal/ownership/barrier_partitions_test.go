package ownership

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Every key a change of N moves into a partition comes from one of that
// partition's predecessors, for CRC-32 as it does for FNV-1a: the gcd rule
// holds for the publishers' hash, not only for the transform's.
func TestPartitionPredecessorsCoverEveryMovedKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 2))
	shapes := [][2]int{{4, 6}, {6, 4}, {4, 8}, {8, 4}, {5, 7}, {1, 3}, {3, 1}, {12, 18}}
	for range 10 {
		shapes = append(shapes, [2]int{1 + rng.IntN(32), 1 + rng.IntN(32)})
	}
	for _, sh := range shapes {
		from, to := sh[0], sh[1]
		t.Run(fmt.Sprintf("%d->%d", from, to), func(t *testing.T) {
			preds := make([]map[int]bool, to)
			for p := range to {
				ps, err := PartitionPredecessors(from, to, p)
				if err != nil {
					t.Fatal(err)
				}
				preds[p] = map[int]bool{}
				for _, o := range ps {
					preds[p][o] = true
				}
			}
			fed := make([]map[int]bool, to)
			for p := range to {
				fed[p] = map[int]bool{}
			}
			for i := range 20000 {
				key := fmt.Sprintf("acct-%d-%d", i, rng.Uint32())
				o, moved := MovedFromPartition(key, from, KeyPartition(key, to))
				n := KeyPartition(key, to)
				if moved != (o != n) || o != KeyPartition(key, from) {
					t.Fatalf("MovedFromPartition(%q, %d, %d) = %d, %v; the key's partitions are %d -> %d", key, from, n, o, moved, KeyPartition(key, from), n)
				}
				if !moved {
					continue
				}
				if !preds[n][o] {
					t.Fatalf("key %q moves from partition %d to %d, but %d is not among %d's predecessors %v", key, o, n, o, n, preds[n])
				}
				fed[n][o] = true
			}
			// With 20,000 keys every predecessor pair of these small
			// shapes occurs: the set is not larger than the keys need.
			for p := range to {
				for o := range preds[p] {
					if !fed[p][o] {
						t.Errorf("predecessor %d of partition %d was fed by none of 20000 keys", o, p)
					}
				}
			}
		})
	}
}

func TestKeyPartitionIsCRC32ModN(t *testing.T) {
	// CRC-32/IEEE("123456789") = 0xCBF43926, the standard check value.
	if got, want := KeyPartition("123456789", 1000), int(uint32(0xCBF43926)%1000); got != want {
		t.Fatalf("KeyPartition = %d, want %d", got, want)
	}
	if got := KeyPartition("any", 0); got != 0 {
		t.Fatalf("KeyPartition over no partitions = %d, want 0", got)
	}
}
