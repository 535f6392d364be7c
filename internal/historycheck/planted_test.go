package historycheck

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// takeover is the crash story the P5 cases start from: a holds 0.0 at
// epoch 1, delivers and acks r1; its lease expires at 25; b adopts at 40
// (grace 5 ms) and delivers and acks r2.
func takeover() Input {
	in := handover()
	in.Claims = []ClaimEvent{claim("0.0", "a", 1, 1, OpClaim, 1, 10), claim("0.0", "b", 1, 2, OpAdopt, 1, 40)}
	in.Leases[0] = lease("a", 1, 0, 25)
	return in
}

func takeoverWith(changes ...func(*Input)) Input {
	in := takeover()
	for _, c := range changes {
		c(&in)
	}
	return in
}

// Each case plants one violation of a rule the checker gained for issue 19
// (or the boundary that must stay clean) and names the check it must fail.
func TestPlantedViolations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      Input
		clean   bool
		want    map[string]string
		example map[string][]string
	}{
		// P5 from the registry's history.
		{
			name:  "adoption at the owner's lease expiry plus the grace is clean",
			in:    takeoverWith(func(in *Input) { in.Leases[0] = lease("a", 1, 0, 35) }),
			clean: true,
			want:  map[string]string{CheckP5: "0"},
		},
		{
			name:    "adoption while the owner's lease is live fails P5",
			in:      takeoverWith(func(in *Input) { in.Leases[0] = lease("a", 1, 0, 1000) }),
			want:    map[string]string{CheckP5: "1", CheckStaleDeliveries: "0", CheckOverlaps: "0"},
			example: map[string][]string{CheckP5: {"adopt of unit 0.0 by b inc 1 epoch 2", "the owner a's lease (inc 1) expired at", "less than the grace (5ms)"}},
		},
		{
			name:    "adoption within the grace after the owner's lease expired fails P5",
			in:      takeoverWith(func(in *Input) { in.Leases[0] = lease("a", 1, 0, 36) }),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"less than the grace"}},
		},
		{
			name: "adoption by a fenced member fails P5",
			in: takeoverWith(func(in *Input) {
				in.Leases = append(in.Leases, LeaseEvent{Member: "b", Incarnation: 1, At: at(30), ExpiresAt: at(1000), Fenced: true})
			}),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"b was fenced"}},
		},
		{
			name: "adoption within the grace after the adopter's own fence lifted fails P5",
			in: takeoverWith(func(in *Input) {
				in.Leases = append(in.Leases, LeaseEvent{Member: "b", Incarnation: 1, At: at(37), ExpiresAt: at(1000), FenceLiftedAt: at(37)})
			}),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"b's own fence lifted at", "less than the grace"}},
		},
		{
			name: "adoption the grace after the adopter's fence lifted is clean",
			in: takeoverWith(func(in *Input) {
				in.Leases = append(in.Leases, LeaseEvent{Member: "b", Incarnation: 1, At: at(35), ExpiresAt: at(1000), FenceLiftedAt: at(35)})
			}),
			clean: true,
		},
		{
			name: "re-home while the earlier incarnation's lease is live fails P5",
			in: with(func(in *Input) {
				// a's incarnation 2 joins at 30 and re-homes 0.0 at 40; its
				// incarnation 1 (which may still be delivering) holds its
				// lease until 1000.
				in.Claims = []ClaimEvent{claim("0.0", "a", 1, 1, OpClaim, 1, 10), claim("0.0", "a", 2, 2, OpRehome, 1, 40)}
				in.Leases = append(in.Leases, lease("a", 2, 30, 1000))
				in.Processes[1] = newProc("b-2-200", "b", 1).done()
				in.Sink, in.Published = in.Sink[:1], published("0.0", "r1")
			}),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"rehome of unit 0.0 by a inc 2", "incarnation 1's lease expired at"}},
		},
		{
			name: "re-home after the earlier incarnation's lease plus the grace is clean",
			in: with(func(in *Input) {
				in.Claims = []ClaimEvent{claim("0.0", "a", 1, 1, OpClaim, 1, 10), claim("0.0", "a", 2, 2, OpRehome, 1, 40)}
				in.Leases = []LeaseEvent{lease("a", 1, 0, 35), lease("a", 2, 30, 1000), lease("b", 1, 0, 1000)}
				in.Processes[1] = newProc("b-2-200", "b", 1).done()
				in.Sink, in.Published = in.Sink[:1], published("0.0", "r1")
			}),
			clean: true,
		},
		{
			name:    "a re-home after a recovery, within the lease only the lost primary had renewed, fails P5",
			in:      afterRecovery(55),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"rehome of unit 0.0 by a inc 2", "after a recovery: b (inc 1, epoch 2) held it before", "possibly live until"}},
		},
		{
			name:  "a recovery's token move is no claim, and a re-home after the lost lease plus the grace is clean",
			in:    afterRecovery(70),
			clean: true,
		},
		{
			name: "plain claim of a unit another live member holds: two valid claims",
			in: with(func(in *Input) {
				in.Claims = []ClaimEvent{claim("0.0", "a", 1, 1, OpClaim, 1, 10), claim("0.0", "b", 1, 2, OpClaim, 1, 40)}
			}),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"two valid claims: a (inc 1, epoch 1) held it"}},
		},
		{
			name:    "no grace in the input: P5 fails, not n/a",
			in:      with(func(in *Input) { in.Grace = 0 }),
			want:    map[string]string{CheckP5: "1"},
			example: map[string][]string{CheckP5: {"no grace"}},
		},
		{
			name:    "no epochs in the input: P2 fails, not n/a",
			in:      with(func(in *Input) { in.Epochs = nil }),
			want:    map[string]string{CheckP2: "1"},
			example: map[string][]string{CheckP2: {"no topology epoch"}},
		},

		// Delivery windows.
		{
			name: "unsettled delivery's window runs to its process's last record",
			in: with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
				fetch("0.1", 55, 60, 0))),
			want:    map[string]string{CheckOverlaps: "1", CheckStaleDeliveries: "0"},
			example: map[string][]string{CheckOverlaps: {"a-1-100 deliver unit 0.0", "b-2-200 deliver"}},
		},
		{
			name: "withheld delivery's window runs to the withhold",
			in: with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
				add(history.KindWithheld, "0.0", 1, "r1", 55, 0))),
			want: map[string]string{CheckOverlaps: "1"},
		},
		{
			// a was paused inside its handler from 20: its lease lapsed at
			// 25, b adopted at 40 and delivered at 50, and a, resumed,
			// withheld the row at 60. While a's lease was live nobody
			// else acted; after it, a's actions are judged by their tokens.
			name: "a delivery open across its member's lease lapse ends there",
			in: takeoverWith(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
				add(history.KindWithheld, "0.0", 1, "r1", 60, 0))),
			clean: true,
			want:  map[string]string{CheckOverlaps: "0"},
		},
		{
			// The same pause, but a's lease was renewed until 55 (its
			// renewals got through): its open handler overlaps b's.
			name: "a delivery open while its member's lease is renewed overlaps the next owner",
			in: takeoverWith(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
				add(history.KindWithheld, "0.0", 1, "r1", 60, 0)), func(in *Input) {
				in.Leases = append(in.Leases, lease("a", 1, 24, 55))
			}),
			want: map[string]string{CheckOverlaps: "1", CheckP5: "1"},
		},
		{
			name: "delivery withheld before the next owner delivers is clean",
			in: with(proc(0, newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
				add(history.KindAbandon, "0.0", 1, "r1", 25, 0))),
			clean: true,
		},
		{
			// Checked at 20 under a's claim, handed to the handler only at
			// 45, after the unit became b's (40).
			name:    "delivery acted on after its claim moved is outside claim",
			in:      with(proc(0, newProc("a-1-100", "a", 1).add(history.KindDeliver, "0.0", 1, "r1", 20, 45).nd(1))),
			want:    map[string]string{CheckStaleDeliveries: "1", CheckOverlaps: "0"},
			example: map[string][]string{CheckStaleDeliveries: {"took effect until", "claim was b's at epoch 2"}},
		},

		// Completeness.
		{
			name:    "a started process without a history fails",
			in:      with(func(in *Input) { in.Expected = append(in.Expected, ExpectedProcess{Member: "c", PID: 3}) }),
			want:    map[string]string{CheckHistories: "1"},
			example: map[string][]string{CheckHistories: {"process pid 3 of c has no history"}},
		},
		{
			name:    "a history of another pid does not stand for the started process",
			in:      with(func(in *Input) { in.Expected[1].PID = 7 }),
			want:    map[string]string{CheckHistories: "2"},
			example: map[string][]string{CheckHistories: {"pid 7 of b has no history"}},
		},
		{
			name:    "truncated history of a process that was not killed fails",
			in:      with(func(in *Input) { in.Processes[1].Truncated = true }),
			want:    map[string]string{CheckHistories: "1"},
			example: map[string][]string{CheckHistories: {"history b-2-200 ends in a partial record"}},
		},
		{
			name: "truncated history of a killed process is allowed",
			in: with(func(in *Input) {
				in.Processes[1].Truncated = true
				in.Expected[1].Abrupt = true
			}),
			clean: true,
		},
		{
			name:  "an expected process without a pid matches its member's history",
			in:    with(func(in *Input) { in.Expected[0].PID = 0 }),
			clean: true,
		},
		{
			name:    "a history of a process the harness did not list fails",
			in:      with(func(in *Input) { in.Expected = in.Expected[:1] }),
			want:    map[string]string{CheckHistories: "1"},
			example: map[string][]string{CheckHistories: {"history b-2-200 is of no process the harness listed"}},
		},
		{
			name:    "no list of started processes fails",
			in:      with(func(in *Input) { in.Expected = nil }),
			want:    map[string]string{CheckHistories: "1"},
			example: map[string][]string{CheckHistories: {"listed no processes"}},
		},
		{
			name:    "a sink write before any delivery of its row is unrecorded",
			in:      with(func(in *Input) { in.Sink[0] = write("r1", "0.0", "a", 1, 19) }),
			want:    map[string]string{CheckUnrecorded: "1"},
			example: map[string][]string{CheckUnrecorded: {"row r1", "at or before it"}},
		},
		{
			// a writes r1, naks it itself, gets it again (delivery count not
			// recorded) and writes it again: nobody took anything over.
			name: "a process that naks its own write and writes again is no takeover",
			in: with(func(in *Input) {
				in.Processes[0] = newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
					add(history.KindNak, "0.0", 1, "r1", 22, 23).nd(1).
					add(history.KindDeliver, "0.0", 1, "r1", 24, 0).ack("0.0", 1, "r1", 26, 27).done()
				in.Sink = []SinkWrite{write("r1", "0.0", "a", 1, 21), write("r1", "0.0", "a", 1, 25), in.Sink[1]}
			}),
			want: map[string]string{CheckDupUnexplained: "1", CheckDupExplained: "0 (0/0/0)"},
		},
		{
			// The same nak'd write, then the unit moves: b's delivery of r1
			// after a's is a takeover (different member).
			name: "a redelivery to another member after an unacked write is a takeover",
			in: takeoverWith(func(in *Input) {
				in.Processes[0] = newProc("a-1-100", "a", 1).deliver("0.0", 1, "r1", 20).
					add(history.KindNak, "0.0", 1, "r1", 22, 23).nd(1).done()
				in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r1", 50).ack("0.0", 2, "r1", 52, 53).done()
				in.Sink = []SinkWrite{write("r1", "0.0", "a", 1, 21), write("r1", "0.0", "b", 2, 51)}
				in.Published = published("0.0", "r1")
			}),
			clean: true,
			want:  map[string]string{CheckDupExplained: "1 (1/0/0)"},
		},

		// Per-key order (issue 24): a key's row first delivered before an
		// earlier row of the key was acknowledged.
		{
			name:  "a moved key's row delivered after its old unit acked the earlier row is in order",
			in:    movedKey(),
			clean: true,
			want:  map[string]string{CheckKeyInversions: "0", CheckKeyReorders: "0"},
		},
		{
			// a acks r1 only at 60; b, on the key's new unit, delivered r2
			// at 50: the change moved k while r1 still waited in 0.1.
			name:    "a moved key's row delivered before its old unit acked the earlier row is a cross-unit inversion",
			in:      movedKeyWith(r1AckedAt(60, 61)),
			want:    map[string]string{CheckKeyInversions: "1", CheckKeyReorders: "0", CheckOverlaps: "0", CheckP2: "0"},
			example: map[string][]string{CheckKeyInversions: {"key k: row r2 (seq 2) first delivered on unit 0.9 by b-2-200", "before row r1 (seq 1) of unit 0.1 was acknowledged"}},
		},
		{
			name:  "the same inversion in a run that declares no ordering is information",
			in:    movedKeyWith(r1AckedAt(60, 61), ordering(OrderingNone)),
			clean: true,
			want:  map[string]string{CheckKeyInversions: "1"},
		},
		{
			// The ack was sent at 45 and returned at 55; r2 came at 50. A
			// barrier reading the ack floor may have seen it by then.
			name:  "a row delivered while the earlier row's ack was in flight is not an inversion",
			in:    movedKeyWith(r1AckedAt(45, 55)),
			clean: true,
			want:  map[string]string{CheckKeyInversions: "0"},
		},
		{
			// a's first ack of r1 failed (the connection closed): NATS
			// redelivered r1 at 56 and a acked it at 58, after r2.
			name: "an ack that failed does not acknowledge its row",
			in: movedKeyWith(proc(0, newProc("a-1-100", "a", 1).deliver("0.1", 1, "r1", 20).ack("0.1", 1, "r1", 40, 41).detail("nats: connection closed").
				deliver("0.1", 1, "r1", 56).nd(2).ack("0.1", 1, "r1", 58, 59)), func(in *Input) {
				in.Sink = append(in.Sink, write("r1", "0.1", "a", 1, 57))
			}),
			want:    map[string]string{CheckKeyInversions: "1", CheckDupExplained: "1 (0/0/1)"},
			example: map[string][]string{CheckKeyInversions: {"row r1 (seq 1) of unit 0.1 was acknowledged at 2026-03-04T05:06:07.058"}},
		},
		{
			// Both rows of k are in 0.1: a got r1, its handler outlived
			// ack_wait, NATS redelivered r1 after a had delivered and acked
			// r2. At-least-once, counted apart, not a violation.
			name: "a redelivery within one unit is a reorder, not an inversion",
			in: movedKeyWith(proc(0, newProc("a-1-100", "a", 1).deliver("0.1", 1, "r1", 20).
				add(history.KindNak, "0.1", 1, "r1", 22, 23).
				deliver("0.1", 1, "r2", 24).ack("0.1", 1, "r2", 26, 27).
				deliver("0.1", 1, "r1", 30).nd(2).ack("0.1", 1, "r1", 32, 33)), func(in *Input) {
				in.Processes[1] = newProc("b-2-200", "b", 1).done()
				in.Sink = []SinkWrite{write("r1", "0.1", "a", 1, 31), write("r2", "0.1", "a", 1, 25)}
				in.Published = map[string]string{"r1": "0.1", "r2": "0.1"}
			}),
			clean: true,
			want:  map[string]string{CheckKeyInversions: "0", CheckKeyReorders: "1"},
		},
		{
			name:    "ordering PerKey with no keyed row delivered fails: no evidence, no verdict",
			in:      with(ordering(OrderingPerKey)),
			want:    map[string]string{CheckKeyInversions: "1"},
			example: map[string][]string{CheckKeyInversions: {"declares ordering PerKey, but no row with a key"}},
		},
		{
			name:    "an ordering the checker does not know fails",
			in:      movedKeyWith(ordering("perkey")),
			want:    map[string]string{CheckKeyInversions: "1"},
			example: map[string][]string{CheckKeyInversions: {`Input.Ordering "perkey" is neither None nor PerKey`}},
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
		})
	}
}

// checks P5: on random lease expiries, fence lifts and adoption instants,
// an adoption fails P5 exactly when it comes before the owner's expiry plus
// the grace, or before the adopter's own lift plus the grace.
func TestRandomAdoptionsAreJudgedByTheGrace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		expiry := rapid.IntRange(15, 60).Draw(t, "owner expiry")
		grace := rapid.IntRange(1, 20).Draw(t, "grace")
		adoptAt := rapid.IntRange(30, 90).Draw(t, "adopt")
		lift := rapid.IntRange(-1, adoptAt).Draw(t, "adopter's fence lift (-1: never)")
		in := takeover()
		in.Grace = time.Duration(grace) * time.Millisecond
		in.Leases[0] = lease("a", 1, 0, expiry)
		in.Claims[1].At = at(adoptAt)
		if lift >= 0 {
			in.Leases = append(in.Leases, LeaseEvent{Member: "b", Incarnation: 1, At: at(lift), ExpiresAt: at(1000), FenceLiftedAt: at(lift)})
		}
		early := adoptAt < expiry+grace || (lift >= 0 && adoptAt < lift+grace)
		if v := Check(in); (v.P5Violations > 0) != early {
			t.Fatalf("expiry %d, grace %d, lift %d, adoption at %d: early %v, P5 violations %d\n%s",
				expiry, grace, lift, adoptAt, early, v.P5Violations, v.Table())
		}
	})
}

// leaseEnd agrees with its definition taken instant by instant: the first
// instant from x on at which the member's lease of the incarnation is not
// live (the lease event holding then is of another incarnation, a leave,
// or expired), or limit.
func TestLeaseEndMatchesInstantByInstant(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var leases []LeaseEvent
		at := 0
		for range rapid.IntRange(0, 8).Draw(t, "events") {
			at += rapid.IntRange(0, 6).Draw(t, "gap")
			e := lease("a", int64(rapid.IntRange(1, 2).Draw(t, "inc")), at, at+rapid.IntRange(0, 8).Draw(t, "ttl"))
			e.Left = rapid.IntRange(0, 5).Draw(t, "left") == 0
			leases = append(leases, e)
		}
		inc := int64(rapid.IntRange(0, 2).Draw(t, "record's inc"))
		x := rapid.IntRange(0, 40).Draw(t, "x")
		limit := x + rapid.IntRange(0, 40).Draw(t, "window")
		tk := indexTokens(nil, leases)
		live := func(ms int) bool {
			l, ok := tk.leaseAt("a", wall(ms))
			if inc == 0 {
				// Any incarnation, but the one holding at x.
				first, ok0 := tk.leaseAt("a", wall(x))
				return ok && ok0 && !l.ev.Left && l.expires > wall(ms) && l.ev.Incarnation == first.ev.Incarnation
			}
			return ok && !l.ev.Left && l.expires > wall(ms) && l.ev.Incarnation == inc
		}
		want := limit
		for ms := x; ms < limit; ms++ {
			if !live(ms) {
				want = ms
				break
			}
		}
		if got := tk.leaseEnd("a", inc, wall(x), wall(limit)); got != wall(want) {
			t.Fatalf("leaseEnd(inc %d, x %d, limit %d) = %v, want %d ms; leases %+v", inc, x, limit, time.Duration(got-wall(0)), want, leases)
		}
	})
}

// afterRecovery is a registry failover as the clients lived it: a hands
// 0.0 over to b on the primary, which renews b's lease until 60 and dies;
// the promoted standby never got the handover, so its Recover (at 45)
// moves the token of the row it has, still a's, and ends every lease.
// Then a's new incarnation re-homes the unit at rehomeMs.
func afterRecovery(rehomeMs int) Input {
	return with(func(in *Input) {
		in.Processes[1] = newProc("b-2-200", "b", 1).deliver("0.0", 2, "r2", 41).ack("0.0", 2, "r2", 42, 43).done()
		in.Sink[1] = write("r2", "0.0", "b", 2, 41)
		in.Claims = []ClaimEvent{
			claim("0.0", "a", 1, 1, OpClaim, 1, 10),
			{Unit: "0.0", Owner: "a", Incarnation: 1, Epoch: 1, State: StateHandover, Op: "handover", At: at(30)},
			claim("0.0", "b", 1, 2, OpSettle, 1, 40),
			claim("0.0", "a", 1, 1001, OpRecover, 1, 45),
			claim("0.0", "a", 2, 1002, OpRehome, 1, rehomeMs),
		}
		in.Leases = []LeaseEvent{lease("a", 1, 0, 1000), lease("b", 1, 0, 60),
			lease("a", 1, 45, 45), lease("b", 1, 45, 45), lease("a", 2, 46, 1000)}
	})
}
