package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	// errCodeMaxConsumers is "maximum consumers limit reached": on a
	// stream's create or update, its max_consumers is above the account's
	// JetStream consumer limit.
	errCodeMaxConsumers = 10026
)

// provisionParallelism bounds how many consumers of one stream Provision
// creates or updates at once.
const provisionParallelism = 16

// requestTimeout bounds one JetStream API request, whatever deadline the
// caller's context carries: a request no server answers (its stream's
// leader down, the meta group electing) must fail in seconds so the
// caller's next pass runs, instead of holding that pass to the caller's
// own deadline. Chaos scenario 7 saw one consumer listing hold a reconcile,
// and with it the census, for the whole minute of natsOpTimeout.
const requestTimeout = 10 * time.Second

// Report says what Provision did and found.
type Report struct {
	// Created names the objects Provision created ("stream X",
	// "consumer X/Y").
	Created []string
	// Updated names the objects whose drift Provision corrected.
	Updated []string
	// Findings lists every drift, corrected or not.
	Findings []Finding
	// Orphans are unit consumers of the layout's naming that the layout
	// no longer has: shards at or beyond V on its streams (a shard count
	// that went down, or kept for a transform), and every unit consumer
	// on an orphan stream (a partition count that went down, or a change
	// abandoned after it provisioned). Provision leaves them;
	// RetireConsumers deletes them once they are drained. Objects another
	// topology owns are never listed.
	Orphans []Unit
	// OrphanStreams are partition streams beyond the layout's N (a
	// partition count that went down) that this layout's owner owns or
	// that carry no owner. Nothing here deletes a stream.
	OrphanStreams []string
}

// Refusals are the findings Provision refused (Finding.Unsafe).
func (r *Report) Refusals() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Unsafe {
			out = append(out, f)
		}
	}
	return out
}

// Provision makes sure, idempotently, that the layout's N partition
// streams and N x V unit consumers exist with the configuration the layout
// gives them. It corrects drift where that is safe, reports the rest, and
// never deletes anything. nc is a connection to the account that owns the
// streams.
//
// Under AssignByTransform, Provision also sets each stream's subject
// transform to route over RoutedShards, which re-routes new rows at once
// (a replicated stream's through switchTransform, its input paused):
// provision a new shape with TransformShards set to the active shape's V
// while the new shape is not active, and without it once it is. Every
// shard the transform routes to gets a consumer, so a stream that a new
// shape adds never stores a row no consumer reads; those beyond the shape
// are reported as orphans.
//
// With an Owner, Provision marks every stream and unit consumer it creates
// or finds with it, adopts unmarked ones (and those of an earlier object of
// the same name), and refuses, before it writes anything, when a stream
// of the layout carries another topology's mark: the error is an
// *OwnedElsewhereError naming each object and its owner. A stream or
// consumer configured so that rows can be dropped before they are
// acknowledged, or delivered outside their unit's claim, is refused with
// an *UnsafeConfigError (the report lists them as Unsafe findings), after
// everything else was provisioned.
func Provision(ctx context.Context, nc *nats.Conn, l Layout) (*Report, error) {
	return ProvisionWith(ctx, nc, l, ProvisionOptions{})
}

// ProvisionWith is Provision with options: under AssignByTransform, a
// change of a replicated stream's transform needs o.System (see
// switchTransform).
func ProvisionWith(ctx context.Context, nc *nats.Conn, l Layout, o ProvisionOptions) (*Report, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{}
	if err := checkStreamOwners(ctx, nc, l); err != nil {
		return rep, err
	}
	acct, err := jsAPI{nc}.accountInfo(ctx)
	if err != nil {
		return rep, fmt.Errorf("read the account's JetStream limits: %w", err)
	}
	maxc := streamMaxConsumers(acct, l.Replicas)
	var foreign []ForeignObject
	for p := range l.Partitions {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		f, err := provisionPartition(ctx, nc, l, o, p, maxc, rep)
		foreign = append(foreign, f...)
		if err != nil {
			return rep, err
		}
	}
	inv, err := inventory(ctx, nc, l, l.Partitions)
	if err != nil {
		return rep, err
	}
	rep.OrphanStreams = inv.streams
	rep.Orphans = append(rep.Orphans, inv.units...)
	sortUnits(rep.Orphans)
	var errs []error
	if len(foreign) > 0 {
		errs = append(errs, &OwnedElsewhereError{Owner: l.Owner, Objects: foreign})
	}
	if refused := rep.Refusals(); len(refused) > 0 {
		errs = append(errs, &UnsafeConfigError{Findings: refused})
	}
	return rep, errors.Join(errs...)
}

// streamMaxConsumers is the max_consumers Provision gives the streams:
// StreamMaxConsumers, or the account's own consumer limit (its tier's,
// for streams of replicas, when its limits are tiered) when that is lower.
// The server refuses a stream whose max_consumers is above the account's
// limit, and where the account sets one, 2.15's default of 1000 does not
// apply, so the account's limit is the most the stream can hold anyway.
func streamMaxConsumers(acct *api.JetStreamAccountStats, replicas int) int {
	limit := acct.Limits.MaxConsumers
	if t, ok := acct.Tiers[fmt.Sprintf("R%d", replicas)]; ok {
		limit = t.Limits.MaxConsumers
	}
	if limit > 0 && limit < StreamMaxConsumers {
		return limit
	}
	return StreamMaxConsumers
}

// checkStreamOwners refuses, before anything is written, a layout one of
// whose partition streams another topology owns.
func checkStreamOwners(ctx context.Context, nc *nats.Conn, l Layout) error {
	if !l.Owner.marked() {
		return nil
	}
	jsa := jsAPI{nc}
	var foreign []ForeignObject
	for p := range l.Partitions {
		stream, err := jsa.streamInfo(ctx, l.StreamName(p))
		switch {
		case api.IsNatsError(err, errCodeStreamNotFound):
			continue
		case err != nil:
			return fmt.Errorf("load stream %s: %w", l.StreamName(p), err)
		}
		if o, got := judgeOwner(l.Owner, stream.Config.Metadata); o == ownedElsewhere {
			foreign = append(foreign, ForeignObject{Object: streamObject(l.StreamName(p)), Owner: got})
		}
	}
	if len(foreign) > 0 {
		return &OwnedElsewhereError{Owner: l.Owner, Objects: foreign}
	}
	return nil
}

// Inventory lists every unit consumer of the layout's naming that its owner
// may retire, on every stream named like one of its partitions, whatever
// the partition number and whatever N and V are now: what a topology ever
// provisioned, found again without any record of it. Streams and
// consumers another topology owns are left out.
func Inventory(ctx context.Context, nc *nats.Conn, l Layout) ([]Unit, error) {
	inv, err := inventory(ctx, nc, l, 0)
	if err != nil {
		return nil, err
	}
	return inv.units, nil
}

type inventoryResult struct {
	streams []string
	units   []Unit
}

// inventory lists the streams of the layout's naming with a partition
// number of from or more that are not another topology's, and the unit
// consumers on them that are not either.
func inventory(ctx context.Context, nc *nats.Conn, l Layout, from int) (inventoryResult, error) {
	var out inventoryResult
	jsa := jsAPI{nc}
	names, err := jsa.streamNames(ctx, l.SubjectPrefix+".>")
	if err != nil {
		return out, fmt.Errorf("list streams of prefix %s: %w", l.SubjectPrefix, err)
	}
	prefix := strings.TrimSuffix(l.StreamName(0), "0")
	sort.Strings(names)
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		p, ok := parseNumber(rest)
		if !ok || p < from {
			continue
		}
		stream, err := jsa.streamInfo(ctx, name)
		switch {
		case api.IsNatsError(err, errCodeStreamNotFound):
			continue
		case err != nil:
			return out, fmt.Errorf("load stream %s: %w", name, err)
		}
		if o, _ := judgeOwner(l.Owner, stream.Config.Metadata); o == ownedElsewhere {
			continue
		}
		if p >= l.Partitions {
			out.streams = append(out.streams, name)
		}
		consumers, _, err := jsa.consumers(ctx, name)
		if err != nil {
			return out, fmt.Errorf("list consumers of stream %s: %w", name, err)
		}
		for _, c := range consumers {
			s, ok := l.ParseConsumerDurable(p, c.Name)
			if !ok {
				continue
			}
			if o, _ := judgeOwner(l.Owner, c.Config.Metadata); o == ownedElsewhere {
				continue
			}
			if from == 0 || p >= l.Partitions {
				out.units = append(out.units, Unit{Partition: p, Shard: s})
			}
		}
	}
	sortUnits(out.units)
	return out, nil
}

// provisionPartition provisions partition p's stream (with max_consumers
// maxc) and unit consumers and returns the consumers it left alone because
// another topology owns them.
func provisionPartition(ctx context.Context, nc *nats.Conn, l Layout, o ProvisionOptions, p, maxc int, rep *Report) ([]ForeignObject, error) {
	jsa := jsAPI{nc}
	name := l.StreamName(p)
	meta, err := provisionStream(ctx, jsa, l, o, p, maxc, rep)
	if err != nil {
		return nil, err
	}

	existing, offline, err := jsa.consumers(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("list consumers of stream %s: %w", name, err)
	}
	have := make(map[string]api.ConsumerConfig, len(existing))
	var foreign []ForeignObject
	for _, c := range existing {
		cfg := c.Config
		if o, got := judgeOwner(l.Owner, cfg.Metadata); o == ownedElsewhere {
			if _, ours := l.ParseConsumerDurable(p, c.Name); ours {
				foreign = append(foreign, ForeignObject{Object: consumerObject(name, c.Name), Owner: got})
			}
			continue
		}
		have[c.Name] = cfg
	}
	isForeign := func(durable string) bool {
		return slices.ContainsFunc(foreign, func(f ForeignObject) bool { return f.Object == consumerObject(name, durable) })
	}
	for cname, reason := range offline {
		// An offline consumer exists but cannot be read: creating it again
		// would fail, and comparing it is impossible.
		rep.Findings = append(rep.Findings, Finding{Object: consumerObject(name, cname), Field: "offline", Want: "online", Got: reason})
	}

	js, err := jetstream.New(nc)
	if err != nil {
		return foreign, fmt.Errorf("open JetStream: %w", err)
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
		if _, off := offline[want.Durable]; off || isForeign(want.Durable) {
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
		return foreign, err
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
	return foreign, nil
}

// provisionStream creates or corrects partition p's stream, with
// max_consumers maxc, and returns its metadata (where retired unit
// consumers would resume).
func provisionStream(ctx context.Context, jsa jsAPI, l Layout, o ProvisionOptions, p, maxc int, rep *Report) (map[string]string, error) {
	want := l.StreamConfig(p)
	want.MaxConsumers = maxc
	stream, err := jsa.streamInfo(ctx, want.Name)
	switch {
	case api.IsNatsError(err, errCodeStreamNotFound):
		if err := jsa.createStream(ctx, want); err != nil {
			return nil, fmt.Errorf("create stream %s: %w%s", want.Name, err, maxConsumersHint(err, want))
		}
		rep.Created = append(rep.Created, streamObject(want.Name))
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("load stream %s: %w", want.Name, err)
	}
	got := stream.Config
	// A replicated stream's transform changes only through the switch,
	// which a stream found paused also finishes.
	if l.Assignment == AssignByTransform && got.Replicas > 1 &&
		(l.paused(p, got) || !sameTransform(got.SubjectTransform, want.SubjectTransform)) {
		was := got
		if got, err = switchTransform(ctx, jsa, o, l, p, got); err != nil {
			return nil, err
		}
		fs, _ := streamDrift(got, was, true)
		for _, f := range fs {
			if f.Field == "subject_transform" {
				rep.Findings = append(rep.Findings, f)
			}
		}
		rep.Updated = append(rep.Updated, streamObject(want.Name))
	}
	fs, next := streamDrift(want, got, l.Assignment == AssignByTransform)
	rep.Findings = append(rep.Findings, fs...)
	if next == nil {
		return got.Metadata, nil
	}
	if err := jsa.updateStream(ctx, *next); err != nil {
		return nil, fmt.Errorf("update stream %s: %w%s", want.Name, err, maxConsumersHint(err, want))
	}
	rep.Updated = append(rep.Updated, streamObject(want.Name))
	return got.Metadata, nil
}

// maxConsumersHint says the way out when the server refused a stream's
// max_consumers: the account's own JetStream consumer limit is lower.
func maxConsumersHint(err error, want api.StreamConfig) string {
	if !api.IsNatsError(err, errCodeMaxConsumers) {
		return ""
	}
	return fmt.Sprintf(" (max_consumers %d is above the account's JetStream consumer limit: raise the account's limit to at least %d)",
		want.MaxConsumers, want.MaxConsumers)
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

// requestContext bounds one request by requestTimeout, or by ctx's own
// deadline when that comes first.
func requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, requestTimeout)
}
