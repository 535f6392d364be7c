package ownership

import "hash/crc32"

// The order barrier of a change of N (issue 24, design.md section 8).
//
// A publisher puts a row of key k in partition KeyPartition(k, N) and the
// stream's transform in shard PartitionShard(k, V). With V fixed, a change
// N -> N' moves k from unit (p, s) to (p', s): the shard number stays, the
// partition follows CRC-32's residues the way the shard follows FNV-1a's
// in a change of V. So (p, s) feeds (p', s) exactly when p and p' agree
// modulo gcd(N, N') (the Chinese remainder theorem over CRC-32's 32 bits,
// lcm(N, N') <= 1024 * 1024), and Predecessors gives the old partitions
// as it gives the old shards.
//
// What differs from a change of V is when a row counts as old: publishers
// switch one by one, so no single stream sequence splits a stream. But a
// row of a moved key found in its new partition can only have been
// published under N' (no publisher on N sends the key there), so a worker
// tells the rows to hold from the key alone (MovedFromPartition).

// KeyPartition is the partition a publisher gives key over partitions:
// CRC-32 (IEEE) of the key mod N (pkg/publish routes by it).
func KeyPartition(key string, partitions int) int {
	if partitions <= 0 {
		return 0
	}
	return int(crc32.ChecksumIEEE([]byte(key)) % uint32(partitions))
}

// PartitionPredecessors lists, in order, the old partitions whose keys a
// change of N from oldPartitions to newPartitions moves into partition
// newPartition, each in the same shard: every p in [0, oldPartitions)
// with p != newPartition and p = newPartition mod gcd(oldPartitions,
// newPartitions). Complete and minimal as Predecessors is; empty when N
// does not change.
func PartitionPredecessors(oldPartitions, newPartitions, newPartition int) ([]int, error) {
	return Predecessors(oldPartitions, newPartitions, newPartition)
}

// MovingPartitions lists, sorted, the old partitions whose keys a change
// of N from oldPartitions to newPartitions moves into another partition:
// the ones an order barrier of the change waits for (in every shard).
func MovingPartitions(oldPartitions, newPartitions int) ([]int, error) {
	return MovingShards(oldPartitions, newPartitions)
}

// MovedFromPartition is the old partition a row of key found in partition
// newPartition moved from, and whether it moved at all. A moved key's row
// in its new partition was published under the new N: it waits there
// until its old unit drained what was published under the old one.
func MovedFromPartition(key string, oldPartitions, newPartition int) (int, bool) {
	p := KeyPartition(key, oldPartitions)
	return p, p != newPartition
}
