package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/history"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// runIndependent is the baseline the end-to-end test compares against:
// what a fleet with a fixed replica count does when it hashes on its own.
// The worker places the units of the N and V it was started with by capped
// rendezvous (ownership.Place, the project's own hash, so the comparison is
// about sequencing and not about hash quality) over the fixed slots
// 0..replicas-1, and pulls the units on its slot, its StatefulSet ordinal
// (independentUnits). It has no registry, no claims and no fencing: it
// UNPINs each unit's consumer once at start, pulls, and writes unguarded.
// A pod restart with a new N or V is the only way a change reaches it;
// while old and new pods run side by side they disagree on the units whose
// slot differs between the two placements, which are then pulled by two
// pods or by none. It exists to be measured, not used.
func runIndependent(ctx context.Context, cfg config, log logr.Logger) (err error) {
	// First in, last out, as in run.
	rec, err := openHistory(cfg)
	if err != nil {
		return err
	}
	defer closeHistory(rec, &err)
	ordinal, err := podOrdinal(cfg.member)
	if err != nil {
		return err
	}
	topo := ownership.Topology{Partitions: cfg.partitions, Shards: cfg.shards}
	mine, err := independentUnits(topo, cfg.replicas, ordinal)
	if err != nil {
		return err
	}

	nc, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.sinkDSN)
	if err != nil {
		return fmt.Errorf("open sink: %w", err)
	}
	defer pool.Close()
	if err := createSinkTable(ctx, pool); err != nil {
		return err
	}
	srv, err := serveIndependentStatus(cfg, mine)
	if err != nil {
		return err
	}
	defer srv.Close()

	layout := natsops.Layout{SubjectPrefix: cfg.subjectPrefix, ConsumerName: cfg.consumerName}
	log.Info("Independent worker starting", "ordinal", ordinal, "units", len(mine), "topology", topo.String())
	var wg sync.WaitGroup
	for _, u := range mine {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pullIndependently(ctx, js, pool, layout.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard}), u, cfg, rec, log)
		}()
	}
	wg.Wait()
	return nil
}

// independentUnits returns the units the pod with this ordinal pulls under
// the baseline: those capped rendezvous puts on slot ordinal when topo's
// units are placed over the fixed slots 0..replicas-1. The slot set is the
// replica count, not the pods seen alive, because a fleet that hashes on
// its own knows only its configuration; every pod of one configuration
// computes the same placement, so together they pull every unit once.
func independentUnits(topo ownership.Topology, replicas, ordinal int) ([]ownership.Unit, error) {
	if err := topo.Validate(); err != nil {
		return nil, fmt.Errorf("%w: --partitions/--shards: %w", errBadFlag, err)
	}
	if replicas < 1 || ordinal < 0 || ordinal >= replicas {
		return nil, fmt.Errorf("%w: ordinal %d is not one of the fixed slots 0..%d (--replicas %d)", errBadFlag, ordinal, replicas-1, replicas)
	}
	slots := make([]ownership.Slot, replicas)
	for i := range slots {
		slots[i] = ownership.Slot(i)
	}
	return ownership.Place(topo.Units(), slots).UnitsOf(ownership.Slot(ordinal)), nil
}

// pullIndependently pulls the unit and writes until ctx ends; nothing
// checks that another pod still pulls it. On a pinned consumer it takes the
// pin once, at start; on a plain pull consumer (what fleets hashing on
// their own run) every pod that pulls gets rows.
// It records its deliveries in the same history as the SDK does (with no
// claim: epoch 0), so the checker judges both strategies alike.
func pullIndependently(ctx context.Context, js jetstream.JetStream, pool *pgxpool.Pool, ref natsops.ConsumerRef, u ownership.Unit, cfg config, rec *history.FileRecorder, log logr.Logger) {
	record := func(r history.Record) {
		if rec != nil {
			r.Unit, r.Member = u.String(), cfg.member
			rec.Record(r)
		}
	}
	var cons jetstream.Consumer
	missing := false
	for ctx.Err() == nil {
		if cons == nil {
			c, err := js.Consumer(ctx, ref.Stream, ref.Name)
			if err != nil {
				// Said once: a worker asking for a consumer nobody
				// provisioned (a wrong subject prefix) pulls nothing.
				if !missing && ctx.Err() == nil {
					log.Error(err, "Unit consumer not found yet; asking again", "unit", u.String(), "stream", ref.Stream, "consumer", ref.Name)
					missing = true
				}
				time.Sleep(200 * time.Millisecond)
				continue
			}
			cons = c
			if pinned(cons) {
				// Take the pin once, at start; nothing re-checks it.
				if s, err := js.Stream(ctx, ref.Stream); err == nil {
					_ = s.UnpinConsumer(ctx, ref.Name, natsops.PriorityGroup)
				}
			}
		}
		opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(time.Second)}
		if pinned(cons) {
			opts = append(opts, jetstream.FetchPriorityGroup(natsops.PriorityGroup))
		}
		start := history.Now()
		batch, err := cons.Fetch(cfg.fetchBatch, opts...)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		rows := 0
		for msg := range batch.Messages() {
			rows++
			row := worker.Row{Unit: u, Headers: msg.Headers()}
			if md, err := msg.Metadata(); err == nil {
				row.StreamSeq, row.NumDelivered = md.Sequence.Stream, md.NumDelivered
			}
			id := worker.DefaultRowID(row)
			record(history.Record{Kind: history.KindDeliver, RowID: id, StreamSeq: row.StreamSeq, NumDelivered: row.NumDelivered,
				Start: history.Now(), Fetch: start})
			if _, err := pool.Exec(ctx, insertUnguarded, id, u.String(), cfg.member); err != nil {
				continue
			}
			at := history.Now()
			err := msg.Ack()
			record(history.Record{Kind: history.KindAck, RowID: id, StreamSeq: row.StreamSeq, NumDelivered: row.NumDelivered,
				Detail: errDetail(err), Start: at, End: history.Now()})
		}
		record(history.Record{Kind: history.KindFetch, Rows: rows, Start: start, End: history.Now()})
	}
}

// pinned says the consumer serves one pinned client of the priority group
// (the operator's consumers); a plain pull consumer serves every puller.
func pinned(c jetstream.Consumer) bool {
	return c.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPinned
}

func errDetail(err error) string {
	if err != nil {
		return err.Error()
	}
	return ""
}

// insertUnguarded is the baseline's write: no claim, no epoch.
const insertUnguarded = `INSERT INTO shardkeeper_sink_writes (id, unit, member, epoch) VALUES ($1, $2, $3, 0)`

// serveIndependentStatus reports the units this worker believes it owns,
// in the same shape as the sequenced worker's /status.
func serveIndependentStatus(cfg config, mine []ownership.Unit) (*http.Server, error) {
	st := worker.Status{Member: cfg.member, Slot: -1, Held: map[string]int64{}}
	for _, u := range mine {
		st.Held[u.String()] = 0
	}
	mux := http.NewServeMux()
	ok := func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	mux.HandleFunc("/status", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(st)
	})
	l, err := net.Listen("tcp", cfg.healthAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.healthAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("status server:", err)
		}
	}()
	return srv, nil
}

// podOrdinal is the StatefulSet ordinal at the end of a pod name.
func podOrdinal(pod string) (int, error) {
	i := strings.LastIndexByte(pod, '-')
	n, err := strconv.Atoi(pod[i+1:])
	if i < 0 || err != nil || n < 0 {
		return 0, fmt.Errorf("%w: --member %q does not end in a StatefulSet ordinal", errBadFlag, pod)
	}
	return n, nil
}
