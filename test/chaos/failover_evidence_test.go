package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// epochsOnly is a HistoryReader with epochs alone.
type epochsOnly []poolctl.EpochSpan

func (e epochsOnly) ClaimHistory(context.Context, string) ([]poolctl.ClaimEvent, error) {
	return nil, nil
}
func (e epochsOnly) LeaseHistory(context.Context, string) ([]poolctl.LeaseEvent, error) {
	return nil, nil
}
func (e epochsOnly) EpochHistory(context.Context, string) ([]poolctl.EpochSpan, error) { return e, nil }
func (e epochsOnly) PruneHistory(context.Context, string, time.Time) error             { return nil }

// TestTheFailoverEvidenceJoinsTheLostPrimaryToThePromotedStandby checks
// the epochs of scenario 14's evidence: the lost primary's end at its
// death, the standby's active ones start again at the promotion, and what
// the standby had retired before is not counted twice.
func TestTheFailoverEvidenceJoinsTheLostPrimaryToThePromotedStandby(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	killed, promoted := at(50), at(55)
	// Epoch 1 retired at 10 (both have it); 2 active on the standby; the
	// primary retired 2 at 40 and activated 3 (lost); the standby, after
	// recovery, activated 1003 at 70 and retired 2 then.
	old := epochsOnly{
		{Number: 1, ActivatedAt: at(0), RetiredAt: at(10)},
		{Number: 2, ActivatedAt: at(10), RetiredAt: at(40)},
		{Number: 3, ActivatedAt: at(40)},
	}
	cur := epochsOnly{
		{Number: 1, ActivatedAt: at(0), RetiredAt: at(10)},
		{Number: 2, ActivatedAt: at(10), RetiredAt: at(70)},
		{Number: 1003, ActivatedAt: at(70)},
	}
	got, err := failoverHistory{old: old, cur: cur, killed: killed, promoted: promoted}.EpochHistory(context.Background(), "t")
	if err != nil {
		t.Fatal(err)
	}
	want := []poolctl.EpochSpan{
		{Number: 1, ActivatedAt: at(0), RetiredAt: at(10)},
		{Number: 2, ActivatedAt: at(10), RetiredAt: at(40)},
		{Number: 3, ActivatedAt: at(40), RetiredAt: killed},
		{Number: 2, ActivatedAt: promoted, RetiredAt: at(70)},
		{Number: 1003, ActivatedAt: at(70)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d spans %+v, want %+v", len(got), got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Number != w.Number || !g.ActivatedAt.Equal(w.ActivatedAt) || !g.RetiredAt.Equal(w.RetiredAt) {
			t.Errorf("span %d: got %d [%v, %v), want %d [%v, %v)", i, g.Number, g.ActivatedAt, g.RetiredAt, w.Number, w.ActivatedAt, w.RetiredAt)
		}
	}
}

// TestRowsOnlyTheLostPrimaryHadAreCountedApart checks the sink merge: a
// row written only to the lost primary is gone with it, one written again
// after the failover is rewritten, and the merge keeps every write once.
func TestRowsOnlyTheLostPrimaryHadAreCountedApart(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	w := func(id string, s int) fleettest.SinkWrite {
		return fleettest.SinkWrite{ID: id, Unit: "0.0", Member: "ingest-0", Epoch: 1, WrittenAt: at(s)}
	}
	old := []fleettest.SinkWrite{w("a", 1), w("b", 2), w("c", 3)}
	cur := []fleettest.SinkWrite{w("a", 1), w("c", 60)}
	published := map[string]ownership.Unit{"a": {}, "b": {}, "c": {}}
	merged, gone, rewritten := mergeSinks(old, cur, published)
	if gone != 1 || rewritten != 1 || len(merged) != 4 {
		t.Fatalf("gone %d rewritten %d merged %d writes; want 1 (b), 1 (c), 4", gone, rewritten, len(merged))
	}
}
