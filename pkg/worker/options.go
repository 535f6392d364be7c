package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Options configure a Worker. The zero value of every tuning field means a
// default that is safe as it is.
type Options struct {
	// Topology is the registry key of the ShardTopology, "namespace/name".
	Topology string
	// Member is this process's identity, normally its pod name.
	Member string
	// Registry is the ownership registry (OpenRegistry).
	Registry *Registry
	// NATS is a connection to the cluster that holds the unit consumers.
	NATS *nats.Conn
	// SubjectPrefix and ConsumerName name streams and consumers as the
	// ShardTopology's spec.nats does. The registry's values (the operator
	// writes the spec's there) win; these are used only while it carries
	// none (defaults "shardkeeper", "ingest").
	SubjectPrefix, ConsumerName string
	// Handler receives every row. It must return a Settlement.
	Handler Handler

	// TickInterval is how often the worker re-reads the registry, places
	// and claims (default 500ms). A released unit waits at most this long
	// for its next owner. Renewals keep their own schedule: registry
	// calls run beside the member's state machine, so a long tick (slow
	// drains, many claims) never delays them.
	TickInterval time.Duration
	// FetchBatch is how many rows one pull asks for (default 64).
	FetchBatch int
	// FetchWait bounds one pull (default 1s). Shorter makes handovers
	// start sooner; longer means fewer requests on idle units. It is
	// capped at the registry's renew interval: the operator tells a quiet
	// unit from a stalled one by its pulls completing (an idle pull
	// completes when its wait runs out) within three renew intervals.
	FetchWait time.Duration
	// DrainTimeout bounds how long a handover waits for delivered rows to
	// settle; rows still unsettled then are nak'd for the next owner. The
	// registry's value (spec.rollout.drainTimeout) wins; this one is used
	// only while it carries none (default 30s).
	DrainTimeout time.Duration
	// FetchFailureBound is how long every pull of a held unit may fail
	// (its consumer missing, unreachable, or pinned to another client)
	// before Ready reports false and /readyz says which unit (default
	// 30s): longer than a consumer leader election or a server restart,
	// which pass by themselves, and short enough that a consumer deleted
	// under the worker shows before its rows are missed.
	FetchFailureBound time.Duration
	// FenceMargin is subtracted from the lease to find the self-fence
	// deadline (default: the registry's query bound). It covers the
	// difference in clock rate between this process and the database.
	FenceMargin time.Duration
	// MaxCensusAge is the oldest census verdict the worker trusts to RESET
	// a consumer on takeover (default 2m), measured at the moment of the
	// RESET.
	MaxCensusAge time.Duration
	// TakeoverConcurrency bounds the UNPIN and RESET requests the worker
	// has in flight at once, handovers and new holders' pullers together
	// (default 16).
	TakeoverConcurrency int
	// ClaimBatch caps the units of one registry claim or release call.
	// The default, 0, puts all of a tick's claims in one call and all of
	// its releases in another: a constant number of round trips whatever
	// the unit count. It is a knob for benchmarks that compare that with
	// one unit per call (1); a fleet has no reason to set it.
	ClaimBatch int
	// History, when set, receives a record of every pull, delivery,
	// settlement, withheld row and RESET (package history), the evidence
	// the history checker judges. Nil records nothing and costs nothing.
	History history.Recorder
	// RowID names a row in the history; it must match what the Handler's
	// sink records. The default is DefaultRowID.
	RowID func(Row) string
	// Logger receives the worker's logs; the zero value discards them.
	Logger logr.Logger
	// Metrics, when set, receives the worker's Prometheus metrics.
	Metrics prometheus.Registerer
}

// Handler processes one row. It runs on the unit's own goroutine; rows of
// one unit arrive in order, one at a time.
type Handler func(ctx context.Context, row Row) Settlement

// ErrBadOption wraps every refusal of an option.
var ErrBadOption = errors.New("bad worker option")

func (o *Options) withDefaults() Options {
	c := *o
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "shardkeeper"
	}
	if c.ConsumerName == "" {
		c.ConsumerName = "ingest"
	}
	if c.FetchBatch == 0 {
		c.FetchBatch = 64
	}
	if c.TickInterval == 0 {
		c.TickInterval = 500 * time.Millisecond
	}
	if c.FetchWait == 0 {
		c.FetchWait = time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.FetchFailureBound == 0 {
		c.FetchFailureBound = 30 * time.Second
	}
	if c.MaxCensusAge == 0 {
		c.MaxCensusAge = 2 * time.Minute
	}
	if c.TakeoverConcurrency == 0 {
		c.TakeoverConcurrency = 16
	}
	if c.RowID == nil {
		c.RowID = DefaultRowID
	}
	return c
}

// validate refuses options that cannot work, naming the option.
func (o *Options) validate() error {
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: "+format, append([]any{ErrBadOption, option}, args...)...))
	}
	if o.Topology == "" {
		bad("Topology", "must name the ShardTopology as namespace/name")
	}
	if o.Member == "" {
		bad("Member", "must be set (normally the pod name)")
	}
	if o.Registry == nil || o.Registry.reg == nil {
		bad("Registry", "must be set (OpenRegistry)")
	}
	if o.NATS == nil {
		bad("NATS", "must be a connection")
	}
	if o.Handler == nil {
		bad("Handler", "must be set")
	}
	// Reuse the API's naming rules through natsops's layout validation.
	l := natsops.Layout{SubjectPrefix: o.SubjectPrefix, ConsumerName: o.ConsumerName, Partitions: 1, Shards: 1, Replicas: 1,
		PinnedTTL: time.Second, AckWait: time.Second}
	if err := l.Validate(); err != nil {
		bad("SubjectPrefix/ConsumerName", "%v", err)
	}
	if o.TickInterval < 10*time.Millisecond || o.TickInterval > time.Minute {
		bad("TickInterval", "must be 10ms..1m, got %s", o.TickInterval)
	}
	if o.FetchBatch < 1 || o.FetchBatch > 10000 {
		bad("FetchBatch", "must be 1..10000, got %d", o.FetchBatch)
	}
	if o.FetchWait < 10*time.Millisecond || o.FetchWait > time.Minute {
		bad("FetchWait", "must be 10ms..1m, got %s", o.FetchWait)
	}
	if o.DrainTimeout <= 0 || o.DrainTimeout > time.Hour {
		bad("DrainTimeout", "must be above 0 and at most 1h, got %s", o.DrainTimeout)
	}
	if o.FetchFailureBound < 0 {
		bad("FetchFailureBound", "must not be negative, got %s", o.FetchFailureBound)
	}
	if o.FenceMargin < 0 {
		bad("FenceMargin", "must not be negative, got %s", o.FenceMargin)
	}
	if o.MaxCensusAge <= 0 {
		bad("MaxCensusAge", "must be positive, got %s", o.MaxCensusAge)
	}
	if o.TakeoverConcurrency < 1 || o.TakeoverConcurrency > 1024 {
		bad("TakeoverConcurrency", "must be 1..1024, got %d", o.TakeoverConcurrency)
	}
	if o.ClaimBatch < 0 {
		bad("ClaimBatch", "must be 0 (all in one call) or positive, got %d", o.ClaimBatch)
	}
	return errors.Join(errs...)
}
