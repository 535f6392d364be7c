package ownership

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestTopologyValidate(t *testing.T) {
	tests := []struct {
		name string
		top  Topology
		ok   bool
	}{
		{"smallest", Topology{1, 1}, true},
		{"largest N", Topology{1024, 64}, true},
		{"largest V", Topology{64, 1024}, true},
		{"no partitions", Topology{0, 4}, false},
		{"no shards", Topology{4, 0}, false},
		{"negative", Topology{-1, 4}, false},
		{"N above 1024", Topology{1025, 1}, false},
		{"V above 1024", Topology{1, 1025}, false},
		{"more than 65536 units", Topology{1024, 65}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.top.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%v) = %v, want ok %t", tt.top, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("error %v does not wrap ErrInvalidTopology", err)
			}
		})
	}
}

func TestTopologyUnitsAreCanonical(t *testing.T) {
	us := Topology{2, 3}.Units()
	want := []Unit{{Partition: 0, Shard: 0}, {Partition: 0, Shard: 1}, {Partition: 0, Shard: 2}, {Partition: 1, Shard: 0}, {Partition: 1, Shard: 1}, {Partition: 1, Shard: 2}}
	if !slices.Equal(us, want) {
		t.Fatalf("Units() = %v, want %v", us, want)
	}
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name                  string
		from, to              Topology
		kept, added, removed  int
		firstAdded, firstGone string
	}{
		{"V doubles", Topology{4, 8}, Topology{4, 16}, 32, 32, 0, "0.8", ""},
		{"V halves", Topology{4, 16}, Topology{4, 8}, 32, 0, 32, "", "0.8"},
		{"N grows", Topology{2, 4}, Topology{3, 4}, 8, 4, 0, "2.0", ""},
		{"N and V change", Topology{2, 4}, Topology{3, 2}, 4, 2, 4, "2.0", "0.2"},
		{"no change", Topology{2, 2}, Topology{2, 2}, 4, 0, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Diff(tt.from, tt.to)
			if len(d.Kept) != tt.kept || len(d.Added) != tt.added || len(d.Removed) != tt.removed {
				t.Fatalf("Diff = %d kept, %d added, %d removed", len(d.Kept), len(d.Added), len(d.Removed))
			}
			if tt.firstAdded != "" && d.Added[0].String() != tt.firstAdded {
				t.Fatalf("first added %v, want %s", d.Added[0], tt.firstAdded)
			}
			if tt.firstGone != "" && d.Removed[0].String() != tt.firstGone {
				t.Fatalf("first removed %v, want %s", d.Removed[0], tt.firstGone)
			}
		})
	}
}

// TestDiffPartitionsBothTopologies checks that kept and removed make up the
// old units, kept and added the new ones, in canonical order.
func TestDiffPartitionsBothTopologies(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		from, to := genTopology(8, 32).Draw(t, "from"), genTopology(8, 32).Draw(t, "to")
		d := Diff(from, to)
		old := slices.SortedFunc(slices.Values(slices.Concat(d.Kept, d.Removed)), CompareUnits)
		if !slices.Equal(old, from.Units()) {
			t.Fatalf("kept+removed != units of %v", from)
		}
		nu := slices.SortedFunc(slices.Values(slices.Concat(d.Kept, d.Added)), CompareUnits)
		if !slices.Equal(nu, to.Units()) {
			t.Fatalf("kept+added != units of %v", to)
		}
		for _, l := range [][]Unit{d.Kept, d.Added, d.Removed} {
			if !slices.IsSortedFunc(l, CompareUnits) {
				t.Fatalf("%v is not in canonical order", l)
			}
		}
	})
}
