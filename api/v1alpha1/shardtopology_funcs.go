package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults the API server applies; the funcs below fall back to them when a
// field is unset (objects built in Go, or stored before a default existed).
const (
	// DefaultSubjectPrefix was every topology's subject prefix before
	// the prefix became per topology (DefaultSubjectPrefixFor); objects
	// created then keep it stored in their spec.
	DefaultSubjectPrefix = "shardkeeper"
	DefaultConsumerName  = "ingest"
	DefaultReplicas      = 3
	DefaultVersionFloor  = "2.14.0"
	DefaultPinnedTTL     = 2 * time.Minute
	DefaultAckWait       = 30 * time.Second
	DefaultMaxAckPending = 10000
	DefaultDrainTimeout  = 30 * time.Second
	DefaultLeaseTTL      = 15 * time.Second
	DefaultRenewInterval = 5 * time.Second
	DefaultMaxPodsAtOnce = 1
)

// Units is N x V, the number of units the spec declares.
func (s *ShardTopologySpec) Units() int { return int(s.Partitions) * int(s.ShardsPerPartition) }

// IsPaused reports whether the spec or the paused annotation holds the
// rollout.
func (t *ShardTopology) IsPaused() bool {
	return t.Spec.Rollout.Paused || strings.EqualFold(t.Annotations[PausedAnnotation], "true")
}

// IsAbortRequested reports whether the abort annotation is set to "true".
func (t *ShardTopology) IsAbortRequested() bool {
	return strings.EqualFold(t.Annotations[AbortAnnotation], "true")
}

// OrphansOnDeletion reports whether the deletion-policy annotation asks to
// keep everything when the object is deleted.
func (t *ShardTopology) OrphansOnDeletion() bool {
	return strings.EqualFold(t.Annotations[DeletionPolicyAnnotation], DeletionPolicyOrphan)
}

// RegistryKey is the topology's key in the ownership registry and the
// worker's --topology: "namespace/name".
func (t *ShardTopology) RegistryKey() string { return t.Namespace + "/" + t.Name }

// Shape is the spec's N x V.
func (s *ShardTopologySpec) Shape() TopologyShape {
	return TopologyShape{Partitions: s.Partitions, ShardsPerPartition: s.ShardsPerPartition}
}

// ReplicasOrDefault is spec.nats.replicas, or its default when unset.
func (n *NATSSpec) ReplicasOrDefault() int {
	if n.Replicas == 0 {
		return DefaultReplicas
	}
	return int(n.Replicas)
}

// MaxAckPendingOrDefault is spec.nats.maxAckPending, or its default when
// unset.
func (n *NATSSpec) MaxAckPendingOrDefault() int {
	if n.MaxAckPending == 0 {
		return DefaultMaxAckPending
	}
	return int(n.MaxAckPending)
}

// SubjectPrefix is the subject prefix of the topology's streams and
// subjects: spec.nats.subjectPrefix, or, when it is unset, the prefix
// DefaultSubjectPrefixFor derives from the namespace and name. There is no
// shared default: two topologies on one NATS account would otherwise
// share streams and consumers.
func (t *ShardTopology) SubjectPrefix() string {
	if p := t.Spec.NATS.SubjectPrefix; p != "" {
		return p
	}
	return DefaultSubjectPrefixFor(t.Namespace, t.Name)
}

// maxSubjectPrefix is the longest subject prefix the API allows.
const maxSubjectPrefix = 32

// DefaultSubjectPrefixFor is the subject prefix of a topology that sets
// none: "<namespace>_<name>" (a namespace holds no underscore, so two
// topologies never get the same one), or, when that is longer than 32
// characters or the name holds dots (not allowed in a subject token), its
// first 23 characters with dots made dashes, a dash and 8 hex digits of
// the SHA-256 of "namespace/name". It depends only on the namespace and
// name, so a ShardTopology deleted and created again under the same name
// finds the streams and the consumers its predecessor kept.
func DefaultSubjectPrefixFor(namespace, name string) string {
	p := strings.ToLower(namespace + "_" + name)
	if len(p) <= maxSubjectPrefix && !strings.Contains(p, ".") {
		return p
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	short := strings.ReplaceAll(p, ".", "-")
	if len(short) > maxSubjectPrefix-9 {
		short = short[:maxSubjectPrefix-9]
	}
	return short + "-" + hex.EncodeToString(sum[:4])
}

// ConsumerNameOrDefault is spec.nats.consumerName, or its default.
func (n *NATSSpec) ConsumerNameOrDefault() string {
	if n.ConsumerName == "" {
		return DefaultConsumerName
	}
	return n.ConsumerName
}

// VersionFloorOrDefault is spec.nats.versionFloor, or its default.
func (n *NATSSpec) VersionFloorOrDefault() string {
	if n.VersionFloor == "" {
		return DefaultVersionFloor
	}
	return n.VersionFloor
}

// MaxPodsAtOnceOrDefault is spec.rollout.maxPodsAtOnce, or its default.
func (r *RolloutSpec) MaxPodsAtOnceOrDefault() int {
	if r.MaxPodsAtOnce < 1 {
		return DefaultMaxPodsAtOnce
	}
	return int(r.MaxPodsAtOnce)
}

// Units is N x V.
func (s TopologyShape) Units() int { return int(s.Partitions) * int(s.ShardsPerPartition) }

// String renders the shape as "NxV".
func (s TopologyShape) String() string {
	return fmt.Sprintf("%dx%d", s.Partitions, s.ShardsPerPartition)
}

// Shape is the epoch's N x V.
func (e *TopologyEpoch) Shape() TopologyShape {
	return TopologyShape{Partitions: e.Partitions, ShardsPerPartition: e.ShardsPerPartition}
}

// PinnedTTLOrDefault is spec.nats.pinnedTTL, or its default when unset.
func (n *NATSSpec) PinnedTTLOrDefault() time.Duration {
	return orDefault(n.PinnedTTL, DefaultPinnedTTL)
}

// AckWaitOrDefault is spec.nats.ackWait, or its default when unset.
func (n *NATSSpec) AckWaitOrDefault() time.Duration { return orDefault(n.AckWait, DefaultAckWait) }

// DrainTimeoutOrDefault is spec.rollout.drainTimeout, or its default when unset.
func (r *RolloutSpec) DrainTimeoutOrDefault() time.Duration {
	return orDefault(r.DrainTimeout, DefaultDrainTimeout)
}

// LeaseTTLOrDefault is spec.rollout.leaseTTL, or its default when unset.
func (r *RolloutSpec) LeaseTTLOrDefault() time.Duration {
	return orDefault(r.LeaseTTL, DefaultLeaseTTL)
}

// RenewIntervalOrDefault is spec.rollout.renewInterval, or its default when unset.
func (r *RolloutSpec) RenewIntervalOrDefault() time.Duration {
	return orDefault(r.RenewInterval, DefaultRenewInterval)
}

func orDefault(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}
