package v1alpha1

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults the API server applies; the funcs below fall back to them when a
// field is unset (objects built in Go, or stored before a default existed).
const (
	DefaultSubjectPrefix = "shardkeeper"
	DefaultConsumerName  = "ingest"
	DefaultReplicas      = 3
	DefaultVersionFloor  = "2.14.0"
	DefaultPinnedTTL     = 2 * time.Minute
	DefaultAckWait       = 30 * time.Second
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
