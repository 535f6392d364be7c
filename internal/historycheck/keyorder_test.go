package historycheck

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// movedKey is the story the per-key order cases start from: key k's row
// r1 (seq 1) waits in unit 0.1 of epoch 1 (1x8); epoch 2 (1x16) is
// activated at 45 and moves k to unit 0.9, where its row r2 (seq 2) goes.
// a holds 0.1 and delivers r1 at 20, acks it at 40 (returned 41); b
// claims 0.9 at 46 and delivers r2 at 50, acks it at 52. In order: r2 came
// after r1 was acknowledged.
func movedKey() Input {
	a := newProc("a-1-100", "a", 1).deliver("0.1", 1, "r1", 20).ack("0.1", 1, "r1", 40, 41)
	b := newProc("b-2-200", "b", 1).deliver("0.9", 1, "r2", 50).ack("0.9", 1, "r2", 52, 53)
	return Input{
		Processes: []history.Process{a.done(), b.done()},
		Claims:    []ClaimEvent{claim("0.1", "a", 1, 1, OpClaim, 1, 10), claim("0.9", "b", 1, 1, OpClaim, 2, 46)},
		Leases:    []LeaseEvent{lease("a", 1, 0, 1000), lease("b", 1, 0, 1000)},
		Epochs:    []EpochSpan{epoch(1, 1, 8, 0, 45), epoch(2, 1, 16, 45, 0)},
		Sink:      []SinkWrite{write("r1", "0.1", "a", 1, 21), write("r2", "0.9", "b", 1, 51)},
		Published: map[string]string{"r1": "0.1", "r2": "0.9"},
		Keys:      map[string]KeyedRow{"r1": {Key: "k", Seq: 1}, "r2": {Key: "k", Seq: 2}},
		Expected:  []ExpectedProcess{{Member: "a", PID: 1}, {Member: "b", PID: 2}},
		Grace:     5 * time.Millisecond,
		Ordering:  OrderingPerKey,
	}
}

// movedKeyWith applies changes to a fresh movedKey.
func movedKeyWith(changes ...func(*Input)) Input {
	in := movedKey()
	for _, c := range changes {
		c(&in)
	}
	return in
}

// ordering sets the run's declared ordering.
func ordering(o Ordering) func(*Input) { return func(in *Input) { in.Ordering = o } }

// r1AckedAt moves a's acknowledgement of r1 to [startMs, endMs].
func r1AckedAt(startMs, endMs int) func(*Input) {
	return proc(0, newProc("a-1-100", "a", 1).deliver("0.1", 1, "r1", 20).ack("0.1", 1, "r1", startMs, endMs))
}

func TestKeyOrderLines(t *testing.T) {
	for _, tc := range []struct {
		name                string
		in                  Input
		inversions, reorder Line
	}{
		{
			name:       "a run without keyed rows reports n/a",
			in:         with(),
			inversions: Line{CheckKeyInversions, "n/a", NA},
			reorder:    Line{CheckKeyReorders, "n/a", NA},
		},
		{
			name:       "ordering None reports inversions as information",
			in:         movedKeyWith(ordering(OrderingNone), r1AckedAt(60, 61)),
			inversions: Line{CheckKeyInversions, "1", Info},
			reorder:    Line{CheckKeyReorders, "0", Info},
		},
		{
			name:       "an empty ordering is None",
			in:         movedKeyWith(ordering(""), r1AckedAt(60, 61)),
			inversions: Line{CheckKeyInversions, "1", Info},
			reorder:    Line{CheckKeyReorders, "0", Info},
		},
		{
			name:       "ordering PerKey makes inversions a check",
			in:         movedKeyWith(r1AckedAt(60, 61)),
			inversions: Line{CheckKeyInversions, "1", Fail},
			reorder:    Line{CheckKeyReorders, "0", Info},
		},
		{
			name:       "ordering PerKey without inversions passes",
			in:         movedKey(),
			inversions: Line{CheckKeyInversions, "0", OK},
			reorder:    Line{CheckKeyReorders, "0", Info},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Check(tc.in)
			lines := v.Lines()
			if got := lines[len(lines)-2]; got != tc.inversions {
				t.Errorf("inversion line %+v, want %+v", got, tc.inversions)
			}
			if got := lines[len(lines)-1]; got != tc.reorder {
				t.Errorf("reorder line %+v, want %+v", got, tc.reorder)
			}
		})
	}
}

// Under ordering None an inversion is no violation: it must not become the
// run's first violation, yet its example is kept for the reader.
func TestInversionsUnderNoneAreExamplesNotViolations(t *testing.T) {
	v := Check(movedKeyWith(ordering(OrderingNone), r1AckedAt(60, 61)))
	if !v.Clean() || v.FirstViolation != "" || len(v.Violations) != 0 {
		t.Fatalf("clean %v, first violation %q, violations %v; want a clean run\n%s", v.Clean(), v.FirstViolation, v.Violations, v.Table())
	}
	if len(v.KeyInversionExamples) != 1 || !containsAll(v.KeyInversionExamples[0], "key k", "row r2 (seq 2)", "unit 0.9", "row r1 (seq 1) of unit 0.1") {
		t.Fatalf("examples %q, want the one inversion named", v.KeyInversionExamples)
	}
	if v.KeyedRows != 2 || v.Keys != 1 || v.KeysInverted != 1 {
		t.Fatalf("keyed rows %d, keys %d, keys inverted %d; want 2, 1, 1", v.KeyedRows, v.Keys, v.KeysInverted)
	}
}

// keyedStory is a generated history of keyed rows, with what the
// definition (package doc, "Per-key order") says of it, worked out pair
// by pair.
type keyedStory struct {
	in                  Input
	inversions, reorder int
}

// genKeyed draws keys whose rows live in units 0.0 to 0.2 (one process
// each), each row delivered once or more (a redelivery in its own unit),
// acknowledged or not, an ack possibly failed, at random instants.
func genKeyed(t *rapid.T) keyedStory {
	const units = 3
	procs := make([][]history.Record, units)
	in := Input{Keys: map[string]KeyedRow{}, Ordering: OrderingPerKey, NoRegistry: true}
	type row struct {
		unit, seq     int
		first, acked  int // ms; acked -1: no successful ack
		id            string
		key           string
		deliveredOnce bool
	}
	var rows []row
	rec := func(unit int, k history.Kind, id string, ms int, detail string) {
		ns := int64(ms) * int64(time.Millisecond)
		procs[unit] = append(procs[unit], history.Record{Kind: k, Unit: fmt.Sprintf("0.%d", unit), RowID: id, Start: ns, End: ns, Detail: detail})
	}
	for key := range rapid.IntRange(1, 3).Draw(t, "keys") {
		seq := int64(0)
		for range rapid.IntRange(1, 6).Draw(t, "rows") {
			seq += int64(rapid.IntRange(0, 2).Draw(t, "seq step")) // 0: a repeated seq; 2: a gap
			r := row{unit: rapid.IntRange(0, units-1).Draw(t, "unit"), seq: int(seq), key: fmt.Sprintf("k%d", key), acked: -1}
			r.id = fmt.Sprintf("%s-%d", r.key, len(rows))
			in.Keys[r.id] = KeyedRow{Key: r.key, Seq: seq}
			if rapid.IntRange(0, 5).Draw(t, "never delivered") == 0 {
				rows = append(rows, r)
				continue
			}
			r.deliveredOnce = true
			r.first = rapid.IntRange(0, 100).Draw(t, "first delivery")
			rec(r.unit, history.KindDeliver, r.id, r.first, "")
			at := r.first
			for range rapid.IntRange(0, 2).Draw(t, "settles") {
				at += rapid.IntRange(0, 30).Draw(t, "settle after")
				switch rapid.IntRange(0, 4).Draw(t, "settle") {
				case 0:
					rec(r.unit, history.KindAck, r.id, at, "nats: connection closed")
				case 1:
					rec(r.unit, history.KindNak, r.id, at, "")
				case 2:
					rec(r.unit, history.KindTerm, r.id, at, "")
					if r.acked < 0 {
						r.acked = at
					}
				default:
					rec(r.unit, history.KindAck, r.id, at, "")
					if r.acked < 0 {
						r.acked = at
					}
				}
				at += rapid.IntRange(0, 10).Draw(t, "redelivery after")
				rec(r.unit, history.KindDeliver, r.id, at, "")
			}
			rows = append(rows, r)
		}
	}
	for u := range procs {
		recs := procs[u]
		slices.SortStableFunc(recs, func(a, b history.Record) int { return int(a.Start - b.Start) })
		clock := history.Record{Kind: history.KindClock, Member: fmt.Sprintf("m%d", u), Start: 0, Wall: wall(0)}
		in.Processes = append(in.Processes, history.Process{Name: fmt.Sprintf("m%d-%d-1", u, 100+u), Records: append([]history.Record{clock}, recs...), MonoToWall: wall(0)})
		in.Expected = append(in.Expected, ExpectedProcess{Member: fmt.Sprintf("m%d", u), PID: 100 + u})
	}
	s := keyedStory{in: in}
	delivered := 0
	for _, j := range rows {
		if !j.deliveredOnce {
			continue
		}
		delivered++
		cross, same := false, false
		for _, i := range rows {
			if i.key != j.key || i.seq >= j.seq || !i.deliveredOnce || i.acked < 0 || i.acked <= j.first {
				continue
			}
			if i.unit != j.unit {
				cross = true
			} else {
				same = true
			}
		}
		switch {
		case cross:
			s.inversions++
		case same:
			s.reorder++
		}
	}
	if delivered == 0 {
		// PerKey with no keyed row delivered: no evidence, no verdict.
		s.inversions = 1
	}
	return s
}

// The sweep agrees with the definition taken pair by pair, on random
// keyed histories: repeated and skipped sequence numbers, rows never
// delivered or never acknowledged, failed acks, naks, terms and
// redeliveries.
func TestKeyOrderMatchesThePairwiseDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genKeyed(t)
		v := Check(s.in)
		if v.KeyInversions != s.inversions || v.KeyReorders != s.reorder {
			t.Fatalf("inversions %d, reorders %d; the definition says %d, %d\n%s\n%v", v.KeyInversions, v.KeyReorders, s.inversions, s.reorder, v.Table(), v.KeyInversionExamples)
		}
		if (v.Row(CheckKeyInversions)[1] == string(Fail)) != (s.inversions > 0) {
			t.Fatalf("ordering PerKey with %d inversions: line %v", s.inversions, v.Row(CheckKeyInversions))
		}
	})
}

// A history that keeps a barrier (every key's row first delivered after
// its earlier rows were acknowledged, whatever their units) is clean under
// PerKey; holding back one earlier row's acknowledgement of another unit
// past a later row's first delivery makes exactly that row an inversion.
func TestBarrierHistoriesAreCleanAndOneLateAckIsCaught(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 12).Draw(t, "rows")
		unitOf := make([]int, n)
		procs := make([]*procBuilder, 3)
		for u := range procs {
			procs[u] = newProc(fmt.Sprintf("m%d-%d-1", u, 100+u), fmt.Sprintf("m%d", u), 1)
		}
		in := Input{Keys: map[string]KeyedRow{}, Ordering: OrderingPerKey, NoRegistry: true}
		// late is the row whose ack is held back past the next row's
		// delivery, or -1 for none; the next row is of another unit.
		late := rapid.IntRange(-1, n-2).Draw(t, "late row")
		at, lateAck := 10, 0
		for i := range n {
			switch {
			case i == late:
				unitOf[i] = 0
			case late >= 0 && i == late+1:
				unitOf[i] = 1
			default:
				unitOf[i] = rapid.IntRange(0, 2).Draw(t, "unit")
			}
			id := fmt.Sprintf("r%d", i)
			in.Keys[id] = KeyedRow{Key: "k", Seq: int64(i + 1)}
			at += rapid.IntRange(1, 5).Draw(t, "gap")
			unit := fmt.Sprintf("0.%d", unitOf[i])
			procs[unitOf[i]].deliver(unit, 1, id, at)
			at += rapid.IntRange(0, 5).Draw(t, "handler")
			if i != late {
				procs[unitOf[i]].ack(unit, 1, id, at, at+1)
			}
		}
		if late >= 0 {
			lateAck = at + 1
			procs[0].ack("0.0", 1, fmt.Sprintf("r%d", late), lateAck, lateAck+1)
		}
		for u, p := range procs {
			in.Processes = append(in.Processes, p.done())
			in.Expected = append(in.Expected, ExpectedProcess{Member: fmt.Sprintf("m%d", u), PID: 100 + u})
		}
		v := Check(in)
		if late < 0 {
			if v.KeyInversions != 0 || v.KeyReorders != 0 || !v.Clean() {
				t.Fatalf("a barrier history: inversions %d, reorders %d\n%s", v.KeyInversions, v.KeyReorders, v.Table())
			}
			return
		}
		// Every later row is delivered before the late ack: those of other
		// units are inversions, those of late's own unit reorders.
		if v.KeyInversions < 1 || v.KeyInversions+v.KeyReorders != n-1-late || v.Clean() {
			t.Fatalf("r%d acked at %d, after every later row was delivered: inversions %d, reorders %d, want %d in all\n%s",
				late, lateAck, v.KeyInversions, v.KeyReorders, n-1-late, v.Table())
		}
		if !containsAll(v.KeyInversionExamples[0], fmt.Sprintf("row r%d (seq %d)", late+1, late+2), fmt.Sprintf("row r%d (seq %d) of unit 0.0", late, late+1)) {
			t.Fatalf("first example %q, want r%d inverted by r%d", v.KeyInversionExamples[0], late+1, late)
		}
	})
}
