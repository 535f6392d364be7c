package poolctl

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// Issue 20's suspected "the operator reads Snapshot, Claims and Activity in
// three READ COMMITTED statements": Observe reads all three (and on
// PostgreSQL the replication settings) as of one instant. While members claim and release, every observation's counts
// and per-member holdings agree with its claim rows; on a quiet registry
// it equals the three separate reads.
func TestObserveReadsSnapshotClaimsAndActivityAsOfOneInstant(t *testing.T) {
	forBackends(t, func(t *testing.T, r testRegistry) {
		ctx := context.Background()
		topo := newTopology(t, r, testParams, 1, 8)
		var refs []MemberRef
		for i := 0; i < 3; i++ {
			l, err := r.Join(ctx, topo, fmt.Sprintf("m%d", i))
			must(t, err)
			refs = append(refs, l.MemberRef)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, ref := range refs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				units := []string{fmt.Sprintf("0.%d", 2*i), fmt.Sprintf("0.%d", 2*i+1)}
				for {
					select {
					case <-stop:
						return
					default:
					}
					outs, err := r.ClaimMany(ctx, ref, 1, units)
					if err != nil {
						t.Errorf("claims of %s: %v", ref.Member, err)
						return
					}
					var toks []Token
					var rep []UnitActivity
					for _, o := range outs {
						if o.Err == nil {
							toks = append(toks, o.Claim.Token)
							rep = append(rep, UnitActivity{Unit: o.Unit, Epoch: o.Claim.Epoch, SinceFetch: -1, SinceRows: -1})
						}
					}
					if err := r.ReportActivity(ctx, ref, rep); err != nil {
						t.Errorf("activity of %s: %v", ref.Member, err)
						return
					}
					if _, err := r.ReleaseMany(ctx, toks); err != nil {
						t.Errorf("release of %s: %v", ref.Member, err)
						return
					}
				}
			}()
		}
		deadline := time.Now().Add(2 * time.Second)
		n := 0
		for ; n < 20 || time.Now().Before(deadline); n++ {
			o, err := r.Observe(ctx, topo)
			must(t, err)
			if err := consistent(o); err != nil {
				close(stop)
				wg.Wait()
				t.Fatalf("observation %d: %v", n, err)
			}
		}
		close(stop)
		wg.Wait()
		o, err := r.Observe(ctx, topo)
		must(t, err)
		s, err := r.Snapshot(ctx, topo)
		must(t, err)
		claims, err := r.Claims(ctx, topo)
		must(t, err)
		activity, err := r.Activity(ctx, topo)
		must(t, err)
		want := Observation{Snapshot: s, Claims: claims, Activity: activity}
		if dr, ok := r.(interface {
			ReadDurability(context.Context) (Durability, error)
		}); ok {
			d, err := dr.ReadDurability(ctx)
			must(t, err)
			want.Durability = &d
		}
		o.Snapshot.Now, want.Snapshot.Now = time.Time{}, time.Time{}
		o.Snapshot.Reset.CensusAge, want.Snapshot.Reset.CensusAge = 0, 0
		if !reflect.DeepEqual(o, want) {
			t.Fatalf("quiet observation %+v differs from the separate reads %+v", o, want)
		}
		t.Logf("%d consistent observations under churn", n)
	})
}

// consistent checks an observation against itself.
func consistent(o Observation) error {
	var counts Counts
	holds := map[string]int{}
	for _, c := range o.Claims {
		switch c.State {
		case StateHeld:
			counts.Held++
		case StateHandover:
			counts.Handover++
		case StateFree:
			counts.Free++
		}
		if c.State != StateFree {
			holds[c.Owner]++
		}
	}
	if counts != o.Snapshot.Counts {
		return fmt.Errorf("snapshot counts %+v, claim rows count %+v", o.Snapshot.Counts, counts)
	}
	for _, m := range o.Snapshot.Members {
		if m.Holds != holds[m.Name] {
			return fmt.Errorf("member %s holds %d in the snapshot, %d in the claim rows", m.Name, m.Holds, holds[m.Name])
		}
	}
	return nil
}
