// Package publish is the publishers' side of a ShardTopology: the subject
// a row with a given key is published to, so that it lands in a unit some
// worker consumes. It owns the subject format (the contract README states)
// and the two hashes that pick a key's partition and shard; it does not
// connect to NATS, read the registry or the API server, or decide when a
// publisher moves to a new generation.
//
// The subject format:
//
//   - shardAssignment Publisher: <prefix>.ingest.<p>.<s>.<key>, where the
//     publisher picks p and s. A unit's consumer filters on
//     <prefix>.ingest.<p>.<s>.>, so at least one token must follow the
//     shard: a row sent to <prefix>.ingest.<p>.<s> is stored and never
//     delivered.
//   - shardAssignment SubjectTransform: <prefix>.rows.<p>.<key>, where the
//     publisher picks p and the stream's transform picks
//     s = partition(V, key), NATS's own hash (FNV-1a 32 of the key, mod V).
//
// Topology.Subject picks p with CRC-32 (IEEE) of the key mod N and, under
// Publisher assignment, s with FNV-1a 32 of the key mod V, the function
// the transform uses, so one key goes to the same unit under either
// assignment. Two different hashes keep p and s independent: with one hash
// for both, N=2 and V=4 would use half of the units.
//
// Which N and V to publish to is the topology's active epoch
// (status.activeEpoch; FromStatus). Under Publisher assignment a publisher
// moves to a new epoch only once the topology is Ready at it; a unit that
// a change of V or N removes is retired once drained, and rows published
// to it after that are stored where no unit consumes them.
package publish

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/shard"
)

// Assignment says who picks a row's shard; the values are the API's
// spec.nats.shardAssignment.
type Assignment string

const (
	// ByPublisher: the publisher picks the shard and puts it in the subject.
	ByPublisher Assignment = Assignment(topologyv1.ShardAssignmentPublisher)
	// ByTransform: the partition stream's subject transform picks it.
	ByTransform Assignment = Assignment(topologyv1.ShardAssignmentSubjectTransform)
)

// ErrBadKey is wrapped by the error Subject returns for a key that is not
// one subject token.
var ErrBadKey = errors.New("bad key")

// ErrNoEpoch means the topology has no active epoch yet: there is nowhere
// to publish.
var ErrNoEpoch = errors.New("no active epoch")

// Topology is what a publisher needs to address a row: the subject prefix,
// the shape of the epoch it publishes to, and who picks the shard.
type Topology struct {
	// Prefix is the topology's subject prefix (status.subjectPrefix).
	Prefix string
	// Partitions (N) and Shards (V) of the epoch published to.
	Partitions, Shards int
	// Assignment is spec.nats.shardAssignment; empty means ByPublisher.
	Assignment Assignment
}

// FromStatus is the Topology of a ShardTopology's active epoch, as the
// operator reports it.
func FromStatus(t *topologyv1.ShardTopology) (Topology, error) {
	e := t.Status.ActiveEpoch
	if e == nil {
		return Topology{}, fmt.Errorf("ShardTopology %s/%s: %w", t.Namespace, t.Name, ErrNoEpoch)
	}
	prefix := t.Status.SubjectPrefix
	if prefix == "" {
		prefix = t.SubjectPrefix()
	}
	top := Topology{Prefix: prefix, Partitions: int(e.Partitions), Shards: int(e.ShardsPerPartition), Assignment: Assignment(t.Spec.NATS.ShardAssignment)}
	return top, top.Validate()
}

// Validate checks the topology the way the ShardTopology API does.
func (t Topology) Validate() error {
	var errs []error
	if t.Prefix == "" || !validToken(t.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q must be one subject token (see spec.nats.subjectPrefix)", t.Prefix))
	}
	if t.Partitions < 1 || t.Partitions > shard.MaxPartitions || t.Shards < 1 || t.Shards > shard.MaxShards || t.Partitions*t.Shards > shard.MaxUnits {
		errs = append(errs, fmt.Errorf("%d partitions x %d shards: each must be 1..1024, at most 65536 units", t.Partitions, t.Shards))
	}
	switch t.Assignment {
	case "", ByPublisher, ByTransform:
	default:
		errs = append(errs, fmt.Errorf("assignment %q must be %s or %s", t.Assignment, ByPublisher, ByTransform))
	}
	return errors.Join(errs...)
}

// Partition is the partition of key: CRC-32 (IEEE) of the key mod N.
func (t Topology) Partition(key string) int {
	return ownership.KeyPartition(key, t.Partitions)
}

// Shard is the shard of key: FNV-1a 32 of the key mod V, the hash of the
// stream transform's partition(V, key).
func (t Topology) Shard(key string) int {
	return ownership.PartitionShard(key, t.Shards)
}

// Unit is the unit a row with key belongs to.
func (t Topology) Unit(key string) shard.Unit {
	return shard.Unit{Partition: t.Partition(key), Shard: t.Shard(key)}
}

// Subject is the subject to publish a row with key to. The key must be one
// subject token: not empty, without '.', '*', '>' or whitespace.
func (t Topology) Subject(key string) (string, error) {
	if err := t.Validate(); err != nil {
		return "", err
	}
	if !validToken(key) {
		return "", fmt.Errorf("%w: %q must be one subject token (no '.', '*', '>' or whitespace)", ErrBadKey, key)
	}
	p := strconv.Itoa(t.Partition(key))
	if t.Assignment == ByTransform {
		return t.Prefix + ".rows." + p + "." + key, nil
	}
	return t.Prefix + ".ingest." + p + "." + strconv.Itoa(t.Shard(key)) + "." + key, nil
}

func validToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}
