package fleettest

import (
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// A unit-addressed publisher's keys land on the unit they were picked
// for, under either assignment, and two topologies' pools share keys, so
// a key a change moves keeps its sequence.
func TestKeyPoolKeysLandOnTheirUnits(t *testing.T) {
	for _, assign := range []natsops.ShardAssignment{natsops.AssignByPublisher, natsops.AssignByTransform} {
		t.Run(string(assign), func(t *testing.T) {
			f := &Fleet{T: t, Opts: Options{RowPrefix: "c1-"}, Layout: natsops.Layout{SubjectPrefix: "sk", Assignment: assign}}
			from, to := ownership.Topology{Partitions: 4, Shards: 8}, ownership.Topology{Partitions: 4, Shards: 16}
			pools := map[ownership.Topology]map[ownership.Unit][]string{}
			for _, topo := range []ownership.Topology{from, to} {
				addr := f.addressing(topo)
				pool := f.keyPool("row", addr, topo.Units())
				for _, u := range topo.Units() {
					if len(pool[u]) != keysPerUnit {
						t.Fatalf("%s: unit %s has keys %v, want %d", topo, u, pool[u], keysPerUnit)
					}
					for _, k := range pool[u] {
						if got := addr.Unit(k); got != u {
							t.Fatalf("%s: key %s of unit %s addresses %s", topo, k, u, got)
						}
					}
				}
				pools[topo] = pool
			}
			seen := map[string]bool{}
			for _, keys := range pools[from] {
				for _, k := range keys {
					seen[k] = true
				}
			}
			shared := 0
			for _, keys := range pools[to] {
				for _, k := range keys {
					if seen[k] {
						shared++
					}
				}
			}
			if shared == 0 {
				t.Fatalf("no key of %s's pool is in %s's: a change would start every key afresh", from, to)
			}
		})
	}
}
