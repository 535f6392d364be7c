package historycheck

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// bigHistory is a clean run of the size the e2e produces: 64 units handed
// between 16 members every 5 s for 100 s, 100,000 deliveries each acked
// (200,000 records), 100,000 sink writes, lease renewals every second;
// every row of one of 8 keys per unit, in order (ordering PerKey).
func bigHistory() Input {
	const (
		members, units = 16, 64
		tenure         = 5 * time.Second
		span           = 100 * time.Second
		perUnit        = 100_000 / units
	)
	rng := rand.New(rand.NewPCG(1, 2))
	in := Input{Epochs: []EpochSpan{{Number: 1, Partitions: 4, Shards: 16, ActivatedAt: t0}}, Published: map[string]string{}, Grace: time.Second,
		Keys: map[string]KeyedRow{}, Ordering: OrderingPerKey}
	procs := make([]history.Process, members)
	for m := range procs {
		procs[m] = history.Process{Name: fmt.Sprintf("w-%d-1-1", m), MonoToWall: t0.UnixNano() - int64(m+1)*int64(time.Hour)}
		procs[m].Records = append(procs[m].Records, history.Record{Kind: history.KindClock, Member: fmt.Sprint("w-", m), Start: 0, Wall: procs[m].MonoToWall})
		in.Expected = append(in.Expected, ExpectedProcess{Member: fmt.Sprint("w-", m), PID: 1})
		for s := time.Duration(0); s < span+tenure; s += time.Second {
			in.Leases = append(in.Leases, LeaseEvent{Member: fmt.Sprint("w-", m), Incarnation: 1, At: t0.Add(s), ExpiresAt: t0.Add(s + 3*time.Second)})
		}
	}
	gap := span / perUnit
	for u := range units {
		unit := fmt.Sprintf("%d.%d", u/16, u%16)
		n := 0
		for k := int64(0); k < int64(span/tenure); k++ {
			m := rng.IntN(members)
			member, from := fmt.Sprint("w-", m), t0.Add(time.Duration(k)*tenure)
			in.Claims = append(in.Claims, ClaimEvent{Unit: unit, Owner: member, Incarnation: 1, Epoch: k + 1, State: StateHeld, Under: 1, Op: OpClaim, At: from.Add(time.Millisecond)})
			in.Claims = append(in.Claims, ClaimEvent{Unit: unit, Epoch: k + 1, State: StateFree, Op: "release", At: from.Add(tenure - time.Millisecond)})
			p := &procs[m]
			for at := from.Add(10 * time.Millisecond); at.Before(from.Add(tenure - 20*time.Millisecond)); at = at.Add(gap) {
				row := fmt.Sprintf("%s-%d", unit, at.UnixNano())
				mono := at.UnixNano() - p.MonoToWall
				p.Records = append(p.Records,
					history.Record{Kind: history.KindDeliver, Unit: unit, Member: member, Incarnation: 1, Epoch: k + 1, RowID: row, NumDelivered: 1, Start: mono},
					history.Record{Kind: history.KindAck, Unit: unit, Member: member, Incarnation: 1, Epoch: k + 1, RowID: row, Start: mono + 2e6, End: mono + 3e6})
				in.Sink = append(in.Sink, SinkWrite{RowID: row, Unit: unit, Member: member, Epoch: k + 1, At: at.Add(time.Millisecond)})
				in.Published[row] = unit
				in.Keys[row] = KeyedRow{Key: fmt.Sprintf("%s-k%d", unit, n%8), Seq: int64(n/8 + 1)}
				n++
			}
		}
	}
	in.Processes = procs
	return in
}

func BenchmarkCheck(b *testing.B) {
	in := bigHistory()
	records := 0
	for _, p := range in.Processes {
		records += len(p.Records)
	}
	for b.Loop() {
		if v := Check(in); !v.Clean() {
			b.Fatalf("not clean:\n%s", v.Table())
		}
	}
	b.ReportMetric(float64(records), "records")
	b.ReportMetric(float64(len(in.Sink)), "writes")
}
