package poolctl

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

// asOperator binds either backend to an operator token.
func asOperator(t testing.TB, r testRegistry, tok OperatorToken) interface {
	Registry
	OperatorRegistry
} {
	t.Helper()
	switch x := r.(type) {
	case *PG:
		return x.AsOperator(tok)
	case *Twin:
		return x.AsOperator(tok)
	}
	t.Fatalf("backend %T has no operator tokens", r)
	return nil
}

// wantFenced fails unless err is an operator token refusal naming the
// presented and the current token.
func wantFenced(t testing.TB, what string, err error, presented, current int64, holder string) {
	t.Helper()
	var fe *OperatorFencedError
	if !errors.As(err, &fe) || !errors.Is(err, ErrOperatorSuperseded) {
		t.Fatalf("%s: got %v, want an *OperatorFencedError", what, err)
	}
	if fe.Presented != presented || fe.Current != current || fe.Holder != holder {
		t.Fatalf("%s: refusal %+v, want presented %d, current %d, holder %q", what, *fe, presented, current, holder)
	}
}

// Issue 21: an operator leader that was paused and resumes after another
// took over must not write what it decided from its old reading. The old
// leader's writes all succeed before the takeover and are all refused
// after it, whatever they are; the new leader's state stands; workers are
// not affected.
func TestOperatorTokenRefusesTheWritesOfAnOlderLeader(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		snap, err := r.Snapshot(ctx, topo)
		must(t, err)
		active := snap.Active.Number

		t1, err := r.(OperatorRegistry).TakeOperatorToken(ctx, topo, "operator-0")
		must(t, err)
		old := asOperator(t, r, t1)
		// Before the takeover the old leader writes freely.
		must(t, old.SetDraining(ctx, topo, "a", true))
		must(t, old.SetRetiring(ctx, topo, []string{"0.3"}))
		must(t, old.PublishResetPermission(ctx, topo, ResetPermission{Allowed: true, Floor: "2.14.0", Reason: "old"}))

		t2, err := r.(OperatorRegistry).TakeOperatorToken(ctx, topo, "operator-1")
		must(t, err)
		if t2.Epoch != t1.Epoch+1 || t2.Holder != "operator-1" {
			t.Fatalf("second token %+v after %+v, want the next epoch held by operator-1", t2, t1)
		}
		cur := asOperator(t, r, t2)
		must(t, cur.SetDraining(ctx, topo, "a", false))
		must(t, cur.SetRetiring(ctx, topo, nil))
		must(t, cur.PublishResetPermission(ctx, topo, ResetPermission{Allowed: false, Floor: "2.14.0", Reason: "new"}))

		// The old leader resumes and writes from its old reading.
		for _, w := range []struct {
			name  string
			write func() error
		}{
			{"SetDraining (undo the new leader's clear)", func() error { return old.SetDraining(ctx, topo, "a", true) }},
			{"SetRetiring", func() error { return old.SetRetiring(ctx, topo, []string{"0.3"}) }},
			{"PublishResetPermission", func() error {
				return old.PublishResetPermission(ctx, topo, ResetPermission{Allowed: true, Floor: "2.14.0", Reason: "old"})
			}},
			{"EnsureTopology", func() error { return old.EnsureTopology(ctx, topo, DefaultParams()) }},
			{"CreatePending", func() error { _, err := old.CreatePending(ctx, topo, 2, 4); return err }},
			{"Activate", func() error { return old.Activate(ctx, topo, active+1) }},
			{"Retire", func() error { return old.Retire(ctx, topo, active+1) }},
			{"DrainedMember (the check before a pod delete)", func() error { _, err := old.DrainedMember(ctx, topo, "a"); return err }},
		} {
			wantFenced(t, "old leader's "+w.name, w.write(), t1.Epoch, t2.Epoch, "operator-1")
		}
		// A write with no token at all (an operator from before tokens)
		// is refused as well.
		wantFenced(t, "untokened SetDraining", r.SetDraining(ctx, topo, "a", true), 0, t2.Epoch, "operator-1")
		// A token of another topology does not pass for this one.
		other := asOperator(t, r, OperatorToken{Topology: "ns/other", Epoch: t2.Epoch, Holder: "operator-1"})
		if err := other.SetDraining(ctx, topo, "a", true); !errors.Is(err, ErrOperatorSuperseded) {
			t.Fatalf("another topology's token: got %v, want a refusal", err)
		}

		// Nothing the old leader sent took effect.
		snap, err = r.Snapshot(ctx, topo)
		must(t, err)
		if m := snap.Member("a"); m == nil || m.Draining {
			t.Fatalf("member a after the old leader's writes: %+v, want not draining", m)
		}
		if len(snap.Retiring) != 0 || snap.Reset.Reason != "new" || snap.Reset.Allowed || snap.Pending != nil ||
			snap.Params != testParams.normalized() {
			t.Fatalf("after the old leader's writes: retiring %v, reset %+v, pending %v, params %+v; want the new leader's state",
				snap.Retiring, snap.Reset, snap.Pending, snap.Params)
		}
		got, err := r.(OperatorRegistry).OperatorToken(ctx, topo)
		must(t, err)
		if got.Epoch != t2.Epoch || got.Holder != "operator-1" {
			t.Fatalf("current token %+v, want %+v", got, t2)
		}
		// Workers present no operator token and are not refused.
		_, err = r.Renew(ctx, a.MemberRef)
		must(t, err)
		// The new leader goes on.
		e, err := cur.CreatePending(ctx, topo, 1, 4)
		must(t, err)
		must(t, r.AckFreeze(ctx, a.MemberRef, e))
		must(t, cur.Activate(ctx, topo, e))
	})
}

// The check a pod delete is conditional on sets the drain request and
// reads what the member holds in one step, and from then on the member
// claims nothing, so "holds nothing" stays true until the pod is gone.
func TestDrainedMemberReadsHoldsUnderTheDrainRequest(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		snap, err := r.Snapshot(ctx, topo)
		must(t, err)
		for _, u := range []string{"0.0", "0.1"} {
			_, err := r.Claim(ctx, a.MemberRef, snap.Active.Number, u)
			must(t, err)
		}
		tok, err := r.(OperatorRegistry).TakeOperatorToken(ctx, topo, "operator-0")
		must(t, err)
		op := asOperator(t, r, tok)

		m, err := op.DrainedMember(ctx, topo, "a")
		must(t, err)
		want := Member{Name: "a", Incarnation: a.Incarnation, Slot: a.Slot, Live: true, Draining: true, Holds: 2}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("drained member %+v, want %+v", m, want)
		}
		_, err = r.Claim(ctx, a.MemberRef, snap.Active.Number, "0.2")
		wantErr(t, "claim by the drained member", err, ErrDraining)

		// A name that never joined gets the placeholder that keeps its
		// first join from claiming.
		m, err = op.DrainedMember(ctx, topo, "b")
		must(t, err)
		want = Member{Name: "b", Slot: -1, Left: true, Draining: true}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("drained stranger %+v, want %+v", m, want)
		}
	})
}
