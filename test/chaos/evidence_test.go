package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// Evidence the scenarios judge beyond the history checker's verdict, read
// from the same sources: the workers' delivery histories, the registry's
// claim and epoch history, the sink, the API server's audit log. Never
// from what a worker or the operator says about itself.

// histories reads every worker process's delivery history.
func (s *scene) histories() []history.Process {
	s.t.Helper()
	procs, err := history.ReadDir(s.fleet.HistoryDir)
	if err != nil {
		s.t.Fatal(err)
	}
	return procs
}

// act is one record with its wall time and the process that made it.
type act struct {
	rec  history.Record
	at   time.Time
	proc string
}

// acts lists the records of kinds (all when none given), in time order.
func acts(procs []history.Process, kinds ...history.Kind) []act {
	var out []act
	for _, p := range procs {
		for _, r := range p.Records {
			if len(kinds) > 0 && !hasKind(kinds, r.Kind) {
				continue
			}
			out = append(out, act{rec: r, at: p.WallTime(r.Start), proc: p.Name})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

func hasKind(kinds []history.Kind, k history.Kind) bool {
	for _, x := range kinds {
		if x == k {
			return true
		}
	}
	return false
}

// incarnationOf is the incarnation member runs under now, from the
// registry.
func (s *scene) incarnationOf(member string) int64 {
	s.t.Helper()
	snap, err := s.snapshot()
	if err != nil {
		s.t.Fatal(err)
	}
	m := snap.Member(member)
	if m == nil {
		// Incarnation 0 would match none of its records: every check
		// keyed by it would wait in vain or pass vacuously.
		s.t.Fatalf("%s has not joined the registry yet", member)
	}
	return m.Incarnation
}

// actionsAfter counts deliveries and settlements made by member's
// incarnation inc after from: what a process resumed after losing its
// lease must never do under its old claims.
func actionsAfter(procs []history.Process, member string, inc int64, from time.Time) []act {
	var out []act
	for _, a := range acts(procs, history.KindDeliver, history.KindAck, history.KindNak, history.KindTerm) {
		if a.rec.Member == member && a.rec.Incarnation == inc && a.at.After(from) {
			out = append(out, a)
		}
	}
	return out
}

// firstRecordAfter is the wall time of the first record the process pid of
// member wrote after from: when a paused process really ran again.
func firstRecordAfter(procs []history.Process, member string, pid int, from time.Time) (time.Time, bool) {
	for _, p := range procs {
		if len(p.Records) == 0 || p.Records[0].Member != member || pidOf(p.Name) != pid {
			continue
		}
		for _, r := range p.Records[1:] {
			if at := p.WallTime(r.Start); at.After(from) {
				return at, true
			}
		}
	}
	return time.Time{}, false
}

// pidOf is the pid in a history file's name, "<member>-<pid>-<mono>".
func pidOf(name string) int {
	parts := strings.Split(name, "-")
	if len(parts) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[len(parts)-2])
	return pid
}

// takenOver lists the units of held that the claim history gives to
// another member, or to another incarnation of member than inc, between
// from and to.
func takenOver(events []poolctl.ClaimEvent, held []string, member string, inc int64, from, to time.Time) []string {
	want := map[string]bool{}
	for _, u := range held {
		want[u] = true
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range events {
		if !want[e.Unit] || seen[e.Unit] || e.At.Before(from) || e.At.After(to) || e.Owner == "" || e.State == poolctl.StateFree {
			continue
		}
		if e.Owner != member || e.Incarnation != inc {
			seen[e.Unit] = true
			out = append(out, e.Unit)
		}
	}
	sort.Strings(out)
	return out
}

// inFlight lists the rows member's incarnation inc delivered and never
// settled: what it held in its handler when it died.
func inFlight(procs []history.Process, member string, inc int64) map[string]time.Time {
	delivered := map[string]time.Time{}
	for _, a := range acts(procs) {
		if a.rec.Member != member || a.rec.Incarnation != inc || a.rec.RowID == "" {
			continue
		}
		switch a.rec.Kind {
		case history.KindDeliver:
			delivered[a.rec.RowID] = a.at
		case history.KindAck, history.KindNak, history.KindTerm:
			delete(delivered, a.rec.RowID)
		}
	}
	return delivered
}

// deliveredSince keeps the rows of rows (from inFlight) delivered after
// since.
func deliveredSince(rows map[string]time.Time, since time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for id, at := range rows {
		if at.After(since) {
			out[id] = at
		}
	}
	return out
}

// inFlightOf counts the rows of rows (from inFlight) that were delivered
// from unit.
func inFlightOf(rows map[string]time.Time, procs []history.Process, unit string) int {
	n := 0
	for _, a := range acts(procs, history.KindDeliver) {
		if _, ok := rows[a.rec.RowID]; ok && a.rec.Unit == unit {
			n++
			delete(rows, a.rec.RowID)
		}
	}
	return n
}

// redelivered is, for each row, the first delivery after from by another
// member or incarnation than (member, inc).
func redelivered(procs []history.Process, rows map[string]time.Time, member string, inc int64, from time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for _, a := range acts(procs, history.KindDeliver) {
		if _, ok := rows[a.rec.RowID]; !ok || a.at.Before(from) || (a.rec.Member == member && a.rec.Incarnation == inc) {
			continue
		}
		if _, seen := out[a.rec.RowID]; !seen {
			out[a.rec.RowID] = a.at
		}
	}
	return out
}

// inFlightAt lists the rows delivered before at and not settled by then
// (never, or only after at), by the member that held each: what the
// fleet's handlers held at instant at.
func inFlightAt(procs []history.Process, at time.Time) map[string]string {
	open := map[string]string{}
	for _, a := range acts(procs) {
		if a.rec.RowID == "" || a.at.After(at) {
			continue
		}
		switch a.rec.Kind {
		case history.KindDeliver:
			open[a.rec.RowID] = a.rec.Member
		case history.KindAck, history.KindNak, history.KindTerm:
			delete(open, a.rec.RowID)
		}
	}
	return open
}

// leaseHistory reads the registry's lease history directly.
func (s *scene) leaseHistory() []poolctl.LeaseEvent {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.fleet.Registry.LeaseHistory(ctx, s.fleet.Topology)
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// leaseEventsBetween lists the lease grants, leaves and fence changes
// the registry recorded in (from, to).
func leaseEventsBetween(events []poolctl.LeaseEvent, from, to time.Time) []poolctl.LeaseEvent {
	var out []poolctl.LeaseEvent
	for _, e := range events {
		if e.At.After(from) && e.At.Before(to) {
			out = append(out, e)
		}
	}
	return out
}

// leaseEndAt is when the last lease the registry granted member before at
// ran out (zero when it granted none).
func leaseEndAt(events []poolctl.LeaseEvent, member string, at time.Time) time.Time {
	var end time.Time
	for _, e := range events {
		if e.Member == member && !e.At.After(at) && !e.Left {
			end = e.ExpiresAt
		}
	}
	return end
}

// epochOf is the registry's first epoch of shape topo, false when none
// was written.
func (s *scene) epochOf(topo ownership.Topology) (poolctl.EpochSpan, bool) {
	for _, e := range s.epochHistory() {
		if e.Partitions == topo.Partitions && e.Shards == topo.Shards {
			return e, true
		}
	}
	return poolctl.EpochSpan{}, false
}

// claimHistory reads the registry's claim history directly.
func (s *scene) claimHistory() []poolctl.ClaimEvent {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.fleet.Registry.ClaimHistory(ctx, s.fleet.Topology)
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// epochHistory reads the registry's epoch history directly.
func (s *scene) epochHistory() []poolctl.EpochSpan {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.fleet.Registry.EpochHistory(ctx, s.fleet.Topology)
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// heldAt lists the units member held (held or handing over, at any
// incarnation, live lease or not: the row exists until someone adopts)
// at instant at, from the claim history.
func heldAt(events []poolctl.ClaimEvent, member string, at time.Time) []string {
	last := map[string]poolctl.ClaimEvent{}
	for _, e := range events {
		if e.At.After(at) {
			continue
		}
		if p, ok := last[e.Unit]; !ok || !e.At.Before(p.At) {
			last[e.Unit] = e
		}
	}
	var out []string
	for u, e := range last {
		if e.Owner == member && e.State != poolctl.StateFree {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}

// owners maps each held unit to its owner now.
func (s *scene) owners() map[string]string {
	out := map[string]string{}
	for u, c := range s.claims() {
		if c.State != poolctl.StateFree {
			out[u] = c.Owner
		}
	}
	return out
}

// sinkWrites reads every sink write directly.
func (s *scene) sinkWrites() []fleettest.SinkWrite {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := s.fleet.Sink(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return w
}

// flowGaps is, for every unit of topo, how long after from its first sink
// write came (-1 when none came): how soon rows flowed again after a
// fault.
func flowGaps(writes []fleettest.SinkWrite, topo ownership.Topology, from time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, u := range topo.Units() {
		out[u.String()] = -1
	}
	for _, w := range writes {
		d, ok := out[w.Unit]
		if !ok || w.WrittenAt.Before(from) {
			continue
		}
		if gap := w.WrittenAt.Sub(from); d < 0 || gap < d {
			out[w.Unit] = gap
		}
	}
	return out
}

// slowest is the unit of gaps that flowed last, and its gap (-1: never).
func slowest(gaps map[string]time.Duration) (string, time.Duration) {
	unit, worst := "", time.Duration(0)
	for u, d := range gaps {
		if d < 0 {
			return u, -1
		}
		if d >= worst {
			unit, worst = u, d
		}
	}
	return unit, worst
}

// expectFlowWithin checks that every unit of topo had a row written within
// bound after from, waiting for the evidence up to bound plus a margin.
func (s *scene) expectFlowWithin(topo ownership.Topology, from time.Time, bound time.Duration, what string) {
	s.t.Helper()
	var gaps map[string]time.Duration
	deadline := from.Add(bound + 30*time.Second)
	for {
		gaps = flowGaps(s.sinkWrites(), topo, from)
		if u, d := slowest(gaps); d >= 0 || time.Now().After(deadline) {
			s.note("%s: every unit flowed again within %s (the last: unit %s; bound %s)", what, d.Round(10*time.Millisecond), u, bound)
			if d < 0 || d > bound {
				s.t.Errorf("%s: unit %s flowed again after %s, bound %s (lease %s + grace %s + 5s)", what, u, d, bound, leaseTTL, s.params.Grace)
			}
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// auditEvent is the part of a kube-apiserver audit event the scenarios
// read.
type auditEvent struct {
	Verb      string                    `json:"verb"`
	User      struct{ Username string } `json:"user"`
	ObjectRef struct {
		Resource, Namespace, Name string
	} `json:"objectRef"`
	ResponseStatus struct{ Code int } `json:"responseStatus"`
	Received       time.Time          `json:"requestReceivedTimestamp"`
}

// podDeletions lists the pod deletions the operator's user made in ns that
// succeeded, with the instant the API server received each.
func (s *scene) podDeletions() []auditEvent {
	s.t.Helper()
	f, err := os.Open(s.in.audit)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Verb == "delete" && e.ObjectRef.Resource == "pods" && e.ObjectRef.Namespace == s.ns &&
			e.User.Username == operatorUser && e.ResponseStatus.Code < 300 {
			out = append(out, e)
		}
	}
	return out
}

// expectNoPodDeletedHolding checks, against the audit log and the claim
// history, that the operator deleted no pod whose member held a unit at
// the instant the API server received the deletion.
func (s *scene) expectNoPodDeletedHolding() {
	s.t.Helper()
	events := s.claimHistory()
	dels := s.podDeletions()
	if len(dels) == 0 {
		s.t.Errorf("the operator deleted no pod: the roll under test never reached a deletion, so the check tested nothing")
	}
	for _, d := range dels {
		if held := heldAt(events, d.ObjectRef.Name, d.Received); len(held) > 0 {
			s.t.Errorf("the operator deleted pod %s at %s while its member held %v", d.ObjectRef.Name, d.Received.Format(time.RFC3339Nano), held)
		}
	}
	s.note("the operator deleted %d pods; none held a unit when deleted (audit log vs claim history)", len(dels))
}

// takeoverWatch scrapes every running worker's
// shardkeeper_worker_takeovers_total every 200ms and keeps each process's
// last reading, so the counts of a process the roll replaces soon after
// its takeover are not lost.
type takeoverWatch struct {
	mu    sync.Mutex
	last  map[string]map[string]float64 // process address -> outcome -> count
	stopc chan struct{}
	done  chan struct{}
	addrs func() map[string]string
}

func (s *scene) watchTakeovers() *takeoverWatch {
	tw := &takeoverWatch{last: map[string]map[string]float64{}, stopc: make(chan struct{}), done: make(chan struct{}), addrs: s.kubelet.Addrs}
	s.beforeStop(tw.scrape)
	go func() {
		defer close(tw.done)
		for {
			for _, addr := range s.kubelet.Addrs() {
				tw.scrape("", addr)
			}
			select {
			case <-tw.stopc:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return tw
}

// scrape keeps the process's reading, if it answers.
func (tw *takeoverWatch) scrape(_, addr string) {
	if counts, ok := scrapeTakeovers(addr); ok {
		tw.mu.Lock()
		tw.last[addr] = counts
		tw.mu.Unlock()
	}
}

// stop ends the scraping and sums the last reading of every process by
// outcome.
func (tw *takeoverWatch) stop() map[string]float64 {
	close(tw.stopc)
	<-tw.done
	// A last reading: a takeover may have come since the last round.
	for _, addr := range tw.addrs() {
		tw.scrape("", addr)
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	out := map[string]float64{}
	for _, counts := range tw.last {
		for outcome, n := range counts {
			out[outcome] += n
		}
	}
	return out
}

// scrapeTakeovers reads shardkeeper_worker_takeovers_total by outcome
// from one worker's /metrics; false when it did not answer.
func scrapeTakeovers(addr string) (map[string]float64, bool) {
	out := map[string]float64{}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return out, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "shardkeeper_worker_takeovers_total{") {
			continue
		}
		i := strings.Index(line, `outcome="`)
		sp := strings.LastIndexByte(line, ' ')
		if i < 0 || sp < 0 {
			continue
		}
		outcome := line[i+len(`outcome="`):]
		outcome = outcome[:strings.IndexByte(outcome, '"')]
		n, err := strconv.ParseFloat(line[sp+1:], 64)
		if err == nil {
			out[outcome] += n
		}
	}
	return out, true
}

// unmovedGaps finds, from the delivery histories, the units exactly one
// member (pod name) delivered within [from, to], among those keep says
// were in the topology throughout, and the longest wait between
// consecutive first writes of their rows in that window.
func unmovedGaps(procs []history.Process, d fleettest.Delivery, from, to time.Time, keep func(unit string) bool) (int, time.Duration) {
	who := map[string]map[string]bool{}
	for _, a := range acts(procs, history.KindDeliver) {
		if a.at.Before(from) || a.at.After(to) || !keep(a.rec.Unit) {
			continue
		}
		if who[a.rec.Unit] == nil {
			who[a.rec.Unit] = map[string]bool{}
		}
		who[a.rec.Unit][a.rec.Member] = true
	}
	n, gap := 0, time.Duration(0)
	for u, ms := range who {
		if len(ms) == 1 {
			n++
			gap = max(gap, gapAround(d.Written[u], from, to))
		}
	}
	return n, gap
}

// gapAround is the longest wait between consecutive first writes in
// [from, to], counting from the last write before from: a unit that stops
// when the window opens shows its whole pause.
func gapAround(written []time.Time, from, to time.Time) time.Duration {
	var gap time.Duration
	var prev time.Time
	for _, t := range written {
		if t.After(to) {
			break
		}
		if !prev.IsZero() && !t.Before(from) {
			gap = max(gap, t.Sub(prev))
		}
		prev = t
	}
	return gap
}

// describeActs renders a few acts for a failure message.
func describeActs(as []act, n int) string {
	var parts []string
	for _, a := range as[:min(n, len(as))] {
		parts = append(parts, fmt.Sprintf("%s %s %s row %s epoch %d at %s", a.proc, a.rec.Kind, a.rec.Unit, a.rec.RowID, a.rec.Epoch, a.at.Format("15:04:05.000")))
	}
	return strings.Join(parts, "; ")
}
