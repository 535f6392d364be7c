package natsops

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/nats.go"
)

// Holding is a unit consumer that still holds rows, and so was kept.
type Holding struct {
	Unit Unit
	// Pending rows match the consumer's filter and were never delivered.
	Pending uint64
	// AckPending rows were delivered and not yet acknowledged.
	AckPending int
}

// RetireConsumers deletes the consumers of units that left the topology,
// but only those that are drained: nothing pending, nothing waiting for an
// ack. A consumer that still holds rows is never deleted; it comes back in
// holding, and the caller retries once its owner has worked it off. A
// consumer that is already gone counts as retired.
//
// The check and the delete are two requests: callers retire only after the
// active topology routes no new rows to these units (the rollout's last
// step), so nothing can arrive in between.
//
// Before it deletes a drained consumer, it records on the stream (its
// metadata, ResumeKey) the stream sequence after the last row the consumer
// delivered: every row of the unit up to there was delivered and
// acknowledged. Should a later shape bring the unit back, Provision starts
// its new consumer there instead of replaying the stream's whole history of
// the unit to the new owner as fresh rows.
//
// ctx's deadline bounds the whole call. jsm takes no context, only a
// timeout per request: each unit's requests run apart, with at most a
// request timeout each, and the call returns at the deadline whatever
// they are doing. A unit whose steps were still running then is reported
// neither retired nor holding; its steps are idempotent, and a consumer
// already deleted counts as retired next time.
func RetireConsumers(ctx context.Context, nc *nats.Conn, l Layout, units []Unit) (retired []Unit, holding []Holding, err error) {
	for _, u := range units {
		if err := ctx.Err(); err != nil {
			return retired, holding, err
		}
		mgr, err := requestManager(ctx, nc)
		if err != nil {
			return retired, holding, err
		}
		done := make(chan unitRetirement, 1)
		go func() { done <- retireUnit(mgr, l.ConsumerRef(u)) }()
		var r unitRetirement
		select {
		case r = <-done:
		case <-ctx.Done():
			return retired, holding, ctx.Err()
		}
		switch {
		case r.err != nil:
			return retired, holding, r.err
		case r.holding != nil:
			r.holding.Unit = u
			holding = append(holding, *r.holding)
		default:
			retired = append(retired, u)
		}
	}
	return retired, holding, nil
}

// unitRetirement is what retireUnit did with one unit consumer: deleted
// it (or found it gone), kept it (holding), or failed.
type unitRetirement struct {
	holding *Holding
	err     error
}

// retireUnit deletes ref's consumer if it is drained, after recording
// where it would resume.
func retireUnit(mgr *jsm.Manager, ref ConsumerRef) unitRetirement {
	c, err := mgr.LoadConsumer(ref.Stream, ref.Name)
	switch {
	case jsm.IsNatsError(err, errCodeConsumerNotFound), jsm.IsNatsError(err, errCodeStreamNotFound):
		return unitRetirement{}
	case err != nil:
		return unitRetirement{err: fmt.Errorf("load consumer %s: %w", ref, err)}
	}
	st, err := c.LatestState()
	if err != nil {
		return unitRetirement{err: fmt.Errorf("read state of consumer %s: %w", ref, err)}
	}
	if st.NumPending > 0 || st.NumAckPending > 0 {
		return unitRetirement{holding: &Holding{Pending: st.NumPending, AckPending: st.NumAckPending}}
	}
	if err := recordResume(mgr, ref, st.Delivered.Stream+1); err != nil {
		return unitRetirement{err: err}
	}
	if err := mgr.DeleteConsumer(ref.Stream, ref.Name); err != nil && !jsm.IsNatsError(err, errCodeConsumerNotFound) {
		return unitRetirement{err: fmt.Errorf("delete consumer %s: %w", ref, err)}
	}
	return unitRetirement{}
}

// requestManager is a JetStream manager whose requests time out at ctx's
// deadline (jsm takes no context), or after a request timeout if sooner.
func requestManager(ctx context.Context, nc *nats.Conn) (*jsm.Manager, error) {
	timeout := defaultRequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("open JetStream manager: %w", err)
	}
	return mgr, nil
}

func sortUnits(us []Unit) {
	sort.Slice(us, func(i, j int) bool {
		if us[i].Partition != us[j].Partition {
			return us[i].Partition < us[j].Partition
		}
		return us[i].Shard < us[j].Shard
	})
}

// ResumeKey is the stream metadata key under which RetireConsumers records
// where a retired unit consumer would resume: the stream sequence after
// the last row it delivered.
func ResumeKey(durable string) string { return "shardkeeper.dev/resume." + durable }

// recordResume writes the resume point of ref's consumer into its stream's
// metadata, keeping everything else of the stream's configuration.
func recordResume(mgr *jsm.Manager, ref ConsumerRef, seq uint64) error {
	stream, err := mgr.LoadStream(ref.Stream)
	if err != nil {
		return fmt.Errorf("load stream %s to record where %s resumes: %w", ref.Stream, ref.Name, err)
	}
	cfg := stream.Configuration()
	if cfg.Metadata[ResumeKey(ref.Name)] == strconv.FormatUint(seq, 10) {
		return nil
	}
	meta := maps.Clone(cfg.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[ResumeKey(ref.Name)] = strconv.FormatUint(seq, 10)
	cfg.Metadata = meta
	if err := stream.UpdateConfiguration(cfg); err != nil {
		return fmt.Errorf("record where %s resumes (stream sequence %d): %w", ref, seq, err)
	}
	return nil
}

// resumePoint is where a new consumer named durable starts on a stream
// with metadata meta: after the rows a retired consumer of that name
// delivered, or 0 (the stream's first row) when none was retired.
func resumePoint(meta map[string]string, durable string) uint64 {
	seq, err := strconv.ParseUint(meta[ResumeKey(durable)], 10, 64)
	if err != nil {
		return 0
	}
	return seq
}
