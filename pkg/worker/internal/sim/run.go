package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

var (
	errTimeout = errors.New("registry call timed out (outcome unknown)")
	errRefused = errors.New("registry refused the connection")
)

func podName(i int) string { return fmt.Sprintf("w-%d", i) }

// Result is one run's outcome.
type Result struct {
	Seed int64
	// Violations are every failed check, earliest first where they have
	// an instant; empty when the run passed.
	Violations []string
	// Injected counts the faults that took effect, by kind.
	Injected map[FaultKind]int
	// Enabled is the seed's swarm choice of fault kinds.
	Enabled []FaultKind
	// Events is how many events ran.
	Events int
	// Trace is the run's event log (Config.Trace only).
	Trace []string
	// FaultOrdinals is how many per-message faults were drawn; Planned
	// how many planned instances there were (for the shrinker).
	FaultOrdinals, Planned int
}

// CaughtBy names the check of a violation message: what comes before its
// detail ("P5", "historycheck stale acks (P1)", "liveness (rows)").
func CaughtBy(violation string) string {
	_, rest, ok := strings.Cut(violation, ": ")
	if !ok {
		return violation
	}
	check, _, _ := strings.Cut(rest, ": ")
	return check
}

// Failed reports whether any check failed.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// First is the first violation, "" when none.
func (r Result) First() string {
	if len(r.Violations) == 0 {
		return ""
	}
	return r.Violations[0]
}

// Run runs one seed.
func Run(cfg Config) (res Result) {
	w := newWorld(cfg)
	defer func() {
		if r := recover(); r != nil {
			res = Result{Seed: cfg.Seed, Violations: []string{fmt.Sprintf("simulator panic: %v", r)}, Trace: w.trace}
		}
	}()
	w.quietAt = w.plan.quiet
	liveAt := w.quietAt + int64(Params.LeaseTTL+Params.Grace) + 5*sec
	w.end = liveAt + ackWait + 2*sec
	for i := range w.plan.members {
		name := podName(i)
		w.s.at(w.s.between(0, 200*ms), nil, func() { w.startProcess(name) })
	}
	w.schedulePlan()
	w.schedulePublisher()
	w.s.at(w.quietAt, nil, w.publishProbes)
	w.s.at(liveAt, nil, func() { w.checkLiveness(liveAt) })
	w.s.at(250*ms, nil, w.operatorStep)
	for w.s.step(w.end) {
	}
	if w.s.stuck {
		// Judged all the same, on the evidence so far: the storm may
		// follow an earlier violation.
		w.violate("event storm: %d events, %d at this one instant (a member asking for a timer at an instant already past, say, for ever)",
			w.s.runs, w.s.sameInstant)
	}
	w.judge()
	res = Result{Seed: cfg.Seed, Violations: w.fail, Injected: w.injected, Events: w.s.runs, Trace: w.trace,
		FaultOrdinals: w.faultOrd, Planned: len(w.plan.list)}
	for _, k := range FaultKinds {
		if w.plan.enabled[k] {
			res.Enabled = append(res.Enabled, k)
		}
	}
	return res
}

// violate records a failed check.
func (w *world) violate(format string, args ...any) {
	msg := fmt.Sprintf("at %s: ", time.Duration(w.s.now)) + fmt.Sprintf(format, args...)
	w.tracef("VIOLATION %s", msg)
	w.fail = append(w.fail, msg)
}

// schedulePublisher publishes rows to random active units until the
// faults stop.
func (w *world) schedulePublisher() {
	var next func()
	next = func() {
		if w.s.now >= w.quietAt {
			return
		}
		var id, u string
		if w.order != nil {
			id, u = w.publishOrdered()
		} else {
			u = w.units[w.s.rng.IntN(len(w.units))]
			id = w.publish(u)
		}
		w.tracef("publish %s to %s", id, u)
		w.s.after(w.publishGap(), nil, next)
	}
	w.s.at(w.s.between(0, 300*ms), nil, next)
}

// publishProbes publishes one row to every active unit once the faults
// stopped: each must reach the sink within lease + grace + 5s.
func (w *world) publishProbes() {
	for _, u := range w.units {
		var id string
		if w.order != nil {
			id = w.publishProbe(u, w.activeN())
		} else {
			id = w.publish(u)
		}
		w.probes[id] = w.s.now
		w.tracef("probe %s to %s", id, u)
	}
}

// freeze is the operator's topology change: a pending epoch (with one
// more shard per partition when grow, or one more partition in a run
// that changes N), activated once every live member acknowledged it.
func (w *world) freeze(grow bool) {
	if w.pendingEpoch != 0 {
		return // one change at a time: the operator waits for the last
	}
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	if w.barrierUp(snap) {
		return // and for the last change's order barrier
	}
	target := ownership.Topology{Partitions: snap.Active.Partitions, Shards: snap.Active.Shards}
	switch {
	case grow && w.order != nil && w.order.changesN:
		target.Partitions = min(target.Partitions+1, maxPartitions)
	case grow && target.Shards < 3:
		target.Shards++
	}
	e, err := w.createPending(snap.Active, target)
	must(err)
	w.tracef("operator: epoch %d (%s) pending", e, target)
	w.pendingEpoch, w.pendingSince = e, w.s.now
}

// epochShape is e's N x V.
func epochShape(e *poolctl.Epoch) ownership.Topology {
	return ownership.Topology{Partitions: e.Partitions, Shards: e.Shards}
}

// activeN is the active epoch's N.
func (w *world) activeN() int {
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	return snap.Active.Partitions
}

// operatorStep tries to activate the pending epoch every 250ms.
func (w *world) operatorStep() {
	w.barrierStep()
	if w.pendingEpoch != 0 {
		before, serr := w.twin.Snapshot(context.Background(), topology)
		must(serr)
		err := w.twin.Activate(context.Background(), topology, w.pendingEpoch)
		var fi *poolctl.FreezeIncompleteError
		switch {
		case err == nil:
			snap, serr := w.twin.Snapshot(context.Background(), topology)
			must(serr)
			w.setUnits(snap.Active.Partitions, snap.Active.Shards)
			w.activatedAt[w.pendingEpoch] = w.s.now
			w.tracef("operator: epoch %d active", w.pendingEpoch)
			w.activated(w.pendingEpoch, epochShape(before.Active), epochShape(snap.Active))
			w.pendingEpoch = 0
		case errors.As(err, &fi):
		default:
			panic(err)
		}
	}
	w.s.after(250*ms, nil, w.operatorStep)
}

// checkLiveness is the liveness judgement once lease + grace + 5s passed
// since the last fault: every probe row written, every freeze
// acknowledged (the epoch active), no puller running for a unit its
// process does not hold.
func (w *world) checkLiveness(at int64) {
	written := map[string]bool{}
	for _, s := range w.sink {
		written[s.RowID] = true
	}
	var missing []string
	for id := range w.probes {
		if !written[id] {
			missing = append(missing, fmt.Sprintf("%s (unit %s)", id, w.published[id]))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		w.violate("liveness (rows): %d probe rows published at %s not in the sink %s after the last fault: %v",
			len(missing), time.Duration(w.quietAt), time.Duration(at-w.quietAt), missing)
	}
	if w.pendingEpoch != 0 {
		snap, err := w.twin.Snapshot(context.Background(), topology)
		must(err)
		var acked []string
		if snap.Pending != nil {
			acked = snap.Pending.Acked
		}
		w.violate("liveness (freeze): epoch %d pending since %s is not active %s after the last fault (acknowledged by %v)",
			w.pendingEpoch, time.Duration(w.pendingSince), time.Duration(at-w.quietAt), acked)
	}
	w.checkPullers("liveness (pullers)")
}

// checkPullers finds pullers running for a unit their process does not
// hold in the registry.
func (w *world) checkPullers(what string) {
	claims, err := w.twin.Claims(context.Background(), topology)
	must(err)
	snap, err := w.twin.Snapshot(context.Background(), topology)
	must(err)
	byUnit := map[string]poolctl.ClaimInfo{}
	for _, c := range claims {
		byUnit[c.Unit] = c
	}
	for _, p := range w.procs {
		if p.dead || p.cut(w.s.now) || p.pausedUntil > w.s.now {
			continue // it cannot know yet
		}
		units := make([]string, 0, len(p.pullers))
		for u := range p.pullers {
			units = append(units, u)
		}
		sort.Strings(units)
		for _, u := range units {
			pl := p.pullers[u]
			if pl.done || pl.mode != running {
				continue
			}
			c := byUnit[u]
			m := snap.Member(p.name)
			held := c.State != poolctl.StateFree && c.Owner == p.name && c.Epoch == pl.tok.Epoch &&
				c.OwnerIncarnation == pl.inc && m != nil && m.Incarnation == pl.inc && m.Live
			if !held {
				w.violate("%s: %s runs a puller of unit %s at epoch %d (incarnation %d), but the claim is %s's at epoch %d (%s, incarnation %d)",
					what, p.id, u, pl.tok.Epoch, pl.inc, c.Owner, c.Epoch, c.State, c.OwnerIncarnation)
			}
		}
	}
}
