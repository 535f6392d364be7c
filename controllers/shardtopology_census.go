package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The census (design.md section 6, promise P4) reads every NATS server's
// version through the system account. The operator takes one at least
// every CensusInterval (at the topology's slot), after every epoch
// activation and spec change, off the reconcile path (census_runs.go), and
// publishes its verdict in the registry at the reconcile after each one
// finished: workers RESET a consumer on takeover only under a verdict that
// allows it and is younger than their own bound. Without system
// credentials, or when the census fails, the verdict refuses RESET (fail
// closed); takeover then waits for ack_wait. A floor not met does not stall
// the topology: it only turns RESET off. The census also counts each unit
// consumer's pending rows, which status uses to find owned units whose
// rows wait; the first reconcile after an operator start starts one, so
// those counts exist.

// DefaultCensusInterval is how often the census runs when nothing else
// asks for one.
const DefaultCensusInterval = 30 * time.Second

// censusTimeout bounds a whole census (each server has
// natsops.DefaultCensusTimeout to answer).
const censusTimeout = 10 * time.Second

// censusReport is one census and the verdict published from it.
type censusReport struct {
	// noSystemCredentials: spec.nats.systemCredentialsSecretRef is unset.
	noSystemCredentials bool
	// failed says why no census could be taken.
	failed string
	census *natsops.Census
	// allowed and reason are the verdict published for the workers;
	// blockedBy is its metric label ("" when allowed).
	allowed   bool
	reason    string
	blockedBy string
}

// censusDue reports whether a census should run now, and if not, when.
// Unless something asks for one, a census falls due at the topology's slot
// (censusSlot), at most CensusInterval after the last.
func (r *ShardTopologyReconciler) censusDue(s *scope) (bool, time.Duration) {
	st := s.topo.Status
	interval := r.censusInterval()
	_, taken := r.conns().pendingRows(s.key)
	switch {
	case r.conns().censusDue(s.key), s.census != nil:
		return true, 0
	case !taken:
		return true, 0 // the first since this process started: pending rows are unknown
	case st.Census == nil || st.Census.ObservedAt == nil:
		return true, 0
	case st.ObservedGeneration != s.topo.Generation:
		return true, 0 // the floor or the NATS servers may have changed
	}
	last := r.conns().lastCensusAt(s.key, st.Census.ObservedAt.Time)
	if s.now.Before(last) {
		return true, 0 // a clock step back: the census's age is unknown
	}
	wait := nextCensusAt(last, interval, censusSlot(s.key, interval)).Sub(s.now)
	if wait <= 0 {
		return true, 0
	}
	return false, wait
}

// takeCensus publishes the RESET verdict of a census that finished and
// still answers the current question, and starts a census when one is due
// (off the reconcile path: census_runs.go).
func takeCensus(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	rep, wait := r.censusToPublish(ctx, s)
	if rep == nil {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	rep.judge()
	if err := s.reg.PublishResetPermission(ctx, s.registryKey(), rep.permission(time.Now())); err != nil {
		return ctrl.Result{}, fmt.Errorf("publish RESET permission: %w", err)
	}
	r.conns().setCensusDue(s.key, false)
	s.pending = r.conns().addPendingRows(s.key, s.pendingRows(rep.census), stallBound(s.snap.Params))
	s.flow = nil
	recordResetVerdict(s.key, rep.blockedBy)
	s.census = rep
	if rep.census != nil && !rep.census.FloorMet() && !belowFloorBefore(s) {
		r.event(s, eventWarning, "CensusBelowFloor", "Census",
			"servers below the version floor %s: %s; RESET-based takeover is off, takeover waits for ack_wait (%s)",
			rep.census.Floor, serversWithVersions(rep.census, 6), s.topo.Spec.NATS.AckWaitOrDefault())
	}
	next := r.censusInterval()
	if rep.census != nil {
		r.conns().setCensusTakenAt(s.key, rep.census.TakenAt)
		next = time.Until(nextCensusAt(rep.census.TakenAt, next, censusSlot(s.key, next)))
	}
	return ctrl.Result{RequeueAfter: max(next, pollFast)}, nil
}

// censusToPublish returns the census whose verdict this reconcile
// publishes, or nil and when to look again. A finished census is published
// if it answers the current question, whether or not another is due; a
// verdict needing no NATS (no system connection) is made at once.
func (r *ShardTopologyReconciler) censusToPublish(ctx context.Context, s *scope) (*censusReport, time.Duration) {
	var (
		refs []natsops.ConsumerRef
		q    censusQuestion
	)
	stale := false // a census was dropped for answering another question
	if s.census == nil && s.topo.Spec.NATS.SystemCredentialsSecretRef != nil {
		refs = s.censusConsumers()
		q = s.censusQuestion(refs)
		if run := r.conns().census(s.key); run != nil {
			rep := run.finished()
			switch {
			case run.question != q:
				r.conns().dropCensus(s.key, run)
				stale = true
			case rep != nil:
				r.conns().dropCensus(s.key, run)
				return rep, 0
			default:
				return nil, censusTimeout // running; it wakes the topology when done
			}
		}
	}
	due, wait := r.censusDue(s)
	switch {
	case !due && !stale:
		return nil, wait
	case s.census != nil:
		// Connect could not open the system connection: fail closed.
		return s.census, 0
	case s.topo.Spec.NATS.SystemCredentialsSecretRef == nil:
		return &censusReport{noSystemCredentials: true}, 0
	}
	sys, nc, floor, logger := s.sys, s.nc, q.floor, log.FromContext(ctx)
	r.conns().startCensus(s.key, q, func(ctx context.Context) *censusReport {
		return census(log.IntoContext(ctx, logger), sys, nc, floor, refs)
	}, r.censusWaker(s.key))
	return nil, censusTimeout
}

// census takes one census of the servers hosting refs, the unit consumers
// of the active and pending epochs (or the spec's, before any epoch
// exists). It runs outside any reconcile, so it touches nothing but its
// arguments.
func census(ctx context.Context, sys, nc *nats.Conn, floor string, refs []natsops.ConsumerRef) *censusReport {
	if sys == nil {
		return &censusReport{failed: "no system account connection"}
	}
	cctx, cancel := context.WithTimeout(ctx, censusTimeout)
	defer cancel()
	// The unit consumers are listed per stream through the topology's own
	// connection, so a census reads this topology's consumers only, not
	// every consumer of the NATS cluster (issue 23).
	c, err := natsops.TakeCensus(cctx, sys, natsops.CensusOptions{Floor: floor, Consumers: refs, JetStream: nc})
	if err != nil {
		msg := err.Error()
		switch {
		case !sys.IsConnected():
			// No server answers at all: credentials are not the question.
			msg = fmt.Sprintf("NATS servers unreachable: the system-account connection is %s: %v", natsStatusText(sys.Status()), err)
		case errors.Is(err, natsops.ErrNoReplies):
			msg += "; spec.nats.systemCredentialsSecretRef must name a system-account user"
		}
		log.FromContext(ctx).Info("Census failed; RESET refused", "error", msg)
		return &censusReport{failed: msg}
	}
	return &censusReport{census: c}
}

// censusConsumers are the unit consumers a RESET could be asked for.
func (s *scope) censusConsumers() []natsops.ConsumerRef {
	seen := map[natsops.ConsumerRef]bool{}
	var refs []natsops.ConsumerRef
	add := func(l natsops.Layout) {
		for _, ref := range l.Consumers() {
			if !seen[ref] {
				seen[ref] = true
				refs = append(refs, ref)
			}
		}
	}
	switch {
	case s.snap == nil || (s.snap.Active == nil && s.snap.Pending == nil):
		add(layoutFor(s.topo, s.target()))
	default:
		for _, e := range []*poolctl.Epoch{s.snap.Active, s.snap.Pending} {
			if e != nil {
				add(layoutFor(s.topo, epochTopology(e)))
			}
		}
	}
	return refs
}

// judge sets the verdict: RESET is allowed only when the census met the
// floor and allows RESET of every inspected consumer
// (natsops.Census.ResetVerdict).
func (rep *censusReport) judge() {
	switch {
	case rep.noSystemCredentials:
		rep.allowed, rep.reason, rep.blockedBy = false, "no system credentials", resetBlockedNoSystemCredentials
		return
	case rep.failed != "":
		rep.allowed, rep.reason, rep.blockedBy = false, "census failed: "+rep.failed, resetBlockedCensusFailed
		return
	}
	v := rep.census.ResetVerdict()
	switch {
	case !rep.census.FloorMet():
		rep.allowed, rep.blockedBy = false, resetBlockedBelowFloor
		rep.reason = fmt.Sprintf("below floor %s: %s", rep.census.Floor, serversWithVersions(rep.census, 4))
	case !v.Allowed:
		rep.allowed, rep.reason, rep.blockedBy = false, v.Reason, resetBlockedConsumerNotCovered
	default:
		rep.allowed, rep.reason, rep.blockedBy = true, v.Reason, ""
	}
}

// permission is the verdict as the registry publishes it to the workers:
// with the floor and every server's version, so a worker's GuardedReset
// checks the consumer's hosts at the moment it would RESET (P4), and with
// the census's age as of now, counted from its first reply.
func (rep *censusReport) permission(now time.Time) poolctl.ResetPermission {
	p := poolctl.ResetPermission{Allowed: rep.allowed, Reason: rep.reason}
	if rep.census == nil {
		return p
	}
	v := rep.census.ResetVerdict()
	p.Floor, p.Servers = v.Floor, v.Servers
	p.CensusAge = max(0, now.Sub(v.TakenAt))
	return p
}

// pendingRows is what the census counted pending in the active epoch's
// unit consumers, on the registry's clock; nil without a census.
func (s *scope) pendingRows(c *natsops.Census) *pendingRows {
	if c == nil || s.snap == nil || s.snap.Active == nil {
		return nil
	}
	active := epochTopology(s.snap.Active)
	l := layoutFor(s.topo, active)
	// An index, not c.Consumer per unit: that scans every placement, which
	// at 4096 units made this loop quadratic.
	found := make(map[natsops.ConsumerRef]uint64, len(c.Consumers))
	for _, cp := range c.Consumers {
		if cp.Found {
			found[cp.ConsumerRef] = cp.Pending
		}
	}
	p := &pendingRows{at: c.TakenAt.Add(s.regOffset), units: make(map[string]uint64, active.Len())}
	for _, u := range active.Units() {
		if n, ok := found[l.ConsumerRef(natsops.Unit{Partition: u.Partition, Shard: u.Shard})]; ok {
			p.units[u.String()] = n
		}
	}
	return p
}

// belowFloorBefore reports whether status already said the floor is not
// met, so CensusBelowFloor is an event per transition, not per census.
func belowFloorBefore(s *scope) bool {
	c := s.topo.Status.Census
	return c != nil && len(c.BelowFloor) > 0
}

// serversWithVersions names up to n servers below the floor with their
// versions.
func serversWithVersions(c *natsops.Census, n int) string {
	var out []string
	for _, name := range c.BelowFloor {
		if s, ok := c.Server(name); ok {
			out = append(out, fmt.Sprintf("%s (%s)", name, s.Version))
		} else {
			out = append(out, name)
		}
	}
	if len(out) == 0 && c.MinVersion == natsops.UnknownVersion {
		return "a server whose version is unknown"
	}
	return firstN(out, n)
}

// censusServers lists every server of the census for status, at most
// the API's 256.
func censusServers(c *natsops.Census) []topologyv1.CensusServer {
	var out []topologyv1.CensusServer
	for _, s := range c.Servers {
		if len(out) == 256 {
			break
		}
		out = append(out, topologyv1.CensusServer{Name: s.Name, Version: s.Version, Cluster: s.Cluster, Role: string(s.Role), BelowFloor: s.BelowFloor})
	}
	return out
}

func countedServers(c *natsops.Census) int {
	n := 0
	for _, s := range c.Servers {
		if s.Counted {
			n++
		}
	}
	return n
}

// censusFindings summarises what the census could not see.
func censusFindings(c *natsops.Census) string {
	if len(c.Findings) == 0 {
		return ""
	}
	return strings.Join(c.Findings[:min(2, len(c.Findings))], "; ")
}
