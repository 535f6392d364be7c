package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes Provision and RetireConsumers tell apart.
const (
	errCodeStreamNotFound   = 10059
	errCodeConsumerNotFound = 10014
)

// provisionParallelism bounds how many consumers of one stream Provision
// creates or updates at once.
const provisionParallelism = 16

// defaultRequestTimeout bounds one JetStream API request when the context
// has no deadline.
const defaultRequestTimeout = 5 * time.Second

// Report says what Provision did and found.
type Report struct {
	// Created names the objects Provision created ("stream X",
	// "consumer X/Y").
	Created []string
	// Updated names the objects whose drift Provision corrected.
	Updated []string
	// Findings lists every drift, corrected or not.
	Findings []Finding
	// Orphans are unit consumers on the layout's streams that the layout
	// no longer has (a shard count that went down). Provision leaves them;
	// RetireConsumers deletes them once they are drained.
	Orphans []Unit
	// OrphanStreams are partition streams beyond the layout's N (a
	// partition count that went down). Nothing here deletes a stream.
	OrphanStreams []string
}

// Provision makes sure, idempotently, that the layout's N partition
// streams and N x V unit consumers exist with the configuration the layout
// gives them. It corrects drift where that is safe, reports the rest, and
// never deletes anything. nc is a connection to the account that owns the
// streams.
//
// Under AssignByTransform, Provision also sets each stream's subject
// transform to route over RoutedShards, which re-routes new rows at once:
// provision a new shape with TransformShards set to the active shape's V
// while the new shape is not active, and without it once it is. Every
// shard the transform routes to gets a consumer, so a stream that a new
// shape adds never stores a row no consumer reads; those beyond the shape
// are reported as orphans.
func Provision(ctx context.Context, nc *nats.Conn, l Layout) (*Report, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{}
	for p := range l.Partitions {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		if err := provisionPartition(ctx, nc, l, p, rep); err != nil {
			return rep, err
		}
	}
	orphans, err := orphanStreams(ctx, nc, l)
	rep.OrphanStreams = orphans
	return rep, err
}

// orphanStreams lists the streams named like partitions of this layout
// with a partition number of N or more.
func orphanStreams(ctx context.Context, nc *nats.Conn, l Layout) ([]string, error) {
	names, err := (jsAPI{nc}).streamNames(ctx, l.SubjectPrefix+".>")
	if err != nil {
		return nil, fmt.Errorf("list streams of prefix %s: %w", l.SubjectPrefix, err)
	}
	var orphans []string
	prefix := strings.TrimSuffix(l.StreamName(0), "0")
	for _, name := range names {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			if p, ok := parseNumber(rest); ok && p >= l.Partitions {
				orphans = append(orphans, name)
			}
		}
	}
	return orphans, nil
}

func provisionPartition(ctx context.Context, nc *nats.Conn, l Layout, p int, rep *Report) error {
	jsa := jsAPI{nc}
	name := l.StreamName(p)
	meta, err := provisionStream(ctx, jsa, l, p, rep)
	if err != nil {
		return err
	}

	existing, offline, err := jsa.consumers(ctx, name)
	if err != nil {
		return fmt.Errorf("list consumers of stream %s: %w", name, err)
	}
	have := make(map[string]api.ConsumerConfig, len(existing))
	for _, c := range existing {
		have[c.Name] = c.Config
	}
	for cname, reason := range offline {
		// An offline consumer exists but cannot be read: creating it again
		// would fail, and comparing it is impossible.
		rep.Findings = append(rep.Findings, Finding{Object: consumerObject(name, cname), Field: "offline", Want: "online", Got: reason})
	}

	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("open JetStream: %w", err)
	}
	// Creating an R3 consumer waits for its raft group; do many at once.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, provisionParallelism)
	)
	run := func(task func() (string, error), done *[]string) {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			obj, err := task()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			*done = append(*done, obj)
		})
	}
	var created, updated []string
	for s := range l.consumerShards() {
		want := withResume(l.ConsumerConfig(p, s), meta)
		obj := consumerObject(name, want.Durable)
		if _, off := offline[want.Durable]; off {
			continue
		}
		got, ok := have[want.Durable]
		if !ok {
			run(func() (string, error) {
				if err := createConsumer(ctx, js, name, want); err != nil {
					return "", fmt.Errorf("create consumer %s/%s: %w", name, want.Durable, err)
				}
				return obj, nil
			}, &created)
			continue
		}
		fs, next := consumerDrift(name, want, got)
		rep.Findings = append(rep.Findings, fs...)
		if next == nil {
			continue
		}
		run(func() (string, error) {
			if err := jsa.updateConsumer(ctx, name, *next); err != nil {
				return "", fmt.Errorf("update consumer %s/%s: %w", name, want.Durable, err)
			}
			return obj, nil
		}, &updated)
	}
	wg.Wait()
	sort.Strings(created)
	sort.Strings(updated)
	rep.Created = append(rep.Created, created...)
	rep.Updated = append(rep.Updated, updated...)
	if err := errors.Join(errs...); err != nil {
		return err
	}

	orphans := map[int]bool{}
	for s := l.Shards; s < l.consumerShards(); s++ {
		orphans[s] = true // kept for the transform's sake
	}
	for cname := range have {
		if s, ok := l.ParseConsumerDurable(p, cname); ok && s >= l.Shards {
			orphans[s] = true
		}
	}
	for s := range orphans {
		rep.Orphans = append(rep.Orphans, Unit{Partition: p, Shard: s})
	}
	sortUnits(rep.Orphans)
	return nil
}

// provisionStream creates or corrects partition p's stream and returns
// its metadata (where retired unit consumers would resume).
func provisionStream(ctx context.Context, jsa jsAPI, l Layout, p int, rep *Report) (map[string]string, error) {
	want := l.StreamConfig(p)
	stream, err := jsa.streamInfo(ctx, want.Name)
	switch {
	case api.IsNatsError(err, errCodeStreamNotFound):
		if err := jsa.createStream(ctx, want); err != nil {
			return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		rep.Created = append(rep.Created, streamObject(want.Name))
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("load stream %s: %w", want.Name, err)
	}
	got := stream.Config
	fs, next := streamDrift(want, got, l.Assignment == AssignByTransform)
	rep.Findings = append(rep.Findings, fs...)
	if next == nil {
		return got.Metadata, nil
	}
	if err := jsa.updateStream(ctx, *next); err != nil {
		return nil, fmt.Errorf("update stream %s: %w", want.Name, err)
	}
	rep.Updated = append(rep.Updated, streamObject(want.Name))
	return got.Metadata, nil
}

// withResume makes a unit consumer that a retired one preceded start where
// that one stopped: its rows before there were delivered and acknowledged
// (RetireConsumers deletes only drained consumers), and delivering them to
// the unit's next owner again would be duplicates nothing explains.
func withResume(c api.ConsumerConfig, meta map[string]string) api.ConsumerConfig {
	if seq := resumePoint(meta, c.Durable); seq > 0 {
		c.DeliverPolicy, c.OptStartSeq = api.DeliverByStartSequence, seq
	}
	return c
}

// createConsumer creates a consumer that must not exist yet. jsAPI only
// creates-or-updates; the create action of nats.go's jetstream package
// makes a concurrent creation with another configuration fail instead of
// silently winning.
func createConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg api.ConsumerConfig) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var jcfg jetstream.ConsumerConfig
	if err := json.Unmarshal(b, &jcfg); err != nil {
		return err
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	_, err = js.CreateConsumer(rctx, stream, jcfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Someone else created it between our listing and now; the next
		// Provision compares it.
		return nil
	}
	return err
}

// requestContext bounds one request by defaultRequestTimeout when ctx has
// no deadline of its own.
func requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultRequestTimeout)
}
