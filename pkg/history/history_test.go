package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func sampleRecords() []Record {
	return []Record{
		{Kind: KindFetch, Unit: "3.11", Member: "w-0", Incarnation: 7, Epoch: 4, TopologyEpoch: 2, Rows: 10, Start: 100, End: 250},
		{Kind: KindDeliver, Unit: "3.11", Member: "w-0", Incarnation: 7, Epoch: 4, TopologyEpoch: 2, RowID: "row-1", StreamSeq: 1 << 40, NumDelivered: 2, Start: 260},
		{Kind: KindAck, Unit: "3.11", Member: "w-0", Epoch: 4, RowID: "row-1", Start: 300, End: 320, Detail: "nats: <timeout> & \"retry\"\n\t\u2028"},
		{Kind: KindWithheld, Unit: "0.0", Member: "w-0", RowID: "row-\x00\x7f\xff", Detail: "fenced", Start: -5},
		{Kind: KindReset, Unit: "1.2", Member: "w-0", Start: 400, End: 401},
	}
}

func TestFileRecorderRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "history")
	rec, err := NewFileRecorder(dir, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	want := sampleRecords()
	for _, r := range want {
		rec.Record(r)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 {
		t.Fatalf("got %d processes, want 1", len(procs))
	}
	p := procs[0]
	if p.Name+".jsonl" != filepath.Base(rec.Path()) {
		t.Errorf("Name %q does not match file %q", p.Name, rec.Path())
	}
	if p.Truncated {
		t.Error("Truncated on a cleanly closed file")
	}
	if got := p.Records[0]; got.Kind != KindClock || got.Member != "w-0" || got.Wall == 0 || got.Start == 0 {
		t.Errorf("first record %+v, want a clock record of w-0", got)
	}
	got := p.Records[1:]
	// Invalid UTF-8 comes back as U+FFFD, as encoding/json would write it.
	want[3].RowID = "row-\x00\x7f\ufffd"
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

func TestFileNameIsMemberPidMono(t *testing.T) {
	dir := t.TempDir()
	before := Now()
	rec, err := NewFileRecorder(dir, "pod/evil")
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if filepath.Dir(rec.Path()) != dir {
		t.Fatalf("file %s escaped %s", rec.Path(), dir)
	}
	parts := strings.Split(strings.TrimSuffix(filepath.Base(rec.Path()), ".jsonl"), "-")
	if len(parts) != 3 || parts[0] != "pod_evil" || parts[1] != strconv.Itoa(os.Getpid()) {
		t.Fatalf("file name %s, want pod_evil-<pid>-<mono>.jsonl", filepath.Base(rec.Path()))
	}
	if mono, err := strconv.ParseInt(parts[2], 10, 64); err != nil || mono < before || mono > Now() {
		t.Errorf("mono part %q is not a Now reading taken at creation", parts[2])
	}
}

func TestNewFileRecorderRefusesEmptyMember(t *testing.T) {
	if _, err := NewFileRecorder(t.TempDir(), ""); err == nil {
		t.Fatal("want an error for an empty member name")
	}
}

func TestClockRecordGivesMonoToWall(t *testing.T) {
	dir := t.TempDir()
	rec, err := NewFileRecorder(dir, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	mono := Now()
	after := time.Now()
	rec.Record(Record{Kind: KindDeliver, Start: mono})
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := procs[0]
	if p.MonoToWall != p.Records[0].Wall-p.Records[0].Start {
		t.Fatalf("MonoToWall %d, want Wall-Start of the clock record", p.MonoToWall)
	}
	// The pairing error is nanoseconds; a millisecond leaves room for a
	// preempted test without letting a wrong sign or unit through.
	const slack = time.Millisecond
	if got := p.WallTime(p.Records[1].Start); got.Before(before.Add(-slack)) || got.After(after.Add(slack)) {
		t.Errorf("WallTime = %s, want within [%s, %s]", got, before, after)
	}
}

func TestReadDirToleratesTruncatedLastLine(t *testing.T) {
	dir := t.TempDir()
	rec, err := NewFileRecorder(dir, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	rec.Record(Record{Kind: KindDeliver, Unit: "0.1", RowID: "a", Start: 1})
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	appendTo(t, rec.Path(), `{"k":"ack","u":"0.1","r":"a","s":2,"t`)
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(procs[0].Records); got != 2 {
		t.Errorf("got %d records, want the clock and the deliver record", got)
	}
	if !procs[0].Truncated {
		t.Error("Truncated is false after a partial last line")
	}
}

func TestReadDirKeepsCompleteLastLineWithoutNewline(t *testing.T) {
	dir := t.TempDir()
	rec, err := NewFileRecorder(dir, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	appendTo(t, rec.Path(), `{"k":"ack","s":2}`)
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(procs[0].Records); got != 2 || procs[0].Truncated {
		t.Errorf("got %d records (truncated %v), want 2 and not truncated", got, procs[0].Truncated)
	}
}

func TestReadDirErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		contents string
		want     string
	}{
		{"bad middle line names file and line", `{"k":"clock","s":1,"w":2}` + "\n" + `{"k":"ack","s":` + "\n" + `{"k":"ack","s":3}` + "\n", "x.jsonl line 2"},
		{"blank middle line", `{"k":"clock","s":1,"w":2}` + "\n\n" + `{"k":"ack","s":3}` + "\n", "x.jsonl line 2"},
		{"first record must be the clock", `{"k":"ack","s":3}` + "\n", "x.jsonl line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "x.jsonl"), []byte(tc.contents), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadDir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestReadDirSkipsOtherFilesAndEmptyHistories(t *testing.T) {
	dir := t.TempDir()
	for name, contents := range map[string]string{
		"notes.txt":       "not a history",
		"empty.jsonl":     "",
		"cut.jsonl":       `{"k":"clo`,
		"ok.jsonl":        `{"k":"clock","s":1,"w":11}` + "\n",
		"sub.jsonl/x.txt": "",
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(contents), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].Name != "ok" || procs[0].MonoToWall != 10 {
		t.Fatalf("got %+v, want only process ok with MonoToWall 10", procs)
	}
}

const childEnv = "SHARDKEEPER_HISTORY_TEST_CHILD_DIR"

// TestRecordSurvivesSIGKILL re-executes the test binary as a child that
// records one delivery and SIGKILLs itself the moment Record returns. The
// record must be on disk: Record's single write(2) put it in the page cache,
// which the kernel keeps whatever happens to the process.
func TestRecordSurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv(childEnv); dir != "" {
		recordThenDie(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecordSurvivesSIGKILL$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child did not die: err %v, output:\n%s", err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL; output:\n%s", err, out)
	}
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || len(procs[0].Records) != 2 {
		t.Fatalf("got %+v, want one process with its clock and deliver records", procs)
	}
	if got := procs[0].Records[1]; got.Kind != KindDeliver || got.RowID != "last-words" {
		t.Errorf("last record %+v, want the delivery of last-words", got)
	}
}

func recordThenDie(dir string) {
	rec, err := NewFileRecorder(dir, "doomed")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rec.Record(Record{Kind: KindDeliver, Unit: "0.0", RowID: "last-words", Start: Now()})
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; never reach a clean exit
}

func TestConcurrentRecordsKeepLinesWhole(t *testing.T) {
	dir := t.TempDir()
	rec, err := NewFileRecorder(dir, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				rec.Record(Record{Kind: KindDeliver, Unit: "0.0", RowID: strings.Repeat("x", 100) + strconv.Itoa(g*each+i), Start: Now()})
			}
		})
	}
	wg.Wait()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	rec.Record(Record{Kind: KindAck}) // after Close: dropped, no panic
	procs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range procs[0].Records[1:] {
		seen[r.RowID] = true
	}
	if len(seen) != goroutines*each || len(procs[0].Records) != goroutines*each+1 {
		t.Errorf("got %d records with %d distinct rows, want %d", len(procs[0].Records)-1, len(seen), goroutines*each)
	}
}

func TestMemoryProcessLeadsWithClock(t *testing.T) {
	var m Memory
	want := sampleRecords()
	for _, r := range want {
		m.Record(r)
	}
	p := m.Process("mem")
	if p.Records[0].Kind != KindClock || p.MonoToWall != p.Records[0].Wall-p.Records[0].Start || len(p.Records) != len(want)+1 {
		t.Fatalf("got %+v", p)
	}
}

// TestAppendRecordMatchesEncodingJSON holds the hand-written encoder to
// encoding/json byte for byte, on tricky strings and on random records.
func TestAppendRecordMatchesEncodingJSON(t *testing.T) {
	for i, r := range append(sampleRecords(), Record{}) {
		assertSameJSON(t, fmt.Sprint("sample ", i), r)
	}
	rapid.Check(t, func(t *rapid.T) {
		s := func(label string) string {
			if rapid.Bool().Draw(t, label+"Bytes") {
				return string(rapid.SliceOf(rapid.Byte()).Draw(t, label))
			}
			return rapid.String().Draw(t, label)
		}
		r := Record{
			Kind:          Kind(s("kind")),
			Unit:          s("unit"),
			Member:        s("member"),
			Incarnation:   rapid.Int64().Draw(t, "inc"),
			Epoch:         rapid.Int64().Draw(t, "epoch"),
			TopologyEpoch: rapid.Int64().Draw(t, "te"),
			RowID:         s("row"),
			StreamSeq:     rapid.Uint64().Draw(t, "seq"),
			NumDelivered:  rapid.Uint64().Draw(t, "nd"),
			Rows:          rapid.Int().Draw(t, "rows"),
			Detail:        s("detail"),
			Start:         rapid.Int64().Draw(t, "start"),
			Fetch:         rapid.Int64().Draw(t, "fetch"),
			End:           rapid.Int64().Draw(t, "end"),
			Wall:          rapid.Int64().Draw(t, "wall"),
		}
		assertSameJSON(t, "random", r)
	})
}

func assertSameJSON(t interface {
	Helper()
	Fatalf(string, ...any)
}, label string, r Record) {
	t.Helper()
	want, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	if got := appendRecord(nil, r); string(got) != string(want) {
		t.Fatalf("%s:\n got %s\nwant %s", label, got, want)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkFileRecorderRecord(b *testing.B) {
	rec, err := NewFileRecorder(b.TempDir(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	r := Record{Kind: KindDeliver, Unit: "3.11", Member: "worker-12", Incarnation: 42, Epoch: 1234, TopologyEpoch: 7, RowID: "row-0123456789", StreamSeq: 987654321, NumDelivered: 1}
	b.ReportAllocs()
	for b.Loop() {
		r.Start = Now()
		rec.Record(r)
	}
}

func BenchmarkFileRecorderRecordParallel(b *testing.B) {
	rec, err := NewFileRecorder(b.TempDir(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := Record{Kind: KindAck, Unit: "3.11", Member: "worker-12", Incarnation: 42, Epoch: 1234, RowID: "row-0123456789", StreamSeq: 987654321, NumDelivered: 1}
		for pb.Next() {
			r.Start = Now()
			r.End = r.Start + 1000
			rec.Record(r)
		}
	})
}

func BenchmarkNow(b *testing.B) {
	for b.Loop() {
		_ = Now()
	}
}

// TestNowIsClockMonotonic holds Now to the system-wide clock other processes
// read: it must fall between two direct CLOCK_MONOTONIC reads, give or take
// the anchor's stated error.
func TestNowIsClockMonotonic(t *testing.T) {
	if monoAnchor.err <= 0 || monoAnchor.err > int64(time.Millisecond) {
		t.Fatalf("anchor error %d ns, want a small positive bound", monoAnchor.err)
	}
	for range 100 {
		before := rawMono()
		now := Now()
		after := rawMono()
		if now < before-monoAnchor.err || now > after+monoAnchor.err {
			t.Fatalf("Now %d outside [%d, %d] +- %d", now, before, after, monoAnchor.err)
		}
	}
}

func BenchmarkRawClockGettime(b *testing.B) {
	for b.Loop() {
		_ = rawMono()
	}
}
