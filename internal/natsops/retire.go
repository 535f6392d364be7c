package natsops

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"

	"github.com/nats-io/jsm.go/api"
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
// ctx's deadline bounds the whole call: every request carries ctx, so a
// slow server cannot stretch one request past it. A unit whose requests
// were cut off is reported neither retired nor holding; its steps are
// idempotent, and a consumer already deleted counts as retired next time.
func RetireConsumers(ctx context.Context, nc *nats.Conn, l Layout, units []Unit) (retired []Unit, holding []Holding, err error) {
	jsa := jsAPI{nc}
	var refused []ForeignObject
	streamOwners := map[string]map[string]string{}
	defer func() {
		if len(refused) > 0 && err == nil {
			err = &OwnedElsewhereError{Owner: l.Owner, Objects: refused}
		}
	}()
	for _, u := range units {
		if err := ctx.Err(); err != nil {
			return retired, holding, err
		}
		ref := l.ConsumerRef(u)
		st, err := jsa.consumerInfo(ctx, ref.Stream, ref.Name)
		switch {
		case api.IsNatsError(err, errCodeConsumerNotFound), api.IsNatsError(err, errCodeStreamNotFound):
			retired = append(retired, u)
			continue
		case err != nil:
			return retired, holding, fmt.Errorf("load consumer %s: %w", ref, err)
		}
		if owner, foreign, err := foreignOwner(ctx, jsa, l.Owner, ref, st.Config.Metadata, streamOwners); err != nil {
			return retired, holding, err
		} else if foreign {
			refused = append(refused, ForeignObject{Object: consumerObject(ref.Stream, ref.Name), Owner: owner})
			continue
		}
		if st.NumPending > 0 || st.NumAckPending > 0 {
			holding = append(holding, Holding{Unit: u, Pending: st.NumPending, AckPending: st.NumAckPending})
			continue
		}
		if err := recordResume(ctx, jsa, ref, st.Delivered.Stream+1); err != nil {
			return retired, holding, err
		}
		if err := jsa.deleteConsumer(ctx, ref.Stream, ref.Name); err != nil && !api.IsNatsError(err, errCodeConsumerNotFound) {
			return retired, holding, fmt.Errorf("delete consumer %s: %w", ref, err)
		}
		retired = append(retired, u)
	}
	return retired, holding, nil
}

// foreignOwner says whether the consumer ref, whose metadata is meta, is
// another topology's: by its own mark or, when it carries none, by its
// stream's (read once per stream into streams).
func foreignOwner(ctx context.Context, jsa jsAPI, want Owner, ref ConsumerRef, meta map[string]string, streams map[string]map[string]string) (Owner, bool, error) {
	if !want.marked() {
		return Owner{}, false, nil
	}
	if _, marked := ownerOf(meta); !marked {
		smeta, ok := streams[ref.Stream]
		if !ok {
			stream, err := jsa.streamInfo(ctx, ref.Stream)
			if err != nil {
				return Owner{}, false, fmt.Errorf("load stream %s to read its owner: %w", ref.Stream, err)
			}
			smeta = stream.Config.Metadata
			streams[ref.Stream] = smeta
		}
		meta = smeta
	}
	o, got := judgeOwner(want, meta)
	return got, o == ownedElsewhere, nil
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
func recordResume(ctx context.Context, jsa jsAPI, ref ConsumerRef, seq uint64) error {
	stream, err := jsa.streamInfo(ctx, ref.Stream)
	if err != nil {
		return fmt.Errorf("load stream %s to record where %s resumes: %w", ref.Stream, ref.Name, err)
	}
	cfg := stream.Config
	if cfg.Metadata[ResumeKey(ref.Name)] == strconv.FormatUint(seq, 10) {
		return nil
	}
	meta := maps.Clone(cfg.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[ResumeKey(ref.Name)] = strconv.FormatUint(seq, 10)
	cfg.Metadata = meta
	if err := jsa.updateStream(ctx, cfg); err != nil {
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
