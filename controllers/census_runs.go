package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
)

// A census reads every NATS server and lists the topology's unit
// consumers: at 4096 units that is tens of replies and megabytes, and it
// waited up to 0.9 s at p99 in `make bench` row e, where ten topologies'
// censuses came due together and queued on one nats-server. So a census
// runs off the reconcile path (issue 23): the Census step starts one in
// its own goroutine and returns; the goroutine wakes the topology when it
// is done, and the next reconcile publishes its verdict. Publication stays
// in the reconcile, under the operator's registry token, so the RESET
// verdict still has one writer; a census only reads.
//
// A finished census is published only if it still answers the question the
// reconcile would ask now (censusQuestion): the same connections, floor
// and unit consumers. One that does not (a spec change, an activation, a
// Secret rotated while it ran) is dropped and a new one started. A census
// asked for explicitly (setCensusDue) drops the one running, so what is
// published after the ask was started after it.

// censusQuestion is what a census was asked: with which connections, under
// which floor, about which consumers.
type censusQuestion struct {
	sys, nc   *nats.Conn
	floor     string
	consumers string // hash of the consumer references, in order
}

// censusQuestion is the census this reconcile would take of refs (its
// censusConsumers).
func (s *scope) censusQuestion(refs []natsops.ConsumerRef) censusQuestion {
	h := sha256.New()
	for _, ref := range refs {
		h.Write([]byte(ref.Stream))
		h.Write([]byte{0})
		h.Write([]byte(ref.Name))
		h.Write([]byte{0})
	}
	return censusQuestion{sys: s.sys, nc: s.nc, floor: s.topo.Spec.NATS.VersionFloorOrDefault(), consumers: hex.EncodeToString(h.Sum(nil))}
}

// censusRun is one census running off the reconcile path, and its report
// once done.
type censusRun struct {
	question censusQuestion
	cancel   context.CancelFunc
	done     chan struct{}
	rep      *censusReport // written once, before done closes
}

// finished returns the run's report, nil while it runs.
func (run *censusRun) finished() *censusReport {
	select {
	case <-run.done:
		return run.rep
	default:
		return nil
	}
}

// maxConcurrentCensuses bounds the censuses one operator runs at once, as
// MaxConcurrentReconciles bounded them while they ran in the reconcile: at
// an operator start every topology's census is due, and a hundred at once
// against one nats-server would time out together.
const maxConcurrentCensuses = 4

// startCensus starts take in its own goroutine as the topology's census,
// dropping (and cancelling) the one before, and calls wake when it is done.
// It waits its turn among maxConcurrentCensuses.
func (c *Connections) startCensus(key types.NamespacedName, q censusQuestion, take func(context.Context) *censusReport, wake func()) {
	ctx, cancel := context.WithCancel(context.Background())
	run := &censusRun{question: q, cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if c.censusTurns == nil {
		c.censusTurns = make(chan struct{}, maxConcurrentCensuses)
	}
	turns := c.censusTurns
	c.mu.Unlock()
	e := c.entry(key)
	e.mu.Lock()
	e.dropCensusLocked()
	e.census = run
	e.mu.Unlock()
	go func() {
		defer cancel()
		select {
		case turns <- struct{}{}:
			run.rep = take(ctx)
			<-turns
		case <-ctx.Done():
			run.rep = &censusReport{failed: "dropped before it ran"}
		}
		close(run.done)
		if ctx.Err() == nil {
			wake()
		}
	}()
}

// dropCensusLocked cancels and forgets the topology's census run; e.mu is
// held.
func (e *topologyConns) dropCensusLocked() {
	if e.census != nil {
		e.census.cancel()
		e.census = nil
	}
}

// census returns the topology's census run, nil when none.
func (c *Connections) census(key types.NamespacedName) *censusRun {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.census
}

// dropCensus forgets run (cancelling it) if it is still the topology's.
func (c *Connections) dropCensus(key types.NamespacedName, run *censusRun) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.census == run {
		e.census = nil
	}
	run.cancel()
}

// setCensusTakenAt records when the census just published was taken.
func (c *Connections) setCensusTakenAt(key types.NamespacedName, at time.Time) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.censusTakenAt = at
}

// lastCensusAt is when the topology's last census was taken: status's
// time, or this process's own record of it when later. Status keeps whole
// seconds; from its time alone a census taken a fraction of a second
// after its slot would find that slot still ahead and run again at once.
func (c *Connections) lastCensusAt(key types.NamespacedName, status time.Time) time.Time {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.censusTakenAt.After(status) {
		return e.censusTakenAt
	}
	return status
}

// censusWaker returns the function a finished census of key calls: it
// queues a reconcile of the topology, or does nothing when the reconciler
// runs without a manager (tests calling Reconcile themselves).
func (r *ShardTopologyReconciler) censusWaker(key types.NamespacedName) func() {
	ch := r.censusDone
	if ch == nil {
		return func() {}
	}
	return func() {
		// The channel source drains into the work queue; a full
		// buffer means the controller stopped, so do not block on it.
		select {
		case ch <- event.TypedGenericEvent[types.NamespacedName]{Object: key}:
		case <-time.After(censusTimeout):
		}
	}
}

// censusSlot is when, within every interval, the topology's census falls
// due: spread by a hash of its key, so topologies the operator started
// together do not take their censuses together (in `make bench` row e ten
// of them queued on one nats-server every 30 s).
func censusSlot(key types.NamespacedName, interval time.Duration) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(key.String()))
	return time.Duration(h.Sum64() % uint64(interval))
}

// nextCensusAt is the first time after taken that falls on the topology's
// slot: never more than interval after taken.
func nextCensusAt(taken time.Time, interval, slot time.Duration) time.Time {
	// Slots are the instants slot past a multiple of interval since Go's
	// zero time (time.Truncate's reference), the same in every process.
	base := taken.Truncate(interval).Add(slot)
	for !base.After(taken) {
		base = base.Add(interval)
	}
	return base
}
