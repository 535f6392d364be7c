package historycheck

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// acked is a delivery of a generated history whose window has room inside
// it for a planted one.
type acked struct {
	unit       string
	proc       int
	start, end int // ms
}

// genHistory draws a clean history: units of one epoch, each owned by a
// sequence of members (random handovers, each at the next fencing epoch).
// An owner delivers rows, sometimes concurrently, writes them to the sink
// and acks them before it releases; sometimes it leaves a row unsettled (its
// claim check failed: withheld, or its sink refused: abandoned), and the
// next owner gets that row again (NATS delivery 2): a duplicate explained
// by the takeover, or by the delivery count when the next owner is the same
// member again.
func genHistory(t *rapid.T) (Input, []*procBuilder, []acked) {
	nMembers := rapid.IntRange(2, 4).Draw(t, "members")
	nUnits := rapid.IntRange(1, 3).Draw(t, "units")
	procs := make([]*procBuilder, nMembers)
	in := Input{Epochs: []EpochSpan{epoch(1, 1, nUnits, 0, 0)}, Published: map[string]string{}, Grace: time.Millisecond}
	for m := range procs {
		name := fmt.Sprintf("m%d", m)
		procs[m] = newProc(fmt.Sprintf("%s-%d-1", name, 100+m), name, 1)
		in.Leases = append(in.Leases, lease(name, 1, 0, 1_000_000))
		in.Expected = append(in.Expected, ExpectedProcess{Member: name, PID: 100 + m})
	}
	var windows []acked
	for s := range nUnits {
		unit := fmt.Sprintf("0.%d", s)
		cursor, row := 10, 0
		var carry []string // rows the last owner left unacked
		tenures := rapid.IntRange(1, 5).Draw(t, "tenures")
		for k := range tenures {
			owner := rapid.IntRange(0, nMembers-1).Draw(t, "owner")
			p, member, ep := procs[owner], procs[owner].member, int64(k+1)
			in.Claims = append(in.Claims, claim(unit, member, 1, ep, OpClaim, 1, cursor))
			last := k == tenures-1
			end := cursor + 1
			deliver := func(id string, nd uint64) {
				cursor += rapid.IntRange(1, 3).Draw(t, "gap")
				start := cursor
				p.deliver(unit, ep, id, start).nd(nd)
				unacked := !last && nd == 1 && rapid.IntRange(0, 4).Draw(t, "unacked") == 0
				// A worker writes before it acks; one that never acks may
				// or may not have written.
				if !unacked || rapid.Bool().Draw(t, "wrote") {
					in.Sink = append(in.Sink, write(id, unit, member, ep, start))
				}
				if unacked {
					carry = append(carry, id)
					p.add(rapid.SampledFrom([]history.Kind{history.KindWithheld, history.KindAbandon}).Draw(t, "unsettled"), unit, ep, id, start+1, 0)
					end = max(end, start+1)
					return
				}
				settled := start + rapid.IntRange(2, 8).Draw(t, "took")
				p.ack(unit, ep, id, settled-1, settled)
				windows = append(windows, acked{unit, owner, start, settled})
				end = max(end, settled)
				// Deliveries may overlap within one process: the next one
				// starts before this one settles.
				cursor = start + rapid.IntRange(0, settled-start).Draw(t, "concurrency")
			}
			again := carry
			carry = nil
			for _, id := range again {
				deliver(id, 2)
			}
			for range rapid.IntRange(0, 4).Draw(t, "rows") {
				row++
				id := fmt.Sprintf("%s-r%d", unit, row)
				in.Published[id] = unit
				deliver(id, 1)
			}
			cursor = end + rapid.IntRange(1, 3).Draw(t, "release")
			in.Claims = append(in.Claims, release(unit, ep, cursor))
			cursor += rapid.IntRange(0, 3).Draw(t, "free")
		}
	}
	for _, p := range procs {
		in.Processes = append(in.Processes, p.done())
	}
	return in, procs, windows
}

// checks P1 (overlap), P3 and duplicates on random sequential ownership.
func TestRandomSequentialHistoriesAreClean(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, _, _ := genHistory(t)
		if v := Check(in); !v.Clean() {
			t.Fatalf("a sequential history is not clean:\n%s", v.Table())
		}
	})
}

// checks P1: one delivery planted inside another process's window on the
// same unit is caught, and the example names both processes.
func TestPlantedOverlapIsCaught(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, procs, windows := genHistory(t)
		if len(windows) == 0 {
			t.Skip("no acked delivery to plant inside")
		}
		w := rapid.SampledFrom(windows).Draw(t, "victim")
		intruder := (w.proc + rapid.IntRange(1, len(procs)-1).Draw(t, "intruder")) % len(procs)
		x := rapid.IntRange(w.start+1, w.end-1).Draw(t, "at")
		p := procs[intruder]
		p.deliver(w.unit, 99, "planted", x).ack(w.unit, 99, "planted", x, x+rapid.IntRange(0, 5).Draw(t, "took"))
		in.Processes[intruder] = p.done()

		v := Check(in)
		if v.Clean() || v.OverlappingWindows < 1 || v.UnitsDoublePulled != 1 || v.MaxDoublePulled != 1 {
			t.Fatalf("planted overlap on %s at %d not caught:\n%s", w.unit, x, v.Table())
		}
		if ex := example(v, CheckOverlaps); !containsAll(ex, procs[w.proc].p.Name, p.p.Name, "unit "+w.unit) {
			t.Fatalf("overlap example %q does not name %s and %s", ex, procs[w.proc].p.Name, p.p.Name)
		}
	})
}

// genWindows draws windows on a few units over a short time line, so that
// ties, touching ends and zero-length windows are common.
func genWindows(t *rapid.T) map[string][]window {
	out := map[string][]window{}
	for range rapid.IntRange(0, 30).Draw(t, "windows") {
		unit := fmt.Sprint("0.", rapid.IntRange(0, 2).Draw(t, "unit"))
		s := int64(rapid.IntRange(0, 12).Draw(t, "start"))
		e := s + int64(rapid.SampledFrom([]int{0, 0, 1, 2, 5}).Draw(t, "len"))
		out[unit] = append(out[unit], window{start: s, end: e, proc: rapid.IntRange(0, 2).Draw(t, "proc"), act: &action{}})
	}
	return out
}

func overlapsBrute(a, b window) bool {
	return a.proc != b.proc && a.start < b.end && b.start < a.end
}

// TestOverlapCountsMatchBruteForce holds the sort-and-sweep counts to their
// definitions, computed pair by pair.
func TestOverlapCountsMatchBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		byUnit := genWindows(t)
		var wantPairs int64
		wantUnits := 0
		firstAt := map[string]int64{}
		var instants []int64
		for unit, ws := range byUnit {
			found := false
			for i := range ws {
				instants = append(instants, ws[i].start, ws[i].end)
				for j := i + 1; j < len(ws); j++ {
					if overlapsBrute(ws[i], ws[j]) {
						wantPairs++
						at := max(ws[i].start, ws[j].start)
						if f, ok := firstAt[unit]; !ok || at < f {
							firstAt[unit] = at
						}
						found = true
					}
				}
			}
			if found {
				wantUnits++
			}
		}
		wantMax := 0
		for _, x := range instants {
			n := 0
			for _, ws := range byUnit {
				if slices.ContainsFunc(pairsOf(ws), func(p [2]window) bool {
					return max(p[0].start, p[1].start) <= x && x <= min(p[0].end, p[1].end)
				}) {
					n++
				}
			}
			wantMax = max(wantMax, n)
		}

		got := findOverlaps(cloneWindows(byUnit))
		if got.pairs != wantPairs || got.units != wantUnits || got.maxAtOnce != wantMax {
			t.Fatalf("got pairs %d units %d max %d, want %d %d %d", got.pairs, got.units, got.maxAtOnce, wantPairs, wantUnits, wantMax)
		}
		for _, ex := range got.firstByUnit {
			if !overlapsBrute(ex.a, ex.b) {
				t.Fatalf("example %+v does not overlap", ex)
			}
			unit := ""
			for u, ws := range byUnit {
				if slices.ContainsFunc(ws, func(w window) bool { return w.act == ex.b.act }) {
					unit = u
				}
			}
			if ex.b.start != firstAt[unit] {
				t.Fatalf("unit %s: example starts at %d, the first overlap at %d", unit, ex.b.start, firstAt[unit])
			}
		}
	})
}

func pairsOf(ws []window) [][2]window {
	var out [][2]window
	for i := range ws {
		for j := i + 1; j < len(ws); j++ {
			if overlapsBrute(ws[i], ws[j]) {
				out = append(out, [2]window{ws[i], ws[j]})
			}
		}
	}
	return out
}

func cloneWindows(in map[string][]window) map[string][]window {
	out := map[string][]window{}
	for u, ws := range in {
		out[u] = slices.Clone(ws)
	}
	return out
}
