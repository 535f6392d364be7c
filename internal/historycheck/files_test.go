package historycheck

import (
	"os"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// TestCheckReadsRecorderFiles runs the whole chain: two FileRecorders (two
// "processes" on the shared clock), ReadDir, Check. a settles r1 before b
// delivers r2, with a write(2) between, far more than the clocks' pairing
// error; a lone ack and a truncated file are counted.
func TestCheckReadsRecorderFiles(t *testing.T) {
	dir := t.TempDir()
	a, err := history.NewFileRecorder(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := history.NewFileRecorder(dir, "b")
	if err != nil {
		t.Fatal(err)
	}
	a.Record(history.Record{Kind: history.KindDeliver, Unit: "0.0", RowID: "r1", NumDelivered: 1, Start: history.Now()})
	wroteR1 := time.Now()
	start := history.Now()
	a.Record(history.Record{Kind: history.KindAck, Unit: "0.0", RowID: "r1", Start: start, End: history.Now()})
	b.Record(history.Record{Kind: history.KindDeliver, Unit: "0.0", RowID: "r2", NumDelivered: 1, Start: history.Now()})
	wroteR2 := time.Now()
	start = history.Now()
	b.Record(history.Record{Kind: history.KindAck, Unit: "0.0", RowID: "r2", Start: start, End: history.Now()})
	b.Record(history.Record{Kind: history.KindAck, Unit: "0.0", RowID: "r0", Start: history.Now()})
	for _, r := range []*history.FileRecorder{a, b} {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	appendTo(t, b.Path(), `{"k":"deliver","u":"0.0","r":"r3","s":`)

	procs, err := history.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := Check(Input{
		NoRegistry: true,
		Processes:  procs,
		Sink:       []SinkWrite{{RowID: "r1", Unit: "0.0", Member: "a", At: wroteR1}, {RowID: "r2", Unit: "0.0", Member: "b", At: wroteR2}},
		Published:  published("0.0", "r1", "r2"),
		// b's file ends in a partial record: allowed, as b was killed.
		Expected: []ExpectedProcess{{Member: "a", PID: os.Getpid()}, {Member: "b", PID: os.Getpid(), Abrupt: true}},
	})
	if !v.Clean() || v.Processes != 2 || v.Deliveries != 2 || v.Settles != 3 || v.LoneSettles != 1 || v.Truncated != 1 {
		t.Fatalf("got\n%s", v.Table())
	}
}
