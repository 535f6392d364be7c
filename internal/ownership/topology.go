package ownership

import (
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidTopology is wrapped by every error Topology.Validate returns.
var ErrInvalidTopology = errors.New("invalid topology")

// Topology is (N, V): N partitions times V shards per partition. Its units
// are {p.s : 0 <= p < N, 0 <= s < V}.
type Topology struct {
	// Partitions is N, the number of partition streams.
	Partitions int `json:"partitions"`
	// Shards is V, the number of shards in every partition.
	Shards int `json:"shards"`
}

// String returns "NxV", e.g. "4x16".
func (t Topology) String() string {
	return fmt.Sprintf("%dx%d", t.Partitions, t.Shards)
}

// Validate reports whether the topology is within the limits the API
// enforces: 1..MaxPartitions partitions, 1..MaxShards shards, at most
// MaxUnits units.
func (t Topology) Validate() error {
	switch {
	case t.Partitions < 1 || t.Partitions > MaxPartitions:
		return fmt.Errorf("%w %s: partitions must be 1..%d", ErrInvalidTopology, t, MaxPartitions)
	case t.Shards < 1 || t.Shards > MaxShards:
		return fmt.Errorf("%w %s: shards must be 1..%d", ErrInvalidTopology, t, MaxShards)
	case t.Partitions*t.Shards > MaxUnits:
		return fmt.Errorf("%w %s: partitions x shards must be at most %d", ErrInvalidTopology, t, MaxUnits)
	}
	return nil
}

// Len returns the number of units, N x V.
func (t Topology) Len() int {
	return t.Partitions * t.Shards
}

// Contains reports whether u is one of the topology's units.
func (t Topology) Contains(u Unit) bool {
	return u.Partition >= 0 && u.Partition < t.Partitions && u.Shard >= 0 && u.Shard < t.Shards
}

// Units returns the topology's units in canonical order (CompareUnits).
func (t Topology) Units() []Unit {
	out := make([]Unit, 0, max(t.Len(), 0))
	for p := 0; p < t.Partitions; p++ {
		for s := 0; s < t.Shards; s++ {
			out = append(out, Unit{Partition: p, Shard: s})
		}
	}
	return out
}

// TopologyDiff is what changes between two topologies. Each list is in
// canonical order.
type TopologyDiff struct {
	// Kept are units of both topologies; their consumers stay.
	Kept []Unit `json:"kept"`
	// Added are units only the new topology has; they are provisioned.
	Added []Unit `json:"added"`
	// Removed are units only the old topology has; they are drained and
	// retired.
	Removed []Unit `json:"removed"`
}

// Diff returns the units kept, added and removed when a fleet goes from one
// topology to another. A unit keeps its name across topologies, which is
// why a change of V keeps the shards both values have.
func Diff(from, to Topology) TopologyDiff {
	var d TopologyDiff
	for _, u := range from.Units() {
		if to.Contains(u) {
			d.Kept = append(d.Kept, u)
		} else {
			d.Removed = append(d.Removed, u)
		}
	}
	for _, u := range to.Units() {
		if !from.Contains(u) {
			d.Added = append(d.Added, u)
		}
	}
	return d
}

// sortedUnits returns a sorted copy of units without duplicates.
func sortedUnits(units []Unit) []Unit {
	us := slices.Clone(units)
	slices.SortFunc(us, CompareUnits)
	return slices.Compact(us)
}
