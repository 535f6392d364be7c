package ownership

import "github.com/shardkeeper/shardkeeper/pkg/shard"

// Unit is one shard of one partition, the smallest thing a member owns
// (shard.Unit: the type is public so the worker SDK can hand it to its
// users).
type Unit = shard.Unit

// Limits of a topology, as shard defines them. They match the
// ShardTopology API's validation.
const (
	MaxPartitions = shard.MaxPartitions
	MaxShards     = shard.MaxShards
	MaxUnits      = shard.MaxUnits
)

// ErrBadUnitName is wrapped by every error ParseUnit returns.
var ErrBadUnitName = shard.ErrBadUnitName

// ParseUnit parses a unit name "p.s" (shard.Parse).
func ParseUnit(name string) (Unit, error) { return shard.Parse(name) }

// CompareUnits orders units by partition, then shard (shard.Compare).
func CompareUnits(a, b Unit) int { return shard.Compare(a, b) }
