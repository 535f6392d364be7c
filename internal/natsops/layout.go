package natsops

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/api"
)

// PriorityGroup is the one priority group of every unit consumer. Workers
// pull with it, and UNPIN names it.
const PriorityGroup = "owner"

// ShardAssignment says who decides which shard a row belongs to.
type ShardAssignment string

const (
	// AssignByPublisher means publishers put the shard in the subject:
	// <prefix>.ingest.<p>.<s>.<anything>.
	AssignByPublisher ShardAssignment = "Publisher"
	// AssignByTransform means the partition stream owns a subject
	// transform: publishers send <prefix>.rows.<p>.<key> (one key token)
	// and the stream stores <prefix>.ingest.<p>.<s>.<key> with
	// s = partition(V, key), NATS's own hash.
	AssignByTransform ShardAssignment = "SubjectTransform"
)

// Unit is one shard of one partition. Plain ints keep this package free of
// the ownership package's types.
type Unit struct {
	Partition, Shard int
}

// String renders the unit as "p.s".
func (u Unit) String() string { return fmt.Sprintf("%d.%d", u.Partition, u.Shard) }

// Layout is what a topology asks of NATS: N partition streams, and V unit
// consumers on each.
type Layout struct {
	// SubjectPrefix starts every subject and, upper-cased, every stream
	// name.
	SubjectPrefix string
	// ConsumerName starts every unit consumer's durable name.
	ConsumerName string
	// Partitions is N.
	Partitions int
	// Shards is V, shards per partition.
	Shards int
	// Replicas of every stream and unit consumer.
	Replicas int
	// PinnedTTL is the priority group's priority_timeout: how long a unit
	// consumer keeps its pinned client without hearing from it.
	PinnedTTL time.Duration
	// AckWait is how long a delivered row may stay unacknowledged before it
	// is redelivered.
	AckWait time.Duration
	// MaxAckPending is each unit consumer's max_ack_pending; 0 means
	// DefaultMaxAckPending. Under an order barrier a worker holds a moved
	// key's rows delivered and unacknowledged, so this bounds how many
	// rows a unit can hold before it stops receiving, unmoved keys too.
	MaxAckPending int
	// Assignment says who picks a row's shard; empty means publishers.
	Assignment ShardAssignment
	// Unpinned provisions plain pull consumers, without the pinned
	// priority group, as fleets that hash on their own run them. Only the
	// independent baseline the end-to-end tests measure uses it: without a
	// pin, two processes pulling one consumer both get rows.
	Unpinned bool
	// Owner is the topology the streams and consumers belong to: Provision
	// marks them with it (metadata OwnerKey, OwnerUIDKey) and refuses to
	// adopt, change or delete objects another topology's mark names. The
	// zero Owner marks and checks nothing.
	Owner Owner
	// TransformShards is the shard count the stream subject transform
	// hashes over under AssignByTransform; 0 means Shards. A topology
	// change provisions the new shape's consumers with the active shape's
	// V here, so rows keep going to units someone may claim, and moves
	// the transform only once the new shape is active.
	TransformShards int
}

// RoutedShards is the shard count rows are routed over under a transform:
// TransformShards, or Shards when it is 0.
func (l Layout) RoutedShards() int {
	if l.TransformShards > 0 {
		return l.TransformShards
	}
	return l.Shards
}

// consumerShards is how many unit consumers Provision keeps on each
// stream: every shard of the shape and, under a transform, every shard
// the transform routes to, so no routed row lands where no consumer reads
// it. Those beyond Shards are orphans, retired once drained.
func (l Layout) consumerShards() int {
	if l.Assignment == AssignByTransform {
		return max(l.Shards, l.RoutedShards())
	}
	return l.Shards
}

var (
	prefixRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	consumerRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$`)
)

// MaxShards is the largest V (and TransformShards) the ShardTopology API
// and Validate allow.
const MaxShards = 1024

// StreamMaxConsumers is every partition stream's max_consumers. It must be
// set: nats-server 2.15 counts -1 (unlimited) as unset and then refuses a
// stream's 1001st consumer (its default_max_consumers, 1000), so V above
// 1000 could not be provisioned. Unit consumers are named by shard, so a
// stream never holds more than MaxShards of them, whatever shapes it went
// through (a transform's kept orphans included); twice that leaves room
// for StrandedRows' probe consumer and consumers people add (a tail, a
// debugging reader), so no V the API allows ever needs it raised.
const StreamMaxConsumers = 2 * MaxShards

// DefaultMaxAckPending is a unit consumer's max_ack_pending when the layout
// names none: the ShardTopology API's default (spec.nats.maxAckPending).
// NATS's own default, 1000, let a unit under an order barrier stop
// receiving unmoved keys once it held 1000 rows of moved ones.
const DefaultMaxAckPending = 10000

// maxAckPending is l.MaxAckPending or its default.
func (l Layout) maxAckPending() int {
	if l.MaxAckPending == 0 {
		return DefaultMaxAckPending
	}
	return l.MaxAckPending
}

// ErrBadLayout means a layout cannot be provisioned as given.
var ErrBadLayout = errors.New("bad layout")

// Validate checks the layout the way the ShardTopology API does.
func (l Layout) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadLayout}, args...)...))
	}
	if !prefixRE.MatchString(l.SubjectPrefix) {
		bad("subject prefix %q must match %s", l.SubjectPrefix, prefixRE)
	}
	if !consumerRE.MatchString(l.ConsumerName) {
		bad("consumer name %q must match %s", l.ConsumerName, consumerRE)
	}
	if l.Partitions < 1 || l.Partitions > 1024 || l.Shards < 1 || l.Shards > MaxShards || l.Partitions*l.Shards > 65536 {
		bad("%d partitions x %d shards: each must be 1..1024, at most 65536 units", l.Partitions, l.Shards)
	}
	if l.TransformShards < 0 || l.TransformShards > MaxShards {
		bad("transform shards %d must be 0 (the shard count) or 1..1024", l.TransformShards)
	}
	if l.Replicas < 1 || l.Replicas > 5 {
		bad("replicas %d must be 1..5", l.Replicas)
	}
	if l.PinnedTTL <= 0 {
		bad("pinned TTL %s must be positive", l.PinnedTTL)
	}
	if l.AckWait <= 0 {
		bad("ack wait %s must be positive", l.AckWait)
	}
	if l.MaxAckPending < 0 {
		bad("max ack pending %d must be 0 (the default, %d) or positive", l.MaxAckPending, DefaultMaxAckPending)
	}
	switch l.Assignment {
	case "", AssignByPublisher, AssignByTransform:
	default:
		bad("shard assignment %q must be %s or %s", l.Assignment, AssignByPublisher, AssignByTransform)
	}
	return errors.Join(errs...)
}

// StreamName is partition p's stream: <PREFIX>_INGEST_<p>.
func (l Layout) StreamName(p int) string {
	return strings.ToUpper(l.SubjectPrefix) + "_INGEST_" + strconv.Itoa(p)
}

// StreamSubject covers every stored row of partition p:
// <prefix>.ingest.<p>.>.
func (l Layout) StreamSubject(p int) string {
	return fmt.Sprintf("%s.ingest.%d.>", l.SubjectPrefix, p)
}

// InputSubject is what partition p's stream captures: StreamSubject when
// publishers pick the shard, <prefix>.rows.<p>.* under a transform.
func (l Layout) InputSubject(p int) string {
	if l.Assignment == AssignByTransform {
		return fmt.Sprintf("%s.rows.%d.*", l.SubjectPrefix, p)
	}
	return l.StreamSubject(p)
}

// ShardSubject is where a publisher that picks the shard sends a row of
// unit (p, s); suffix is one or more tokens of its own.
func (l Layout) ShardSubject(p, s int, suffix string) string {
	return fmt.Sprintf("%s.ingest.%d.%d.%s", l.SubjectPrefix, p, s, suffix)
}

// RowSubject is where a publisher sends a row of partition p under a
// transform; key is one token and decides the shard.
func (l Layout) RowSubject(p int, key string) string {
	return fmt.Sprintf("%s.rows.%d.%s", l.SubjectPrefix, p, key)
}

// Transform is partition p's subject transform over RoutedShards shards,
// nil when publishers pick the shard.
func (l Layout) Transform(p int) *api.SubjectTransformConfig {
	if l.Assignment != AssignByTransform {
		return nil
	}
	return &api.SubjectTransformConfig{
		Source:      l.InputSubject(p),
		Destination: fmt.Sprintf("%s.ingest.%d.{{partition(%d,1)}}.{{wildcard(1)}}", l.SubjectPrefix, p, l.RoutedShards()),
	}
}

// ConsumerDurable is unit (p, s)'s durable consumer name:
// <consumerName>_<p>_<s>.
func (l Layout) ConsumerDurable(p, s int) string {
	return fmt.Sprintf("%s_%d_%d", l.ConsumerName, p, s)
}

// FilterSubject is unit (p, s)'s filter: <prefix>.ingest.<p>.<s>.>.
func (l Layout) FilterSubject(p, s int) string {
	return fmt.Sprintf("%s.ingest.%d.%d.>", l.SubjectPrefix, p, s)
}

// ParseConsumerDurable is the inverse of ConsumerDurable on partition p's
// stream: it says whether name is a unit consumer of this layout's naming
// (of any shard count) and which shard it serves.
func (l Layout) ParseConsumerDurable(p int, name string) (shard int, ok bool) {
	rest, found := strings.CutPrefix(name, fmt.Sprintf("%s_%d_", l.ConsumerName, p))
	if !found {
		return 0, false
	}
	s, ok := parseNumber(rest)
	return s, ok
}

// Units lists every unit, partition-major.
func (l Layout) Units() []Unit {
	units := make([]Unit, 0, l.Partitions*l.Shards)
	for p := range l.Partitions {
		for s := range l.Shards {
			units = append(units, Unit{p, s})
		}
	}
	return units
}

// Consumers names every unit consumer, for a census to inspect.
func (l Layout) Consumers() []ConsumerRef {
	refs := make([]ConsumerRef, 0, l.Partitions*l.Shards)
	for _, u := range l.Units() {
		refs = append(refs, l.ConsumerRef(u))
	}
	return refs
}

// ConsumerRef names unit u's consumer.
func (l Layout) ConsumerRef(u Unit) ConsumerRef {
	return ConsumerRef{Stream: l.StreamName(u.Partition), Name: l.ConsumerDurable(u.Partition, u.Shard)}
}

// StreamConfig is the configuration partition p's stream should have:
// limits retention without any limit, so no row is dropped before its
// unit's owner acknowledges it (streamDrift refuses an existing stream
// whose settings could drop one), room for StreamMaxConsumers consumers
// (Provision lowers it to the account's own consumer limit when that is
// lower), per-message deletes denied, and the owner's mark. Fields the layout
// does not name keep the server's defaults.
func (l Layout) StreamConfig(p int) api.StreamConfig {
	return api.StreamConfig{
		Name:             l.StreamName(p),
		Subjects:         []string{l.InputSubject(p)},
		SubjectTransform: l.Transform(p),
		Retention:        api.LimitsPolicy,
		Discard:          api.DiscardOld,
		Storage:          api.FileStorage,
		Replicas:         l.Replicas,
		MaxMsgs:          -1,
		MaxBytes:         -1,
		MaxMsgsPer:       -1,
		MaxMsgSize:       -1,
		MaxConsumers:     StreamMaxConsumers,
		DenyDelete:       true,
		Metadata:         withOwner(nil, l.Owner),
	}
}

// ConsumerConfig is the configuration unit (p, s)'s consumer should have:
// a durable pull consumer, ack explicit, deliver all, unlimited delivery,
// pinned to one client of PriorityGroup for PinnedTTL.
func (l Layout) ConsumerConfig(p, s int) api.ConsumerConfig {
	c := api.ConsumerConfig{
		Durable:        l.ConsumerDurable(p, s),
		Name:           l.ConsumerDurable(p, s),
		FilterSubject:  l.FilterSubject(p, s),
		AckPolicy:      api.AckExplicit,
		AckWait:        l.AckWait,
		MaxAckPending:  l.maxAckPending(),
		DeliverPolicy:  api.DeliverAll,
		ReplayPolicy:   api.ReplayInstant,
		MaxDeliver:     -1,
		Replicas:       l.Replicas,
		PriorityPolicy: api.PriorityPinnedClient,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      l.PinnedTTL,
		Metadata:       withOwner(nil, l.Owner),
	}
	if l.Unpinned {
		c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = api.PriorityNone, nil, 0
	}
	return c
}
