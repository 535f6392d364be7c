package ownership

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPredecessorsOfAChangeOfV(t *testing.T) {
	tests := []struct {
		name          string
		from, to, new int
		want          []int
	}{
		{"8 -> 16: a new shard above 8 comes from its residue", 8, 16, 9, []int{1}},
		{"8 -> 16: a shard that keeps its number receives no moved key", 8, 16, 1, nil},
		{"16 -> 12: existing shard 0 receives from 4, 8 and 12", 16, 12, 0, []int{4, 8, 12}},
		{"16 -> 12: shard 11 receives from 3, 7 and 15", 16, 12, 11, []int{3, 7, 15}},
		{"16 -> 8: a shrink folds the upper half in", 16, 8, 3, []int{11}},
		{"32 -> 48: gcd 16", 32, 48, 40, []int{8, 24}},
		{"32 -> 48: a kept shard receives from its other residue", 32, 48, 8, []int{24}},
		{"7 -> 5: coprime, every old shard but its own feeds", 7, 5, 2, []int{0, 1, 3, 4, 5, 6}},
		{"1 -> 4: every key of the single shard may move", 1, 4, 3, []int{0}},
		{"4 -> 1: the single new shard receives from every other", 4, 1, 0, []int{1, 2, 3}},
		{"no change of V: nothing moves", 16, 16, 5, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Predecessors(tt.from, tt.to, tt.new)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Predecessors(%d, %d, %d) = %v, want %v", tt.from, tt.to, tt.new, got, tt.want)
			}
		})
	}
}

func TestPredecessorsRefusesBadInput(t *testing.T) {
	for _, c := range [][3]int{{0, 4, 0}, {4, 0, 0}, {4, 8, 8}, {4, 8, -1}} {
		if _, err := Predecessors(c[0], c[1], c[2]); err == nil {
			t.Errorf("Predecessors%v accepted", c)
		}
	}
}

// The property the barrier rests on, over many shapes: every key that
// moves into a new shard comes from one of its predecessors (complete),
// and every predecessor feeds it for some hash value (minimal; checked
// over every hash below lcm(V, V'), where all residue pairs occur).
func TestPredecessorsAreCompleteAndMinimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 1))
	shapes := [][2]int{{8, 16}, {16, 12}, {32, 48}, {7, 5}, {12, 18}, {1024, 1000}}
	for range 20 {
		shapes = append(shapes, [2]int{1 + rng.IntN(64), 1 + rng.IntN(64)})
	}
	for _, sh := range shapes {
		from, to := sh[0], sh[1]
		t.Run(fmt.Sprintf("%d->%d", from, to), func(t *testing.T) {
			preds := make([]map[int]bool, to)
			for s := range to {
				ps, err := Predecessors(from, to, s)
				if err != nil {
					t.Fatal(err)
				}
				preds[s] = map[int]bool{}
				for _, p := range ps {
					preds[s][p] = true
				}
			}
			for i := range 5000 {
				key := fmt.Sprintf("key-%d-%d", i, rng.Uint32())
				o, n := PartitionShard(key, from), PartitionShard(key, to)
				if o != n && !preds[n][o] {
					t.Fatalf("key %q moves %d -> %d, but %d is not among %d's predecessors %v", key, o, n, o, n, preds[n])
				}
			}
			seen := make([]map[int]bool, to)
			for s := range to {
				seen[s] = map[int]bool{}
			}
			for h := range from * to / gcd(from, to) {
				if o, n := h%from, h%to; o != n {
					seen[n][o] = true
				}
			}
			for s := range to {
				for p := range preds[s] {
					if !seen[s][p] {
						t.Errorf("predecessor %d of %d feeds it for no hash value: the set is not minimal", p, s)
					}
				}
			}
		})
	}
}

func TestBarrierPairsListsEveryPairOnce(t *testing.T) {
	pairs, err := BarrierPairs(16, 12)
	if err != nil {
		t.Fatal(err)
	}
	// Each new shard s' of 12 has the 4 old shards of its residue mod 4,
	// less itself when s' < 16 (always): 3 each.
	if len(pairs) != 12*3 {
		t.Fatalf("got %d pairs, want 36: %v", len(pairs), pairs)
	}
	if !slices.IsSortedFunc(pairs, func(a, b BarrierPair) int {
		if a.New != b.New {
			return a.New - b.New
		}
		return a.Old - b.Old
	}) {
		t.Fatalf("pairs not sorted: %v", pairs)
	}
	if p, _ := BarrierPairs(8, 8); len(p) != 0 {
		t.Fatalf("no change of V gave pairs %v", p)
	}
}

// PartitionShard must be NATS's hash: FNV-1a over the key's bytes, mod V.
func TestPartitionShardIsFNV1aModV(t *testing.T) {
	for i := range 1000 {
		key := fmt.Sprintf("account-%d", i*7919)
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		for _, v := range []int{1, 8, 12, 16, 48, 1024} {
			if got, want := PartitionShard(key, v), int(h.Sum32()%uint32(v)); got != want {
				t.Fatalf("PartitionShard(%q, %d) = %d, want %d", key, v, got, want)
			}
		}
	}
}

func TestMovedFromTellsMovedKeysFromUnmovedOnes(t *testing.T) {
	for i := range 2000 {
		key := fmt.Sprintf("k%d", i)
		n := PartitionShard(key, 16)
		from, moved := MovedFrom(key, 8, n)
		if from != PartitionShard(key, 8) {
			t.Fatalf("MovedFrom(%q) names %d, want its old shard %d", key, from, PartitionShard(key, 8))
		}
		if moved != (n >= 8) {
			t.Fatalf("key %q in new shard %d: moved=%v, want %v (8 -> 16 moves exactly the keys landing above 7)", key, n, moved, n >= 8)
		}
	}
}

// SwitchRow is a row of a FindSwitch test: the shard its subject names
// and its key ("" for a row that is gone).
type SwitchRow struct {
	Shard int
	Key   string
}

// keyIn finds a key the two shapes route as wanted.
func keyIn(t *testing.T, from, to int, want Routing, shard int) string {
	t.Helper()
	for i := range 100000 {
		k := fmt.Sprintf("k%d", i)
		if RoutedBy(k, shard, from, to) == want {
			return k
		}
	}
	t.Fatalf("no key routed %v into shard %d", want, shard)
	return ""
}

func TestFindSwitchFindsTheLastRowTheOldShapeRouted(t *testing.T) {
	old := keyIn(t, 8, 16, RoutedOld, 3)     // 3 under 8, 11 under 16
	neu := keyIn(t, 8, 16, RoutedNew, 11)    // 3 under 8, 11 under 16
	both := keyIn(t, 8, 16, RoutedEither, 3) // 3 under both
	row := func(shard int, key string) SwitchRow { return SwitchRow{Shard: shard, Key: key} }
	O, N, E, G := row(3, old), row(11, neu), row(3, both), SwitchRow{} // G: gone
	tests := []struct {
		name string
		rows []SwitchRow // rows before+1, before+2, ...
		want uint64      // offset from before
		max  int         // most probes allowed; 0: any
	}{
		{"an empty window: the sequence read before", nil, 0, 0},
		{"old rows then new rows: the last old one", []SwitchRow{O, O, N, N}, 2, 0},
		{"only old rows: the last one", []SwitchRow{O, O, O}, 3, 0},
		{"only new rows: the sequence read before", []SwitchRow{N, N, N}, 0, 0},
		{"unmoved keys and gone rows tell nothing", []SwitchRow{E, O, E, G, O, E, E, N, E, N}, 5, 0},
		{"a long window of old rows then new takes a binary search", append(repeat(O, 700), repeat(N, 301)...), 700, 12},
		{"a long window of unmoved rows around the switch", append(append(repeat(O, 300), repeat(E, 400)...), repeat(N, 300)...), 300, 0},
		{"only unmoved rows: the sequence read before", repeat(E, 50), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const before = 1000
			probes := 0
			got, err := FindSwitch(before, before+uint64(len(tt.rows)), func(seq uint64) (Routing, error) {
				probes++
				if seq <= before || seq > before+uint64(len(tt.rows)) {
					t.Fatalf("probed row %d outside the window (%d, %d]", seq, before, before+len(tt.rows))
				}
				r := tt.rows[seq-before-1]
				if r.Key == "" {
					return RoutedEither, nil
				}
				return RoutedBy(r.Key, r.Shard, 8, 16), nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != before+tt.want {
				t.Fatalf("FindSwitch = before+%d, want before+%d", got-before, tt.want)
			}
			if tt.max > 0 && probes > tt.max {
				t.Fatalf("%d probes for a window of %d rows: not a binary search", probes, len(tt.rows))
			}
		})
	}
}

func repeat(r SwitchRow, n int) []SwitchRow {
	out := make([]SwitchRow, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// Over random windows (old rows, then new rows, with unmoved and gone rows
// anywhere), FindSwitch agrees with a scan of the whole window.
func TestFindSwitchAgreesWithAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 2))
	for i := range 2000 {
		n := rng.IntN(200)
		cut := rng.IntN(n + 1)
		kinds := make([]Routing, n)
		want := uint64(0)
		for j := range kinds {
			switch {
			case rng.IntN(3) == 0:
				kinds[j] = RoutedEither
			case j < cut:
				kinds[j], want = RoutedOld, uint64(j+1)
			default:
				kinds[j] = RoutedNew
			}
		}
		got, err := FindSwitch(0, uint64(n), func(seq uint64) (Routing, error) { return kinds[seq-1], nil })
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("window %d %v: FindSwitch = %d, a scan finds %d", i, kinds, got, want)
		}
	}
}

// MovingShards is every old shard that feeds some new one, once, sorted.
func TestMovingShardsAreThePredecessorsOfSomeNewShard(t *testing.T) {
	for _, c := range []struct {
		from, to int
		want     []int
	}{
		{8, 16, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{16, 12, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
		{2, 3, []int{0, 1}},
		{4, 4, nil},
	} {
		got, err := MovingShards(c.from, c.to)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("MovingShards(%d, %d) = %v, %v; want %v", c.from, c.to, got, err, c.want)
		}
	}
}
