package main

import (
	"errors"
	"slices"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// TestIndependentPodPullsItsSlotOfCappedRendezvous checks the baseline's
// placement: a pod pulls exactly the units ownership.Place puts on its
// ordinal over the fixed slots 0..replicas-1, and the pods of one
// configuration together pull every unit once.
func TestIndependentPodPullsItsSlotOfCappedRendezvous(t *testing.T) {
	tests := []struct {
		name     string
		topo     ownership.Topology
		replicas int
	}{
		{"field case before, 4x8 over 4", ownership.Topology{Partitions: 4, Shards: 8}, 4},
		{"field case after, 4x16 over 4", ownership.Topology{Partitions: 4, Shards: 16}, 4},
		{"4x48 over 4", ownership.Topology{Partitions: 4, Shards: 48}, 4},
		{"uneven, 3x7 over 5", ownership.Topology{Partitions: 3, Shards: 7}, 5},
		{"more pods than units, 1x2 over 3", ownership.Topology{Partitions: 1, Shards: 2}, 3},
		{"one pod pulls all, 2x3 over 1", ownership.Topology{Partitions: 2, Shards: 3}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slots := make([]ownership.Slot, tt.replicas)
			for i := range slots {
				slots[i] = ownership.Slot(i)
			}
			want := ownership.Place(tt.topo.Units(), slots)
			pulls := map[ownership.Unit]int{}
			for ordinal := range tt.replicas {
				got, err := independentUnits(tt.topo, tt.replicas, ordinal)
				if err != nil {
					t.Fatalf("ordinal %d: %v", ordinal, err)
				}
				if w := want.UnitsOf(ownership.Slot(ordinal)); !slices.Equal(got, w) {
					t.Fatalf("ordinal %d pulls %v, capped rendezvous puts %v on its slot", ordinal, got, w)
				}
				for _, u := range got {
					pulls[u]++
				}
			}
			for _, u := range tt.topo.Units() {
				if pulls[u] != 1 {
					t.Fatalf("unit %s pulled by %d pods, want 1", u, pulls[u])
				}
			}
		})
	}
}

func TestIndependentUnitsRefusesAPodOutsideTheSlots(t *testing.T) {
	good := ownership.Topology{Partitions: 4, Shards: 8}
	tests := []struct {
		name              string
		topo              ownership.Topology
		replicas, ordinal int
	}{
		{"ordinal equals replicas", good, 4, 4},
		{"no replicas", good, 0, 0},
		{"invalid topology", ownership.Topology{Partitions: 0, Shards: 8}, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := independentUnits(tt.topo, tt.replicas, tt.ordinal); !errors.Is(err, errBadFlag) {
				t.Fatalf("independentUnits = %v, want errBadFlag", err)
			}
		})
	}
}
