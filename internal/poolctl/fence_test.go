package poolctl

import (
	"context"
	"testing"
)

// Defect 2: a Fence sent asynchronously can arrive after the Unfence of the
// same local fence; it must not leave the member fenced forever.
func TestLateFenceOfALiftedGenerationChangesNothing(t *testing.T) { // checks P5
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 4)
		a, err := r.Join(ctx, topo, "a")
		must(t, err)
		steps := []struct {
			name       string
			call       func() error
			wantFenced bool
		}{
			{"fence 1", func() error { return r.Fence(ctx, a.MemberRef, 1) }, true},
			{"unfence 1", func() error { return r.Unfence(ctx, a.MemberRef, 1) }, false},
			{"late fence 1", func() error { return r.Fence(ctx, a.MemberRef, 1) }, false},
			{"late unfence 0", func() error { return r.Unfence(ctx, a.MemberRef, 0) }, false},
			{"fence 2", func() error { return r.Fence(ctx, a.MemberRef, 2) }, true},
			{"older unfence 1", func() error { return r.Unfence(ctx, a.MemberRef, 1) }, true},
			{"unfence 3 lifts 2", func() error { return r.Unfence(ctx, a.MemberRef, 3) }, false},
		}
		for i, s := range steps {
			must(t, s.call())
			snap, err := r.Snapshot(ctx, topo)
			must(t, err)
			if got := snap.Member("a").Fenced; got != s.wantFenced {
				t.Fatalf("after %s: fenced=%v, want %v", s.name, got, s.wantFenced)
			}
			_, err = r.Claim(ctx, a.MemberRef, 1, "0."+string(rune('0'+i%4)))
			if s.wantFenced {
				wantErr(t, "claim while fenced, after "+s.name, err, ErrFenced)
			} else {
				wantErr(t, "claim after "+s.name, err, nil)
			}
		}
		// A new incarnation starts again at generation 0.
		a2, err := r.Join(ctx, topo, "a")
		must(t, err)
		must(t, r.Fence(ctx, a2.MemberRef, 1))
		snap, err := r.Snapshot(ctx, topo)
		must(t, err)
		if !snap.Member("a").Fenced {
			t.Fatal("fence 1 of a new incarnation did not apply")
		}
	})
}
