package historycheck

import (
	"slices"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// action is one recorded record put on the wall clock.
type action struct {
	proc       int // index into Input.Processes
	rec        *history.Record
	member     string // rec.Member, or the process's when the record has none
	start, end int64  // wall ns; end >= start
}

// delivery is one deliver record and what became of it.
type delivery struct {
	action
	settle *action // the record that closed it; nil if none did
	acked  bool
	// windowStart and windowEnd bound its window: from the pull that
	// brought the row (its start when the record names no pull) to the end
	// of the record that closed it (ack, nak, term, abandon or withheld),
	// or, when nothing did, to its process's last record: a handler may
	// still have been working until then.
	windowStart, windowEnd int64
}

// evidence is the processes' records, sorted out.
type evidence struct {
	deliveries []delivery
	settles    []action // every ack, nak and term
	orphans    []action // settles that followed no delivery of their row
	resets     map[string][]int64
	fetches    int
	// pulls are the fetch records, each a window of a process pulling a
	// unit, rows or not.
	pulls     []action
	withheld  int // withheld rows that were never delivered
	truncated int
}

// openKey identifies the deliveries a settle record may close.
type openKey struct {
	unit  string
	epoch int64
	row   string
}

func gatherEvidence(procs []history.Process) *evidence {
	ev := &evidence{resets: map[string][]int64{}}
	for pi := range procs {
		ev.addProcess(procs, pi)
	}
	for _, ts := range ev.resets {
		slices.Sort(ts)
	}
	return ev
}

// addProcess walks one process's records in the order it wrote them, pairing
// each settle record with the open delivery it closes.
func (ev *evidence) addProcess(procs []history.Process, pi int) {
	p := &procs[pi]
	if p.Truncated {
		ev.truncated++
	}
	member := ""
	if len(p.Records) > 0 && p.Records[0].Kind == history.KindClock {
		member = p.Records[0].Member
	}
	first := len(ev.deliveries)
	last := int64(0) // the process's last instant on record, wall ns
	open := map[openKey][]int{}
	for ri := range p.Records {
		r := &p.Records[ri]
		a := action{proc: pi, rec: r, member: r.Member, start: r.Start + p.MonoToWall, end: max(r.End, r.Start) + p.MonoToWall}
		if a.member == "" {
			a.member = member
		}
		if r.Kind != history.KindClock {
			last = max(last, a.end)
		}
		key := openKey{r.Unit, r.Epoch, r.RowID}
		switch r.Kind {
		case history.KindDeliver:
			open[key] = append(open[key], len(ev.deliveries))
			d := delivery{action: a, windowStart: a.start, windowEnd: -1}
			if f := r.Fetch; f != 0 {
				d.windowStart = min(f+p.MonoToWall, a.start)
			}
			ev.deliveries = append(ev.deliveries, d)
		case history.KindAck, history.KindNak, history.KindTerm:
			ev.settles = append(ev.settles, a)
			if di, ok := takeOpen(open, key, r.NumDelivered, ev.deliveries); ok {
				d := &ev.deliveries[di]
				d.settle, d.acked, d.windowEnd = &a, r.Kind == history.KindAck, max(a.end, d.end)
			} else {
				ev.orphans = append(ev.orphans, a)
			}
		case history.KindAbandon, history.KindWithheld:
			if di, ok := takeOpen(open, key, r.NumDelivered, ev.deliveries); ok {
				d := &ev.deliveries[di]
				d.settle, d.windowEnd = &a, max(a.end, d.end)
			} else if r.Kind == history.KindWithheld {
				ev.withheld++
			}
		case history.KindReset:
			ev.resets[r.Unit] = append(ev.resets[r.Unit], a.start)
		case history.KindFetch:
			ev.fetches++
			ev.pulls = append(ev.pulls, a)
		}
	}
	// A delivery nothing closed ran until the process's last record: its
	// handler may have been working (or the process paused) until then.
	for di := first; di < len(ev.deliveries); di++ {
		if d := &ev.deliveries[di]; d.windowEnd < 0 {
			d.windowEnd = max(last, d.end)
		}
	}
}

// takeOpen removes and returns the open delivery a settle record closes: the
// one with the record's NumDelivered when it names one, else the oldest.
func takeOpen(open map[openKey][]int, key openKey, numDelivered uint64, ds []delivery) (int, bool) {
	list := open[key]
	if len(list) == 0 {
		return 0, false
	}
	at := 0
	if numDelivered != 0 {
		if i := slices.IndexFunc(list, func(di int) bool { return ds[di].rec.NumDelivered == numDelivered }); i >= 0 {
			at = i
		}
	}
	di := list[at]
	if list = slices.Delete(list, at, at+1); len(list) == 0 {
		delete(open, key)
	} else {
		open[key] = list
	}
	return di, true
}
