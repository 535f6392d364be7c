package natsops

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stranded is what a topology's streams hold where no unit consumer will
// ever deliver it.
type Stranded struct {
	// Rows is how many rows are stranded.
	Rows uint64
	// Where names each place holding some, largest first: "stream S
	// subject X" or "stream S unit p.s (retired)", with its count.
	Where []string
	// Unchecked is how many retired units were not probed (beyond
	// maxStrandedProbes); their rows are not in Rows.
	Unchecked int
}

// maxStrandedProbes bounds the probe consumers one StrandedRows creates.
const maxStrandedProbes = 256

// StrandedRows counts, on every stream of the layout's naming that no
// other topology owns (partitions below and beyond N), the rows no unit
// consumer will deliver:
//
//   - rows on <prefix>.ingest.<p>.<s> with no token after the shard: a unit
//     consumer's filter, <prefix>.ingest.<p>.<s>.>, needs one;
//   - rows of a unit whose consumer was retired (RetireConsumers recorded
//     its resume point in the stream's metadata) and that has no consumer
//     now, stored at or after that point: published after the unit left
//     (a scale-down under Publisher assignment whose publishers went on).
//
// Rows of a unit that never had a consumer under these names are not
// seen. It costs one stream info request per stream and one short-lived
// probe consumer per retired unit without a consumer, at most
// maxStrandedProbes of them per call (a large scale-down leaves thousands):
// Unchecked counts the retired units left out.
func StrandedRows(ctx context.Context, nc *nats.Conn, l Layout) (Stranded, error) {
	var out Stranded
	jsa := jsAPI{nc}
	js, err := jetstream.New(nc)
	if err != nil {
		return out, fmt.Errorf("open JetStream: %w", err)
	}
	names, err := jsa.streamNames(ctx, l.SubjectPrefix+".>")
	if err != nil {
		return out, fmt.Errorf("list streams of prefix %s: %w", l.SubjectPrefix, err)
	}
	type place struct {
		what string
		rows uint64
	}
	var places []place
	probes := 0
	prefix := strings.TrimSuffix(l.StreamName(0), "0")
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		p, ok := parseNumber(rest)
		if !ok {
			continue
		}
		stream, err := jsa.streamInfo(ctx, name)
		if err != nil {
			return out, fmt.Errorf("load stream %s: %w", name, err)
		}
		cfg := stream.Config
		if o, _ := judgeOwner(l.Owner, cfg.Metadata); o == ownedElsewhere {
			continue
		}
		short := fmt.Sprintf("%s.ingest.%d.*", l.SubjectPrefix, p)
		info, err := jsa.streamSubjects(ctx, name, short)
		if err != nil {
			return out, fmt.Errorf("read subjects %s of stream %s: %w", short, name, err)
		}
		for subj, n := range info.State.Subjects {
			places = append(places, place{fmt.Sprintf("stream %s subject %s (no token after the shard)", name, subj), n})
		}
		consumers, err := jsa.consumerNames(ctx, name)
		if err != nil {
			return out, fmt.Errorf("list consumers of stream %s: %w", name, err)
		}
		for key := range cfg.Metadata {
			durable, ok := strings.CutPrefix(key, ResumeKey(""))
			if !ok {
				continue
			}
			s, ok := l.ParseConsumerDurable(p, durable)
			if !ok || slices.Contains(consumers, durable) {
				continue
			}
			if probes == maxStrandedProbes {
				out.Unchecked++
				continue
			}
			probes++
			n, err := countFrom(ctx, js, name, l.FilterSubject(p, s), resumePoint(cfg.Metadata, durable))
			if err != nil {
				return out, err
			}
			if n > 0 {
				places = append(places, place{fmt.Sprintf("stream %s unit %d.%d (retired)", name, p, s), n})
			}
		}
	}
	sort.Slice(places, func(i, j int) bool {
		if places[i].rows != places[j].rows {
			return places[i].rows > places[j].rows
		}
		return places[i].what < places[j].what
	})
	for _, pl := range places {
		out.Rows += pl.rows
		out.Where = append(out.Where, fmt.Sprintf("%s: %d rows", pl.what, pl.rows))
	}
	return out, nil
}

// countFrom counts the rows of stream matching filter at or after seq with
// a probe: an ephemeral pull consumer whose creation reply says how many
// rows it would deliver. It is deleted at once, and the server removes it
// after a few seconds anyway.
func countFrom(ctx context.Context, js jetstream.JetStream, stream, filter string, seq uint64) (uint64, error) {
	rctx, cancel := requestContext(ctx)
	defer cancel()
	cfg := jetstream.ConsumerConfig{FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 5 * time.Second,
		DeliverPolicy: jetstream.DeliverAllPolicy}
	if seq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	}
	c, err := js.CreateConsumer(rctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("count the rows of %s on stream %s: %w", filter, stream, err)
	}
	info := c.CachedInfo()
	_ = js.DeleteConsumer(rctx, stream, info.Name)
	return info.NumPending, nil
}
