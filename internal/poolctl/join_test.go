package poolctl

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Defect 6 of issue 20: two live processes under one pod name (a
// partitioned old pod that heals after its replacement started) must not
// take the name from each other in turn, or the same-name re-home never
// comes. The newer process keeps the name; the older one is refused
// (ErrDisplaced) at every try, also once the newer one is gone (it is the
// old pod's process). Both behave as workers do: renew every interval,
// rejoin when the renewal is refused. checks P1, P5
func TestTwoProcessesUnderOneNameDoNotLivelock(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		name := MemberRef{Topology: topo, Member: "a"}
		old, err := r.Rejoin(ctx, name, "a#1")
		must(t, err)
		for _, u := range []string{"0.0", "0.1"} {
			_, err := r.Claim(ctx, old.MemberRef, 1, u)
			must(t, err)
		}
		// The old process is cut off; its replacement starts 10s later.
		must(t, r.ShiftClock(ctx, topo, 10*time.Second))
		cur, err := r.Rejoin(ctx, name, "a#2")
		must(t, err)
		rehomeAt := old.ExpiresAt.Add(testParams.Grace)

		for step := 1; ; step++ {
			// The old process heals and tries, as a worker would.
			_, err := r.Renew(ctx, old.MemberRef)
			wantErr(t, "renewal of the displaced incarnation", err, ErrStaleIncarnation)
			_, err = r.Rejoin(ctx, old.MemberRef, "a#1")
			var de *DisplacedError
			if !errors.As(err, &de) || de.Current != cur.Incarnation || !de.LiveUntil.Equal(cur.ExpiresAt) {
				t.Fatalf("step %d: rejoin of the displaced process: %v, want displaced by %d live until %v",
					step, err, cur.Incarnation, cur.ExpiresAt)
			}
			conf, err := r.ConfirmOwned(ctx, cur.MemberRef, nil)
			must(t, err)
			s, err := r.Snapshot(ctx, topo)
			must(t, err)
			if s.Now.Before(rehomeAt) {
				if len(conf.Held) != 0 || !equalStrings(conf.Waiting, []string{"0.0", "0.1"}) {
					t.Fatalf("step %d: confirm before the old lease and grace passed: %+v", step, conf)
				}
			} else {
				if len(conf.Held) != 2 || len(conf.Waiting) != 0 {
					t.Fatalf("step %d: confirm %v after the old lease and grace: %+v", step, s.Now.Sub(rehomeAt), conf)
				}
				break
			}
			if step > 6 {
				t.Fatalf("no re-home after %d renewals", step)
			}
			must(t, r.ShiftClock(ctx, topo, testParams.RenewInterval))
			if cur, err = r.Renew(ctx, cur.MemberRef); err != nil {
				t.Fatalf("step %d: renewal of the current process: %v", step, err)
			}
		}

		// The newer process's rejoin after a lost reply is its own, not a
		// displacement: it is handed the incarnation the lost reply
		// carried.
		lost, err := r.Rejoin(ctx, cur.MemberRef, "a#2")
		must(t, err)
		again, err := r.Rejoin(ctx, cur.MemberRef, "a#2")
		must(t, err)
		if again.Incarnation != lost.Incarnation {
			t.Fatalf("rejoin after a lost reply: incarnation %d, want the lost reply's %d, renewed", again.Incarnation, lost.Incarnation)
		}
		// Once the newer process is gone, the old one still does not come
		// back: the pod's next process (a first join) or the newer one's
		// own rejoin would take the name from it while it delivers
		// (simulator seed 9064). The pod's next process takes the name.
		must(t, r.ShiftClock(ctx, topo, testParams.LeaseTTL+time.Second))
		_, err = r.Rejoin(ctx, old.MemberRef, "a#1")
		wantErr(t, "rejoin of the old process after the newer one lapsed", err, ErrDisplaced)
		next, err := r.Rejoin(ctx, MemberRef{Topology: topo, Member: "a"}, "a#3")
		must(t, err)
		if next.Incarnation <= again.Incarnation {
			t.Fatalf("the pod's next process joined at incarnation %d, after %d", next.Incarnation, again.Incarnation)
		}
	})
}

// Issue 20's suspected "Join computes the same-name grace from a stale
// expiry": the earlier incarnation renews between the join's read and its
// write, and the re-home must still wait for the renewed expiry plus the
// grace, since the earlier process may deliver until then.
func TestJoinTakesTheSameNameGraceFromTheFinalExpiry(t *testing.T) { // checks P1, P5
	pg, _ := newPG(t)
	ctx := context.Background()
	topo := newTopology(t, pg, testParams, 1, 4)
	old, err := pg.Join(ctx, topo, "a")
	must(t, err)
	_, err = pg.Claim(ctx, old.MemberRef, 1, "0.0")
	must(t, err)
	var renewed Lease
	testHookJoinRead = func() {
		testHookJoinRead = nil
		must(t, pg.ShiftClock(ctx, topo, 20*time.Second))
		renewed, err = pg.Renew(ctx, old.MemberRef)
		must(t, err)
	}
	t.Cleanup(func() { testHookJoinRead = nil })
	a, err := pg.Join(ctx, topo, "a")
	must(t, err)
	if testHookJoinRead != nil || !renewed.ExpiresAt.After(old.ExpiresAt) {
		t.Fatalf("the renewal between the join's read and write did not happen: %+v", renewed)
	}
	// Past the first expiry plus the grace, short of the renewed one's.
	must(t, pg.ShiftClock(ctx, topo, 40*time.Second))
	_, err = pg.Renew(ctx, a.MemberRef)
	must(t, err)
	must(t, pg.ShiftClock(ctx, topo, 35*time.Second))
	s, err := pg.Snapshot(ctx, topo)
	must(t, err)
	if !s.Now.After(old.ExpiresAt.Add(testParams.Grace)) || !s.Now.Before(renewed.ExpiresAt.Add(testParams.Grace)) {
		t.Fatalf("clock %v not between %v and %v", s.Now, old.ExpiresAt.Add(testParams.Grace), renewed.ExpiresAt.Add(testParams.Grace))
	}
	conf, err := pg.ConfirmOwned(ctx, a.MemberRef, nil)
	must(t, err)
	if len(conf.Held) != 0 || !equalStrings(conf.Waiting, []string{"0.0"}) {
		t.Fatalf("confirm before the renewed expiry plus the grace: %+v (renewed expiry %v)", conf, renewed.ExpiresAt)
	}
}

// Issue 20's suspected "ConfirmOwned re-homes units while an epoch is
// pending": no ownership moves during a freeze (P2), so the units wait
// until the epoch is active. checks P2
func TestConfirmOwnedDoesNotRehomeWhileAnEpochIsPending(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		old, err := r.Join(ctx, topo, "a")
		must(t, err)
		_, err = r.Claim(ctx, old.MemberRef, 1, "0.0")
		must(t, err)
		// Long after the old lease lapsed, so only the freeze stands in the way.
		must(t, r.ShiftClock(ctx, topo, 5*time.Minute))
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		e, err := r.CreatePending(ctx, topo, 1, 8)
		must(t, err)
		must(t, r.AckFreeze(ctx, a.MemberRef, e))
		conf, err := r.ConfirmOwned(ctx, a.MemberRef, map[string]int64{"0.0": 1})
		must(t, err)
		if len(conf.Held) != 0 || len(conf.Moved) != 0 || !equalStrings(conf.Waiting, []string{"0.0"}) {
			t.Fatalf("confirm while epoch %d is pending: %+v", e, conf)
		}
		must(t, r.Activate(ctx, topo, e))
		conf, err = r.ConfirmOwned(ctx, a.MemberRef, map[string]int64{"0.0": 1})
		must(t, err)
		if len(conf.Held) != 1 || conf.Held["0.0"].Epoch != 2 || len(conf.Waiting) != 0 {
			t.Fatalf("confirm once epoch %d is active: %+v", e, conf)
		}
	})
}

// Issue 20: a process's join that reaches the registry after the process
// gave up on it and joined again (or whose reply was lost) names the same
// process. While that process's incarnation is live the join renews it
// rather than starting a later one, which would supersede the incarnation
// the process delivers under. Once it lapsed, the late join starts a new
// incarnation, and the process's rejoin (naming the one it held) is handed
// that one, not refused as displaced. checks P1
func TestAProcesssOwnLateJoinRenewsItsLiveIncarnation(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		name := MemberRef{Topology: topo, Member: "a"}
		cur, err := r.Rejoin(ctx, name, "a#1") // the retry, granted first
		must(t, err)
		must(t, r.ShiftClock(ctx, topo, time.Second))
		late, err := r.Rejoin(ctx, name, "a#1") // the first join, late
		must(t, err)
		if late.Incarnation != cur.Incarnation || !late.ExpiresAt.After(cur.ExpiresAt) {
			t.Fatalf("late join while incarnation %d is live: %+v, want it renewed", cur.Incarnation, late)
		}
		_, err = r.Renew(ctx, cur.MemberRef)
		must(t, err)

		// Lapsed: the late join starts a new incarnation, and the
		// process's rejoin is handed it.
		must(t, r.ShiftClock(ctx, topo, testParams.LeaseTTL+time.Second))
		newer, err := r.Rejoin(ctx, name, "a#1")
		must(t, err)
		if newer.Incarnation <= cur.Incarnation {
			t.Fatalf("late join after the lapse: incarnation %d, want above %d", newer.Incarnation, cur.Incarnation)
		}
		_, err = r.Renew(ctx, cur.MemberRef)
		wantErr(t, "renewal of the superseded incarnation", err, ErrStaleIncarnation)
		back, err := r.Rejoin(ctx, cur.MemberRef, "a#1")
		must(t, err)
		if back.Incarnation != newer.Incarnation {
			t.Fatalf("rejoin of the process: incarnation %d, want its own %d", back.Incarnation, newer.Incarnation)
		}
		// Another process's rejoin naming an earlier incarnation is
		// still displaced.
		_, err = r.Rejoin(ctx, cur.MemberRef, "a#2")
		wantErr(t, "rejoin by another process", err, ErrDisplaced)
	})
}
