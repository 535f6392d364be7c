package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/faultproxy"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Scenario 14 (issue 22): the registry's PostgreSQL fails over to a
// standby that missed the last commits. Each variant runs on its own
// primary and a streaming standby made with pg_basebackup -R, whose WAL
// stream passes through a proxy the test holds: the standby then lags by
// exactly the commits made while ownership moves. The primary is
// SIGKILLed, the standby promoted, and the proxy the workers and the
// operator use repointed to it, as a platform's failover does.
//
// The registry's history is judged as the clients lived it: the lost
// primary's (restarted from its data directory after the run, so its
// every acknowledged commit is read back) up to its death, then the
// promoted standby's from the promotion on. The sink lives in the same
// database, so rows it acknowledged during the lag went with the primary:
// those are counted and reported apart from P3, which is judged on every
// write the workers made to either.

// failoverBound is how soon after the promotion every unit must deliver
// again: a lease and the grace (every member fences and rejoins) and 10s
// for the operator's recovery and the rejoins.
func (s *scene) failoverBound() time.Duration { return leaseTTL + s.params.Grace + 10*time.Second }

// slowFailover is how long the registry is unreachable in the variant
// slower than a lease: every lease lapses twice over.
const slowFailover = 2 * (leaseTTL + 2*time.Second)

// failoverVariant is one scenario 14 variant.
type failoverVariant struct {
	// sync makes the standby synchronous: commits wait for it, and while
	// its stream is held the statements time out (the query bound) and
	// are cancelled, and PostgreSQL makes their commits visible on the
	// primary alone.
	sync bool
	// delay is how long the registry stays unreachable between the
	// primary's death and the promotion (zero: at once).
	delay time.Duration
	// move changes ownership while the standby lags and returns once the
	// primary shows the change; what it says is logged.
	move func(f *failover)
	// after checks what the variant promises once the registry is back.
	after func(f *failover)
}

// failoverScenarios are scenario 14's variants.
func failoverScenarios() []specInput {
	fo := func(id, name string, ci bool, v failoverVariant) specInput {
		return specInput{ID: id, Name: name, CI: ci, From: shape(2, 4), Replicas: 3, Rate: 60, Run: runFailover(v)}
	}
	return []specInput{
		fo("14a", "registry failover to a lagging standby during a pod roll's drains", false, failoverVariant{move: drainMoves, after: rollCompletes}),
		fo("14b", "registry failover to a lagging standby after a worker SIGKILLed", false, failoverVariant{move: crashMoves}),
		fo("14c", "registry failover to a lagging standby during an epoch activation", true, failoverVariant{move: activationMoves(shape(2, 8))}),
		fo("14d", "registry failover slower than a lease", false, failoverVariant{move: crashMoves, delay: slowFailover}),
		fo("14e", "registry failover from a synchronous standby, statements timing out in the sync wait", false, failoverVariant{sync: true, move: syncWaitMoves}),
	}
}

// failover is one variant's replicated registry and what happened to it.
type failover struct {
	t                testing.TB
	s                *scene
	sync             bool
	primary, standby *pgtest.Server
	// wal carries the standby's replication connections; direct the
	// test's own reads (the evidence), moved to the standby with the
	// clients' proxy.
	wal, direct *faultproxy.Proxy
	// dsn is the registry database on the primary, directly.
	dsn string

	heldAt, killedAt, promotedAt time.Time
	// standbySeq and standbyEpochs are the promoted standby's sequence
	// and epoch numbers before any client reached it.
	standbySeq    int64
	standbyEpochs map[int64]bool
	// moved says what the lag carried, for the log.
	moved string
	// rolled: the variant rolled the pods (the operator deletes them).
	rolled bool
}

func addrOf(s *pgtest.Server) string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// withHost is dsn with its host and port replaced by addr.
func withHost(t testing.TB, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// startReplicated starts the variant's primary and its streaming standby.
// The primary commits with synchronous_commit on (PostgreSQL's default;
// pgtest turns it off for speed), so what it acknowledged survives its
// SIGKILL and can be read back.
func startReplicated(t *testing.T, sync bool) *failover {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := &failover{t: t, sync: sync}
	f.primary = pgtest.New(t)
	mustExec(ctx, t, f.primary.DSN("postgres"), "ALTER ROLE postgres SET synchronous_commit = 'on'")
	f.dsn = f.primary.NewTestDatabase(t)
	f.wal = faultproxy.New(t, addrOf(f.primary))
	f.standby = f.primary.NewStandby(t, f.wal.Addr())
	if sync {
		// After the base backup: postgresql.auto.conf is not replicated,
		// so the promoted standby does not wait for a standby of its own.
		mustExec(ctx, t, f.primary.DSN("postgres"), "ALTER SYSTEM SET synchronous_standby_names = '*'")
		mustExec(ctx, t, f.primary.DSN("postgres"), "SELECT pg_reload_conf()")
		fleettest.Eventually(t, time.Minute, func() error {
			var n int64
			if err := queryRow(ctx, f.primary.DSN("postgres"), "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'", &n); err != nil || n != 1 {
				return fmt.Errorf("synchronous standbys: %d (%v)", n, err)
			}
			return nil
		})
	}
	f.direct = faultproxy.New(t, addrOf(f.primary))
	return f
}

// runFailover runs one variant: the fleet on the replicated registry, the
// lag while ownership moves, the failover, the recovery, and the verdict.
func runFailover(v failoverVariant) func(*testing.T, *infra, specInput) result {
	return func(t *testing.T, inf *infra, in specInput) result {
		began := time.Now()
		f := startReplicated(t, v.sync)
		in.RegistryDSN, in.RegistryAddr = withHost(t, f.dsn, f.direct.Addr()), addrOf(f.primary)
		s := newScene(t, inf, in)
		f.s = s
		t.Logf("scenario %s: fleet of %d pods Ready at %s on a replicated registry (sync %t) after %s", in.ID, in.Replicas, in.From, v.sync, time.Since(began).Round(time.Second))
		f.expectDurability()
		s.disturb()
		f.lag()
		v.move(f)
		f.failover(v.delay)
		f.expectRecovered()
		topo := s.spec()
		f.expectFlowAfterPromotion(topo)
		if v.after != nil {
			v.after(f)
		}
		s.settle()
		s.waitReady(topo, readyTimeout)
		ready := s.readySince(topo)
		return f.judge(s.stopTraffic(), ready, began)
	}
}

// expectDurability checks the RegistryDurable condition says what the
// replication settings promise.
func (f *failover) expectDurability() {
	f.t.Helper()
	want := metav1.ConditionFalse
	if f.sync {
		want = metav1.ConditionTrue
	}
	g := f.s.awaitStatus("RegistryDurable "+string(want), time.Minute, func(g sighting) bool {
		st, _ := g.condition(topologyv1.ConditionRegistryDurable)
		return st == want
	})
	_, reason := g.condition(topologyv1.ConditionRegistryDurable)
	f.s.note("RegistryDurable %s (%s) before the failover", want, reason)
}

// lag holds the standby's WAL stream: from now on it misses every commit
// (a synchronous standby makes them wait).
func (f *failover) lag() {
	f.wal.Hold(true)
	f.heldAt = time.Now()
	f.t.Logf("standby's WAL stream held: the standby lags from now on")
}

// failover SIGKILLs the primary, waits delay, promotes the standby, reads
// what it has, and repoints the clients' proxy and the test's own reads
// to it.
func (f *failover) failover(delay time.Duration) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := f.primary.Kill(); err != nil {
		f.t.Fatal(err)
	}
	f.killedAt = time.Now()
	if delay > 0 {
		time.Sleep(delay) // the fault's length: nothing answers meanwhile
	}
	if err := f.standby.Promote(ctx); err != nil {
		f.t.Fatal(err)
	}
	f.promotedAt = time.Now()
	standbyDSN := withHost(f.t, f.dsn, addrOf(f.standby))
	if err := queryRow(ctx, standbyDSN, "SELECT coalesce(max(seq), 0) FROM shardkeeper.registry_seq WHERE topology = $1", &f.standbySeq, f.s.fleet.Topology); err != nil {
		f.t.Fatal(err)
	}
	f.standbyEpochs = map[int64]bool{}
	for _, n := range queryInts(ctx, f.t, standbyDSN, "SELECT epoch FROM shardkeeper.epochs WHERE topology = $1", f.s.fleet.Topology) {
		f.standbyEpochs[n] = true
	}
	f.s.proxy.Retarget(addrOf(f.standby))
	f.s.proxy.CutAll()
	f.direct.Retarget(addrOf(f.standby))
	f.direct.CutAll()
	f.t.Logf("primary SIGKILLed %s after the lag began; standby promoted %s later (seq %d) and the proxy repointed",
		f.killedAt.Sub(f.heldAt).Round(time.Millisecond), f.promotedAt.Sub(f.killedAt).Round(time.Millisecond), f.standbySeq)
}

// expectRecovered waits for the operator's events: the registry found
// behind, then recovered with lost transactions (a client reported a
// sequence above the promoted standby's).
func (f *failover) expectRecovered() {
	f.t.Helper()
	var behind, recovered string
	lost := int64(-1)
	lostRe := regexp.MustCompile(`up to (\d+) transactions lost`)
	f.s.eventually(2*time.Minute, func() error {
		evs, err := f.s.in.cs.EventsV1().Events(f.s.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			at := e.EventTime.Time
			if at.IsZero() {
				at = e.CreationTimestamp.Time
			}
			if at.Before(f.killedAt.Add(-time.Second)) {
				continue
			}
			switch e.Reason {
			case "RegistryBehind":
				behind = e.Note
			case "RegistryRecovered":
				recovered = e.Note
				if m := lostRe.FindStringSubmatch(e.Note); m != nil {
					lost, _ = strconv.ParseInt(m[1], 10, 64)
				}
			}
		}
		if behind == "" || recovered == "" {
			return fmt.Errorf("events since the kill: RegistryBehind %q, RegistryRecovered %q", behind, recovered)
		}
		return nil
	})
	f.s.note("the operator found the registry behind (%s) and recovered it (%s)", behind, recovered)
	if lost <= 0 {
		f.t.Errorf("recovery reported %d lost transactions: no client reported a sequence above the promoted standby's %d", lost, f.standbySeq)
	}
}

// expectFlowAfterPromotion checks every unit of topo had a row written
// within failoverBound of the promotion.
func (f *failover) expectFlowAfterPromotion(topo ownership.Topology) {
	f.t.Helper()
	s, bound := f.s, f.s.failoverBound()
	deadline := f.promotedAt.Add(bound + 30*time.Second)
	for {
		u, d := slowest(flowGaps(s.sinkWrites(), topo, f.promotedAt))
		if d >= 0 || time.Now().After(deadline) {
			s.note("every unit of %s delivered again %s after the promotion (the last: unit %s; bound %s)", topo, d.Round(10*time.Millisecond), u, bound)
			if d < 0 || d > bound {
				f.t.Errorf("unit %s delivered again %s after the promotion, bound %s (lease %s + grace %s + 10s)", u, d, bound, leaseTTL, s.params.Grace)
			}
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// awaitLostClaims waits until the primary's claim history shows a change
// made after the lag began that ok accepts, and returns the count so far.
func (f *failover) awaitLostClaims(what string, timeout time.Duration, ok func(poolctl.ClaimEvent) bool) int {
	f.t.Helper()
	n := 0
	f.s.eventually(timeout, func() error {
		n = 0
		for _, e := range f.s.claimHistory() {
			if e.At.After(f.heldAt) && ok(e) {
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("no %s on the primary since the lag began", what)
		}
		return nil
	})
	return n
}

// drainMoves rolls the pods: the operator drains each in turn, handing
// its units over, on the primary only.
func drainMoves(f *failover) {
	f.s.rollPods()
	f.rolled = true
	n := f.awaitLostClaims("handover", 2*time.Minute, func(e poolctl.ClaimEvent) bool { return e.Op == "handover" || e.Op == "release" })
	// A little longer, so the new owners claim and deliver under tokens
	// the standby never saw.
	f.awaitLostClaims("claim after a handover", time.Minute, func(e poolctl.ClaimEvent) bool { return e.Op == "claim" })
	f.moved = fmt.Sprintf("%d handovers or releases of the roll's drains", n)
	f.s.note("the lag carried %s", f.moved)
}

// rollCompletes checks the roll the failover interrupted finishes: every
// pod runs the StatefulSet's update revision.
func rollCompletes(f *failover) {
	s := f.s
	s.eventually(readyTimeout, func() error {
		sts := &appsv1.StatefulSet{}
		if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, sts); err != nil {
			return err
		}
		var pods corev1.PodList
		if err := s.in.k.List(context.Background(), &pods, client.InNamespace(s.ns)); err != nil {
			return err
		}
		stale := 0
		for _, p := range pods.Items {
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != sts.Status.UpdateRevision {
				stale++
			}
		}
		if stale > 0 || len(pods.Items) != int(s.input.Replicas) {
			return fmt.Errorf("%d of %d pods not at the update revision %s", stale, len(pods.Items), sts.Status.UpdateRevision)
		}
		return nil
	})
	s.note("the pod roll the failover interrupted completed")
}

// expectNoPodDeletedHolding is scene.expectNoPodDeletedHolding on the
// claim history as the clients lived it: a pod the operator deleted
// during the lag had handed its units over on the lost primary.
func (f *failover) expectNoPodDeletedHolding(events []poolctl.ClaimEvent) {
	f.t.Helper()
	dels := f.s.podDeletions()
	if len(dels) == 0 {
		f.t.Errorf("the operator deleted no pod: the roll under test never reached a deletion, so the check tested nothing")
	}
	for _, d := range dels {
		if held := heldAt(events, d.ObjectRef.Name, d.Received); len(held) > 0 {
			f.t.Errorf("the operator deleted pod %s at %s while its member held %v", d.ObjectRef.Name, d.Received.Format(time.RFC3339Nano), held)
		}
	}
	f.s.note("the operator deleted %d pods; none held a unit when deleted (audit log vs the claim history as the clients lived it)", len(dels))
}

// crashMoves SIGKILLs a worker: its units are adopted or re-homed (by its
// restart) on the primary only.
func crashMoves(f *failover) {
	const pod = "ingest-1"
	// Ready can come before every pod claimed (one run killed a pod that
	// held nothing yet): wait, bounded, until the victim holds units.
	held := 0
	for end := time.Now().Add(30 * time.Second); held == 0 && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		held = len(f.s.unitsOf(pod))
	}
	if held == 0 {
		f.t.Fatalf("%s held no unit within 30s of Ready; the kill would move nothing", pod)
	}
	f.s.signalPod(pod, syscall.SIGKILL)
	n := f.awaitLostClaims("adoption or re-home", 2*time.Minute, func(e poolctl.ClaimEvent) bool { return e.Op == "adopt" || e.Op == "rehome" })
	f.moved = fmt.Sprintf("%d adoptions or re-homes of the %d units of SIGKILLed %s", n, held, pod)
	f.s.note("the lag carried %s", f.moved)
}

// activationMoves changes the spec to `to`: the operator creates, freezes
// and activates the new epoch, and the members claim its units, on the
// primary only.
func activationMoves(to ownership.Topology) func(*failover) {
	return func(f *failover) {
		f.s.setShape(to)
		sn := f.s.awaitRegistry("the new epoch active", 2*time.Minute, activeIs(to))
		n := f.awaitLostClaims("claim under the new epoch", time.Minute, func(e poolctl.ClaimEvent) bool { return e.Under == sn.Active.Number })
		f.moved = fmt.Sprintf("the activation of epoch %d (%s) and %d claims under it", sn.Active.Number, to, n)
		f.s.note("the lag carried %s", f.moved)
	}
}

// syncWaitMoves, with the synchronous standby's stream held, SIGKILLs a
// worker: the joins, claims and renewals that follow wait for the standby
// until their query bound cancels them, and PostgreSQL makes each such
// commit visible on the primary. It returns once one did.
func syncWaitMoves(f *failover) {
	const pod = "ingest-1"
	f.s.signalPod(pod, syscall.SIGKILL)
	const cancelled = "canceling wait for synchronous replication"
	f.s.eventually(2*time.Minute, func() error {
		if n := strings.Count(f.primary.Log(), cancelled); n < 3 {
			return fmt.Errorf("%d commits whose wait for the standby was cancelled so far", n)
		}
		return nil
	})
	// A lease and the grace, so the adoptions the cancelled renewals
	// allow are attempted too.
	time.Sleep(leaseTTL + f.s.params.Grace) // the fault's length
	f.moved = fmt.Sprintf("%d commits whose wait for the synchronous standby was cancelled (the primary's log)", strings.Count(f.primary.Log(), cancelled))
	f.s.note("the lag carried %s", f.moved)
}

// judge reads the lost primary back, checks the fault took effect and
// that no (unit, token) and no epoch number was issued twice, and gives
// the history checker the evidence as the clients lived it.
func (f *failover) judge(published map[string]ownership.Unit, ready, began time.Time) result {
	t, s := f.t, f.s
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	old, err := f.primary.Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Stop)
	oldDSN := withHost(t, f.dsn, addrOf(old))
	oldReg, err := poolctl.Open(ctx, poolctl.Config{DSN: oldDSN, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer oldReg.Close()

	// The fault took effect: the lost primary was ahead of the standby.
	var primarySeq int64
	if err := queryRow(ctx, oldDSN, "SELECT coalesce(max(seq), 0) FROM shardkeeper.registry_seq WHERE topology = $1", &primarySeq, s.fleet.Topology); err != nil {
		t.Fatal(err)
	}
	s.note("registry sequence: the lost primary reached %d, the promoted standby had %d (%d write transactions lost)", primarySeq, f.standbySeq, primarySeq-f.standbySeq)
	if primarySeq <= f.standbySeq {
		t.Errorf("the standby did not lag: the primary reached seq %d, the promoted standby had %d", primarySeq, f.standbySeq)
	}

	h := failoverHistory{old: oldReg, cur: s.fleet.Registry, killed: f.killedAt, promoted: f.promotedAt}
	claims, err := h.ClaimHistory(ctx, s.fleet.Topology)
	if err != nil {
		t.Fatal(err)
	}
	oldEpochs, err := oldReg.EpochHistory(ctx, s.fleet.Topology)
	if err != nil {
		t.Fatal(err)
	}
	f.expectTokensOnce(claims, s.histories())
	if f.rolled {
		f.expectNoPodDeletedHolding(claims)
	}
	f.expectEpochsOnce(oldEpochs, s.epochHistory())

	oldSink, err := fleettest.ReadSink(ctx, oldDSN)
	if err != nil {
		t.Fatal(err)
	}
	merged, gone, rewritten := f.awaitDelivered(published, oldSink)
	ids := make(map[string]string, len(published))
	for id, u := range published {
		ids[id] = u.String()
	}
	in, err := fleettest.Gather(ctx, fleettest.Source{HistoryDir: s.fleet.HistoryDir, DSN: s.fleet.DSN, Registry: h,
		Topology: s.fleet.Topology, Expected: s.fleet.Expected(), Keys: s.fleet.Keyed()}, ids)
	if err != nil {
		t.Fatal(err)
	}
	in.Sink = in.Sink[:0]
	for _, w := range merged {
		in.Sink = append(in.Sink, historycheck.SinkWrite{RowID: w.ID, Unit: w.Unit, Member: w.Member, Epoch: w.Epoch, At: w.WrittenAt})
	}
	v := historycheck.Check(in)
	s.note("rows lost with the sink's own database (acknowledged by the sink on the lost primary, absent from the promoted standby, never written again): %d of %d published; %d more were lost with it and written again by a redelivery",
		gone, len(published), rewritten)

	r := result{ID: s.input.ID, Name: s.input.Name, Verdict: v, ToReady: ready.Sub(s.disturbed), Took: time.Since(began), LostWithDB: gone}
	r.Unmoved, r.MaxGapUnmoved = unmovedGaps(s.histories(), deliveryOf(published, merged), s.disturbed, ready, s.alwaysThere)
	switch {
	case !v.Clean():
		t.Errorf("the history checker's verdict is not clean: %s\n%s", v.FirstViolation, v.Table())
	case v.Published == 0:
		t.Errorf("nothing was published: the scenario checked nothing")
	}
	r.Failed, r.FirstViolation = t.Failed(), v.FirstViolation
	t.Logf("scenario %s verdict (registry history: the lost primary's to its death, the promoted standby's from the promotion; sink: every write to either):\n%s", s.input.ID, v.Table())
	return r
}

// awaitDelivered waits until every published row was written to the sink
// of the lost primary or of the promoted standby (3 minutes at most), and
// returns every write to either, how many rows were written only to the
// lost primary (gone with its database) and how many of those were
// written again after the failover by a redelivery.
func (f *failover) awaitDelivered(published map[string]ownership.Unit, oldSink []fleettest.SinkWrite) (merged []fleettest.SinkWrite, gone, rewritten int) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		cur := f.s.sinkWrites()
		merged, gone, rewritten = mergeSinks(oldSink, cur, published)
		missing := 0
		seen := map[string]bool{}
		for _, w := range merged {
			seen[w.ID] = true
		}
		for id := range published {
			if !seen[id] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return merged, gone, rewritten
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mergeSinks is every write the workers made: the promoted standby's
// sink and the lost primary's writes the standby never got (a write is
// its row, member, token and instant). gone counts published rows whose
// only writes were lost; rewritten those lost and written again later.
func mergeSinks(old, cur []fleettest.SinkWrite, published map[string]ownership.Unit) (merged []fleettest.SinkWrite, gone, rewritten int) {
	key := func(w fleettest.SinkWrite) string {
		return fmt.Sprintf("%s|%s|%d|%d", w.ID, w.Member, w.Epoch, w.WrittenAt.UnixNano())
	}
	have, curIDs := map[string]bool{}, map[string]bool{}
	for _, w := range cur {
		have[key(w)] = true
		curIDs[w.ID] = true
	}
	merged = append(merged, cur...)
	lost := map[string]bool{}
	for _, w := range old {
		if !have[key(w)] {
			merged = append(merged, w)
			lost[w.ID] = true
		}
	}
	for id := range lost {
		if _, ok := published[id]; !ok {
			continue
		}
		if curIDs[id] {
			rewritten++
		} else {
			gone++
		}
	}
	sort.SliceStable(merged, func(i, j int) bool { return merged[i].WrittenAt.Before(merged[j].WrittenAt) })
	return merged, gone, rewritten
}

// deliveryOf is the per-unit first writes of the published rows in
// writes, for the gap measurement.
func deliveryOf(published map[string]ownership.Unit, writes []fleettest.SinkWrite) fleettest.Delivery {
	first := map[string]fleettest.SinkWrite{}
	for _, w := range writes {
		if _, ok := published[w.ID]; !ok {
			continue
		}
		if p, ok := first[w.ID]; !ok || w.WrittenAt.Before(p.WrittenAt) {
			first[w.ID] = w
		}
	}
	d := fleettest.Delivery{Published: len(published), Written: map[string][]time.Time{}}
	for _, w := range first {
		d.Written[w.Unit] = append(d.Written[w.Unit], w.WrittenAt)
	}
	for _, ts := range d.Written {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	}
	return d
}

// expectTokensOnce checks that no (unit, token) went to two owners: in
// the registry's history as the clients lived it (a claim row's token
// with its owner and incarnation) and in what the workers delivered
// under.
func (f *failover) expectTokensOnce(claims []poolctl.ClaimEvent, procs []history.Process) {
	f.t.Helper()
	issued := map[string]map[string]bool{}
	add := func(unit string, token int64, who string) {
		k := fmt.Sprintf("%s@%d", unit, token)
		if issued[k] == nil {
			issued[k] = map[string]bool{}
		}
		issued[k][who] = true
	}
	for _, e := range claims {
		if e.Owner != "" && e.State != poolctl.StateFree {
			add(e.Unit, e.Epoch, fmt.Sprintf("%s/%d", e.Owner, e.Incarnation))
		}
	}
	delivered := map[string]map[string]bool{}
	for _, a := range acts(procs, history.KindDeliver) {
		k := fmt.Sprintf("%s@%d", a.rec.Unit, a.rec.Epoch)
		if delivered[k] == nil {
			delivered[k] = map[string]bool{}
		}
		delivered[k][fmt.Sprintf("%s/%d", a.rec.Member, a.rec.Incarnation)] = true
	}
	twice := 0
	for _, m := range []map[string]map[string]bool{issued, delivered} {
		for k, who := range m {
			if len(who) > 1 {
				twice++
				if twice <= 5 {
					f.t.Errorf("(unit, token) %s went to %d owners: %v", k, len(who), sortedKeys(who))
				}
			}
		}
	}
	f.s.note("(unit, token) pairs: %d issued, %d delivered under, %d to two owners", len(issued), len(delivered), twice)
}

// expectEpochsOnce checks that every epoch the promoted standby created
// is numbered above every epoch the lost primary had.
func (f *failover) expectEpochsOnce(old, cur []poolctl.EpochSpan) {
	f.t.Helper()
	var maxOld int64
	lost := 0
	for _, e := range old {
		maxOld = max(maxOld, e.Number)
		if !f.standbyEpochs[e.Number] {
			lost++
		}
	}
	created := 0
	for _, e := range cur {
		if f.standbyEpochs[e.Number] {
			continue
		}
		created++
		if e.Number <= maxOld {
			f.t.Errorf("epoch %d (%dx%d) created after the failover; the lost primary had numbered epochs up to %d", e.Number, e.Partitions, e.Shards, maxOld)
		}
	}
	f.s.note("epochs: the lost primary had up to %d (%d the standby never got); %d created after the promotion, all above it", maxOld, lost, created)
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// failoverHistory is the registry's history as the clients lived it: the
// lost primary's up to its death, then the promoted standby's from the
// promotion on (what the standby has from before is a prefix of the
// primary's). An epoch active at the primary's death ends there; one the
// standby has active at the promotion is active again from then.
type failoverHistory struct {
	old, cur         poolctl.HistoryReader
	killed, promoted time.Time
}

func (h failoverHistory) ClaimHistory(ctx context.Context, topology string) ([]poolctl.ClaimEvent, error) {
	return joinAtPromotion(h.promoted, "claim history",
		func() ([]poolctl.ClaimEvent, error) { return h.old.ClaimHistory(ctx, topology) },
		func() ([]poolctl.ClaimEvent, error) { return h.cur.ClaimHistory(ctx, topology) },
		func(e poolctl.ClaimEvent) time.Time { return e.At })
}

func (h failoverHistory) LeaseHistory(ctx context.Context, topology string) ([]poolctl.LeaseEvent, error) {
	return joinAtPromotion(h.promoted, "lease history",
		func() ([]poolctl.LeaseEvent, error) { return h.old.LeaseHistory(ctx, topology) },
		func() ([]poolctl.LeaseEvent, error) { return h.cur.LeaseHistory(ctx, topology) },
		func(e poolctl.LeaseEvent) time.Time { return e.At })
}

// joinAtPromotion is the lost primary's events followed by the promoted
// server's from the promotion on.
func joinAtPromotion[E any](promoted time.Time, what string, old, cur func() ([]E, error), at func(E) time.Time) ([]E, error) {
	out, err := old()
	if err != nil {
		return nil, fmt.Errorf("the lost primary's %s: %w", what, err)
	}
	later, err := cur()
	if err != nil {
		return nil, err
	}
	for _, e := range later {
		if !at(e).Before(promoted) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (h failoverHistory) EpochHistory(ctx context.Context, topology string) ([]poolctl.EpochSpan, error) {
	old, err := h.old.EpochHistory(ctx, topology)
	if err != nil {
		return nil, fmt.Errorf("the lost primary's epochs: %w", err)
	}
	cur, err := h.cur.EpochHistory(ctx, topology)
	if err != nil {
		return nil, err
	}
	var out []poolctl.EpochSpan
	for _, e := range old {
		if !e.ActivatedAt.IsZero() && (e.RetiredAt.IsZero() || e.RetiredAt.After(h.killed)) {
			e.RetiredAt = h.killed
		}
		out = append(out, e)
	}
	for _, e := range cur {
		if e.ActivatedAt.IsZero() || (!e.RetiredAt.IsZero() && e.RetiredAt.Before(h.promoted)) {
			continue // never active, or in the primary's part already
		}
		if e.ActivatedAt.Before(h.promoted) {
			e.ActivatedAt = h.promoted
		}
		out = append(out, e)
	}
	return out, nil
}

func (h failoverHistory) PruneHistory(context.Context, string, time.Time) error {
	return errors.New("the failover evidence is read-only")
}

func mustExec(ctx context.Context, t testing.TB, dsn, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryRow(ctx context.Context, dsn, sql string, dest any, args ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest)
}

func queryInts(ctx context.Context, t testing.TB, dsn, sql string, args ...any) []int64 {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
