package historycheck

import (
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// handover is the clean story every case starts from (checks P1, P2, P3):
// a holds unit 0.0 at fencing epoch 1, delivers and acks row r1, releases;
// b claims at epoch 2 and delivers and acks r2.
func handover() Input {
	a := newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 23)
	b := newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).ack("0.0", 2, "r2", 52, 53)
	return Input{
		Processes: []history.Process{a.done(), b.done()},
		Claims: []ClaimEvent{
			claim("0.0", "a", 1, 1, OpClaim, 1, 10),
			release("0.0", 1, 30),
			claim("0.0", "b", 1, 2, OpClaim, 1, 40),
		},
		Leases:    []LeaseEvent{lease("a", 1, 0, 1000), lease("b", 1, 0, 1000)},
		Epochs:    []EpochSpan{epoch(1, 1, 1, 0, 0)},
		Sink:      []SinkWrite{write("r1", "0.0", "a", 1, 21), write("r2", "0.0", "b", 2, 51)},
		Published: published("0.0", "r1", "r2"),
		Expected:  []ExpectedProcess{{Member: "a", PID: 1}, {Member: "b", PID: 2}},
		Grace:     5 * time.Millisecond,
	}
}

// with applies changes to a fresh handover.
func with(changes ...func(*Input)) Input {
	in := handover()
	for _, c := range changes {
		c(&in)
	}
	return in
}

// proc replaces process i.
func proc(i int, b *procBuilder) func(*Input) {
	return func(in *Input) { in.Processes[i] = b.done() }
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    Input
		clean bool
		// want maps a check to its expected value (Row's first cell).
		want map[string]string
		// example maps a check to substrings its first example must hold.
		example map[string][]string
	}{
		{
			name:  "clean handover: a releases, b claims, no overlap",
			in:    handover(),
			clean: true,
			want:  zeroes(),
		},
		{
			name: "window ending at the instant the next one starts is not an overlap",
			in: with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 40)),
				proc(1, newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 40).ack("0.0", 2, "r2", 52, 53))),
			clean: true,
			want:  map[string]string{CheckOverlaps: "0", CheckUnitsDoublePulled: "0"},
		},
		{
			// a's claim check before acking passed (22 < release at 30), but
			// its ack call returned only at 55: the windows show it, and so
			// does the ack's second instant (the unit was b's from 40).
			name: "overlap: b delivers while a's ack is still in flight",
			in:   with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 55))),
			want: map[string]string{
				CheckOverlaps: "1", CheckUnitsDoublePulled: "1", CheckMaxDoublePulled: "1",
				CheckStaleAcks: "1", CheckStaleDeliveries: "0",
			},
			example: map[string][]string{
				CheckOverlaps:  {"unit 0.0", "a-1-100 deliver", "b-2-200 deliver", "row r1", "row r2"},
				CheckStaleAcks: {"took effect until", "claim was b's at epoch 2"},
			},
		},
		{
			// b's pull went out at 25, while a still held its row: a
			// process waiting on a pull of the unit is pulling it.
			name: "overlap: b's pull began inside a's window (fetch to settle)",
			in:   with(proc(1, newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).fetched(21).ack("0.0", 2, "r2", 52, 53))),
			want: map[string]string{CheckOverlaps: "1", CheckUnitsDoublePulled: "1", CheckStaleDeliveries: "0"},
		},
		{
			name:  "a pull that began after the other window ended is no overlap",
			in:    with(proc(1, newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).fetched(41).ack("0.0", 2, "r2", 52, 53))),
			clean: true,
			want:  map[string]string{CheckOverlaps: "0"},
		},
		{
			// Both pulled 0.0 at once, but only a delivered: pulling is not
			// acting, so P1 holds; the count is information.
			name: "two processes pulling one unit at once are counted, not failed",
			in: with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 23).fetch("0.0", 15, 45, 1)),
				proc(1, newProc("b-2-200", "b", 1).fetch("0.0", 35, 48, 0).deliver("0.0", 2, "r2", 50).ack("0.0", 2, "r2", 52, 53))),
			clean: true,
			want:  map[string]string{CheckPulledByTwo: "1", CheckOverlaps: "0"},
		},
		{
			name: "zero-length delivery strictly inside another process's window is an overlap",
			in:   with(proc(1, newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 21).ack("0.0", 2, "r2", 52, 53))),
			want: map[string]string{CheckOverlaps: "1", CheckStaleDeliveries: "1"},
		},
		{
			name: "stale ack: a acks after its claim moved to b",
			in: with(
				proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 45, 46)),
				proc(1, newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).ack("0.0", 2, "r2", 52, 53)),
			),
			want:    map[string]string{CheckStaleAcks: "1", CheckOverlaps: "0", CheckStaleDeliveries: "0"},
			example: map[string][]string{CheckStaleAcks: {"a-1-100 ack unit 0.0 member a inc 1 epoch 1 row r1", "claim was b's at epoch 2"}},
		},
		{
			name: "stale ack: a acks after its lease expired, claim still its own",
			in: with(func(in *Input) {
				in.Leases[0] = lease("a", 1, 0, 22)
				in.Processes[0] = newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 23).done()
			}),
			want:    map[string]string{CheckStaleAcks: "1", CheckStaleDeliveries: "0", CheckStaleWrites: "0"},
			example: map[string][]string{CheckStaleAcks: {"ack", "lease expired at"}},
		},
		{
			name:    "delivery under a lease that expired",
			in:      with(func(in *Input) { in.Leases[0] = lease("a", 1, 0, 15) }),
			want:    map[string]string{CheckStaleDeliveries: "1", CheckStaleAcks: "1", CheckStaleWrites: "1"},
			example: map[string][]string{CheckStaleDeliveries: {"a-1-100 deliver unit 0.0 member a", "row r1", "lease expired"}},
		},
		{
			name: "delivery by a member that left",
			in: with(func(in *Input) {
				in.Leases = append(in.Leases, LeaseEvent{Member: "b", Incarnation: 1, At: at(45), Left: true})
			}),
			want:    map[string]string{CheckStaleDeliveries: "1", CheckStaleAcks: "1", CheckStaleWrites: "1"},
			example: map[string][]string{CheckStaleDeliveries: {"b left at"}},
		},
		{
			name: "zombie of an earlier incarnation does not borrow its successor's claim",
			in: with(func(in *Input) {
				in.Claims[2] = claim("0.0", "b", 2, 2, OpClaim, 1, 40)
				in.Leases[1] = lease("b", 2, 0, 1000)
			}),
			want:    map[string]string{CheckStaleDeliveries: "1", CheckStaleAcks: "1", CheckStaleWrites: "0"},
			example: map[string][]string{CheckStaleDeliveries: {"claim was incarnation 2's, the record is incarnation 1's"}},
		},
		{
			name:    "stale sink write: a writes after releasing",
			in:      with(func(in *Input) { in.Sink[0] = write("r1", "0.0", "a", 1, 31) }),
			want:    map[string]string{CheckStaleWrites: "1", CheckUnrecorded: "0"},
			example: map[string][]string{CheckStaleWrites: {"sink write of row r1 unit 0.0 by a epoch 1", "claim was free"}},
		},
		{
			name:    "lost row",
			in:      with(func(in *Input) { in.Published["r3"] = "0.0" }),
			want:    map[string]string{CheckLost: "1"},
			example: map[string][]string{CheckLost: {"row r3 published to unit 0.0"}},
		},
		{
			name:    "unrecorded sink write",
			in:      with(func(in *Input) { in.Sink = append(in.Sink, write("r3", "0.0", "b", 2, 55)) }),
			want:    map[string]string{CheckUnrecorded: "1", CheckStaleWrites: "0"},
			example: map[string][]string{CheckUnrecorded: {"row r3", "by b epoch 2"}},
		},
		{
			name: "duplicate after a takeover is explained",
			in: with(func(in *Input) {
				// a delivers r1, writes it, dies before acking; its lease
				// runs out and b adopts and gets r1 again.
				in.Processes[0] = newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).done()
				in.Leases[0] = lease("a", 1, 0, 25)
				in.Claims = []ClaimEvent{claim("0.0", "a", 1, 1, OpClaim, 1, 10), claim("0.0", "b", 1, 2, OpAdopt, 1, 40)}
				in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r1", 50).nd(2).ack("0.0", 2, "r1", 52, 53).done()
				in.Sink[1] = write("r1", "0.0", "b", 2, 51)
				in.Published = published("0.0", "r1")
			}),
			clean: true,
			want:  map[string]string{CheckDupExplained: "1 (1/0/0)", CheckDupUnexplained: "0", CheckStaleDeliveries: "0"},
		},
		{
			name: "duplicate after an ack, delivered once, no reset: unexplained",
			in: with(func(in *Input) {
				in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r1", 50).ack("0.0", 2, "r1", 52, 53).done()
				in.Sink[1] = write("r1", "0.0", "b", 2, 51)
				in.Published = published("0.0", "r1")
			}),
			want:    map[string]string{CheckDupExplained: "0 (0/0/0)", CheckDupUnexplained: "1"},
			example: map[string][]string{CheckDupUnexplained: {"sink write of row r1 unit 0.0 by b epoch 2", "repeats sink write of row r1 unit 0.0 by a epoch 1", "settled by a-1-100 ack", "delivery 1"}},
		},
		{
			name: "duplicate with a reset between is explained",
			in: with(func(in *Input) {
				in.Processes[1] = newProc("b-2-200", "b", 1).reset("0.0", 45).deliver("0.0", 2, "r1", 50).ack("0.0", 2, "r1", 52, 53).done()
				in.Sink[1] = write("r1", "0.0", "b", 2, 51)
				in.Published = published("0.0", "r1")
			}),
			clean: true,
			want:  map[string]string{CheckDupExplained: "1 (0/1/0)", CheckDupUnexplained: "0"},
		},
		{
			name: "duplicate NATS redelivered after an ack that did not land is explained",
			in: with(func(in *Input) {
				in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r1", 50).nd(3).ack("0.0", 2, "r1", 52, 53).done()
				in.Sink[1] = write("r1", "0.0", "b", 2, 51)
				in.Published = published("0.0", "r1")
			}),
			clean: true,
			want:  map[string]string{CheckDupExplained: "1 (0/0/1)"},
		},
		{
			name: "P2: claim decided outside its epoch's active interval",
			in: with(func(in *Input) {
				in.Epochs = []EpochSpan{epoch(1, 1, 1, 0, 35), epoch(2, 1, 1, 35, 0)}
			}),
			want:    map[string]string{CheckP2: "1"},
			example: map[string][]string{CheckP2: {"claim of unit 0.0 by b epoch 2", "decided under epoch 1 outside its active interval"}},
		},
		{
			name: "P2: claim under an epoch that was never activated",
			in: with(func(in *Input) {
				in.Epochs = append(in.Epochs, epoch(2, 1, 2, -1, 0))
				in.Claims[2].Under = 2
			}),
			want:    map[string]string{CheckP2: "1"},
			example: map[string][]string{CheckP2: {"(never active)"}},
		},
		{
			name: "P2: delivery of a unit of a not-yet-active epoch",
			in: with(func(in *Input) {
				in.Epochs = []EpochSpan{epoch(1, 1, 1, 0, 100), epoch(2, 1, 2, 100, 0)}
				b := newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).ack("0.0", 2, "r2", 52, 53).deliver("0.1", 1, "r9", 60)
				in.Processes[1] = b.done()
				in.Claims = append(in.Claims, claim("0.1", "b", 1, 1, OpClaim, 2, 110))
			}),
			want:    map[string]string{CheckP2: "1", CheckStaleDeliveries: "1"},
			example: map[string][]string{CheckP2: {"b-2-200 deliver unit 0.1", "no epoch active by then"}},
		},
		{
			name: "P2: two epochs active at once",
			in: with(func(in *Input) {
				in.Epochs = []EpochSpan{epoch(1, 1, 1, 0, 45), epoch(2, 1, 1, 35, 0)}
			}),
			want:    map[string]string{CheckP2: "1"},
			example: map[string][]string{CheckP2: {"epoch 2 activated", "while epoch 1 was active"}},
		},
		{
			name: "leaving unit drained under its own claim after a shrink is not a violation",
			in: with(func(in *Input) {
				// Epoch 1 is 1x2; epoch 2 shrinks to 1x1 at 35. a keeps
				// draining 0.1 under its epoch-1 claim, releases it, and b
				// adopts it to drain the rest.
				in.Epochs = []EpochSpan{epoch(1, 1, 2, 0, 35), epoch(2, 1, 1, 35, 0)}
				in.Claims = []ClaimEvent{
					claim("0.0", "a", 1, 1, OpClaim, 1, 10),
					claim("0.1", "a", 1, 1, OpClaim, 1, 11),
					release("0.0", 1, 30),
					claim("0.0", "b", 1, 2, OpClaim, 2, 40),
					release("0.1", 1, 45),
					claim("0.1", "b", 1, 2, OpAdopt, 2, 46),
				}
				in.Processes[0] = newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 23).
					deliver("0.1", 1, "r5", 40).ack("0.1", 1, "r5", 41, 42).done()
				in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 50).ack("0.0", 2, "r2", 52, 53).
					deliver("0.1", 2, "r6", 55).ack("0.1", 2, "r6", 56, 57).done()
				in.Sink = append(in.Sink, write("r5", "0.1", "a", 1, 41), write("r6", "0.1", "b", 2, 56))
				in.Published["r5"], in.Published["r6"] = "0.1", "0.1"
			}),
			clean: true,
			want:  zeroes(),
		},
		{
			name: "no registry: claim checks and P2 are n/a, overlaps still count",
			in: Input{
				NoRegistry: true,
				Processes: []history.Process{
					newProc("a-1-100", "a", 0).deliver("0.0", 0, "r1", 20).ack("0.0", 0, "r1", 22, 40).done(),
					newProc("b-2-200", "b", 0).deliver("0.0", 0, "r2", 30).ack("0.0", 0, "r2", 32, 33).done(),
				},
				Sink:      []SinkWrite{write("r1", "0.0", "a", 0, 21), write("r2", "0.0", "b", 0, 31)},
				Published: published("0.0", "r1", "r2", "r3"),
				Expected:  []ExpectedProcess{{Member: "a", PID: 1}, {Member: "b", PID: 2}},
			},
			want: map[string]string{
				CheckOverlaps: "1", CheckUnitsDoublePulled: "1",
				CheckStaleDeliveries: "n/a", CheckStaleAcks: "n/a", CheckStaleWrites: "n/a", CheckP2: "n/a",
				CheckLost: "1", CheckUnrecorded: "0",
			},
		},
		{
			name: "no registry: completeness ignores epochs",
			in: Input{
				NoRegistry: true,
				Processes:  []history.Process{newProc("a-1-100", "a", 0).deliver("0.0", 0, "r1", 20).ack("0.0", 0, "r1", 22, 40).done()},
				Sink:       []SinkWrite{write("r1", "0.0", "a", 7, 21)},
				Published:  published("0.0", "r1"),
				Expected:   []ExpectedProcess{{Member: "a", PID: 1}},
			},
			clean: true,
			want:  map[string]string{CheckUnrecorded: "0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Check(tc.in)
			if v.Clean() != tc.clean {
				t.Errorf("Clean() = %v, want %v\n%s", v.Clean(), tc.clean, v.Table())
			}
			for check, want := range tc.want {
				if got := v.Row(check)[0]; got != want {
					t.Errorf("%s = %s, want %s\n%s", check, got, want, v.Table())
				}
			}
			for check, subs := range tc.example {
				if got := example(v, check); !containsAll(got, subs...) {
					t.Errorf("%s example %q, want it to name %q", check, got, subs)
				}
			}
			if tc.clean != (v.FirstViolation == "") {
				t.Errorf("FirstViolation %q with Clean() %v", v.FirstViolation, v.Clean())
			}
		})
	}
}

// zeroes is the want of a history without any violation.
func zeroes() map[string]string {
	out := map[string]string{}
	for _, c := range CheckNames() {
		out[c] = "0"
	}
	out[CheckDupExplained] = "0 (0/0/0)"
	// No keyed rows: per-key order has nothing to judge.
	out[CheckKeyInversions], out[CheckKeyReorders] = "n/a", "n/a"
	return out
}

func TestFirstViolationIsTheEarliest(t *testing.T) {
	// A lost row has no instant and comes last; the stale write at 31 comes
	// before the unrecorded write at 55.
	v := Check(with(func(in *Input) {
		in.Published["r9"] = "0.0"
		in.Sink = append(in.Sink, write("r3", "0.0", "b", 2, 55))
		in.Sink[0] = write("r1", "0.0", "a", 1, 31)
	}))
	if !strings.HasPrefix(v.FirstViolation, CheckStaleWrites+": sink write of row r1") {
		t.Errorf("FirstViolation = %q, want the stale write", v.FirstViolation)
	}
	if last := v.Violations[len(v.Violations)-1]; last.Check != CheckLost || !last.At.IsZero() {
		t.Errorf("last violation %+v, want the lost row without an instant", last)
	}
}

func TestTableAndSideBySide(t *testing.T) {
	clean := Check(handover())
	overlap := Check(with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).ack("0.0", 1, "r1", 22, 55))))
	table := overlap.Table()
	for _, want := range []string{"evidence: 2 processes of 2 expected", "first violation: stale acks (P1): a-1-100 ack unit 0.0"} {
		if !strings.Contains(table, want) {
			t.Errorf("Table() lacks %q:\n%s", want, table)
		}
	}
	if rows := strings.Split(table, "\n"); !containsAll(rows[1], CheckOverlaps, " 1 ", "FAIL") || !containsAll(rows[4], CheckStaleDeliveries, " 0 ", "OK") {
		t.Errorf("Table() rows are not check, value, status:\n%s", table)
	}
	side := SideBySide([]string{"sequenced", "independent"}, clean, overlap)
	lines := strings.Split(strings.TrimSpace(side), "\n")
	if len(lines) != len(CheckNames())+1 {
		t.Fatalf("SideBySide has %d lines, want a header and one per check:\n%s", len(lines), side)
	}
	if !containsAll(lines[0], "check", "sequenced", "independent") || !containsAll(lines[1], CheckOverlaps, "0 OK", "1 FAIL") {
		t.Errorf("SideBySide:\n%s", side)
	}
	if clean.Row("no such check") != nil {
		t.Error("Row of an unknown check is not nil")
	}
}
