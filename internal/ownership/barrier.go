package ownership

import (
	"fmt"
	"slices"
)

// The order barrier of a change of V (issue 24, design.md section 8).
//
// Under SubjectTransform assignment a row of key k reaches shard
// PartitionShard(k, V) of its partition. A change V -> V' moves k from
// shard s = PartitionShard(k, V) to s' = PartitionShard(k, V') when they
// differ; its older rows still sit in unit (p, s) while its newer ones
// arrive in (p, s'). The new unit must not deliver them before the old
// unit acknowledged the older ones: (p, s) is a predecessor of (p, s').
//
// Which old shards can feed a new one follows from the hash: h mod V = s
// and h mod V' = s' has a solution h exactly when s and s' agree modulo
// gcd(V, V') (the Chinese remainder theorem), and then one below
// lcm(V, V') <= 1024 * 1024, well inside FNV-1a's 32 bits. So the
// predecessors of s' are the old shards s != s' with s = s' mod gcd(V, V').
// A shard that keeps its number keeps its unit (and its consumer): keys
// with s = s' did not move and never wait.

// FNV-1a, 32 bits: NATS's partition() hash (nats-server's
// subjectTransform.getHashPartition hashes the tokens it is given with
// hash/fnv's New32a).
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// PartitionShard is the shard NATS's partition(shards, ...) subject
// transform gives key (the one token it hashes): FNV-1a-32(key) mod shards.
// It allocates nothing, so a puller can call it on every row.
func PartitionShard(key string, shards int) int {
	if shards <= 0 {
		return 0
	}
	h := uint32(fnvOffset32)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= fnvPrime32
	}
	return int(h % uint32(shards))
}

// Predecessors lists, in order, the old shards whose keys a change of V
// from oldShards to newShards moves into shard newShard: every s in
// [0, oldShards) with s != newShard and s = newShard mod gcd(oldShards,
// newShards). Each listed shard does feed newShard for some key (the set
// is minimal), and every key that moves into newShard comes from one of
// them (the set is complete). Empty when V does not change.
func Predecessors(oldShards, newShards, newShard int) ([]int, error) {
	if oldShards < 1 || newShards < 1 {
		return nil, fmt.Errorf("predecessors of a change of V from %d to %d: shard counts must be at least 1", oldShards, newShards)
	}
	if newShard < 0 || newShard >= newShards {
		return nil, fmt.Errorf("predecessors of shard %d: it must be in [0, %d)", newShard, newShards)
	}
	if oldShards == newShards {
		return nil, nil
	}
	g := gcd(oldShards, newShards)
	var out []int
	for s := newShard % g; s < oldShards; s += g {
		if s != newShard {
			out = append(out, s)
		}
	}
	return out, nil
}

// BarrierPair is one (new shard, old shard) pair of a change of V: keys
// moved from Old into New wait in New until Old drained its rows stored
// before the switch.
type BarrierPair struct {
	New, Old int
}

// BarrierPairs lists every pair of a change of V from oldShards to
// newShards, sorted by new shard and then old shard; the same in every
// partition. Empty when V does not change.
func BarrierPairs(oldShards, newShards int) ([]BarrierPair, error) {
	var out []BarrierPair
	for s := 0; s < newShards; s++ {
		preds, err := Predecessors(oldShards, newShards, s)
		if err != nil {
			return nil, err
		}
		for _, o := range preds {
			out = append(out, BarrierPair{New: s, Old: o})
		}
	}
	return out, nil
}

// MovingShards lists, sorted, the old shards whose keys a change of V from
// oldShards to newShards moves (the predecessors of some new shard): the
// ones an order barrier waits for.
func MovingShards(oldShards, newShards int) ([]int, error) {
	pairs, err := BarrierPairs(oldShards, newShards)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range pairs {
		out = append(out, p.Old)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// MovedFrom is the old shard a row of key in unit shard newShard moved
// from, and whether it moved at all: a row whose key the old shape routed
// to newShard too is unmoved and never waits. It assumes the row was
// routed over newShards (after the switch), which is the only way a moved
// key's row reaches newShard.
func MovedFrom(key string, oldShards, newShard int) (int, bool) {
	s := PartitionShard(key, oldShards)
	return s, s != newShard
}

// Routing says which shape's transform routed a row found in shard
// shard: the old one, the new one, or either (the key's shard is the same
// under both, so it did not move and its routing does not matter).
type Routing int

// Routings of a row around a switch of the transform.
const (
	RoutedEither Routing = iota
	RoutedOld
	RoutedNew
	// RoutedNeither: the row's shard is the key's under neither shape (a
	// publisher that picked the shard itself, or a row of an older
	// shape); it tells nothing about the switch.
	RoutedNeither
)

// RoutedBy says which shape routed a row of key found in shard.
func RoutedBy(key string, shard, oldShards, newShards int) Routing {
	o, n := PartitionShard(key, oldShards) == shard, PartitionShard(key, newShards) == shard
	switch {
	case o && n:
		return RoutedEither
	case o:
		return RoutedOld
	case n:
		return RoutedNew
	default:
		return RoutedNeither
	}
}

// SwitchProbe reads the row stored at seq and says which shape routed it
// (RoutedBy); a row that is gone, or that tells nothing, is RoutedEither.
type SwitchProbe func(seq uint64) (Routing, error)

// FindSwitch finds the stream sequence S at which a partition stream's
// subject transform switched from oldShards to newShards: the last row the
// old shape routed. before is a sequence read before the transform's
// update (every row at or below it was routed over oldShards) and after
// one read after it (every row above it is routed over newShards). So
// every row at or below S was routed over oldShards or lands in the same
// shard under both shapes (its key did not move), and every row above it
// was routed over newShards: a moved key's rows above S are its new ones.
//
// The switch is one point in the stream's order (the stream's leader
// applies its new configuration between two rows), so the rows the old
// shape routed all come before those the new one routed, and a binary
// search finds S in about log2(after - before) probes, scanning past rows
// that tell nothing (unmoved keys, rows of no key). A window of a few
// rows (the time one stream update takes) costs as many probes; a large
// one (an operator that died between the switch and this search) costs
// its logarithm.
func FindSwitch(before, after uint64, probe SwitchProbe) (uint64, error) {
	// S is in [lo, hi): lo is before or a row the old shape routed, and no
	// row at or above hi is one.
	lo, hi := before, after+1
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		found := false
		for q := mid; q < hi; q++ {
			r, err := probe(q)
			if err != nil {
				return 0, fmt.Errorf("read row %d: %w", q, err)
			}
			if r == RoutedOld {
				lo, found = q, true
				break
			}
			if r == RoutedNew {
				// Rows from mid up to q told nothing, q and above
				// are the new shape's: S is below mid.
				hi, found = mid, true
				break
			}
		}
		if !found {
			hi = mid
		}
	}
	return lo, nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
