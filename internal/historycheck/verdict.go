package historycheck

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The checks, by the names Table and Row use. test/e2e prints them as rows.
const (
	CheckOverlaps          = "overlapping windows (P1)"
	CheckUnitsDoublePulled = "units double-pulled (P1)"
	CheckMaxDoublePulled   = "max double-pulled at once"
	CheckStaleDeliveries   = "deliveries outside claim (P1)"
	CheckStaleAcks         = "stale acks (P1)"
	CheckStaleWrites       = "stale writes (P1)"
	CheckP2                = "P2 violations"
	CheckP5                = "P5 violations (takeover)"
	CheckHistories         = "histories missing or cut"
	CheckLost              = "rows lost (P3)"
	CheckUnrecorded        = "unrecorded writes"
	CheckDupExplained      = "duplicates explained (takeover/reset/redelivery)"
	CheckDupUnexplained    = "duplicates unexplained"
	CheckPulledByTwo       = "units pulled by two processes (fetches)"
	CheckKeyInversions     = "per-key inversions across units"
	CheckKeyReorders       = "per-key reorders within a unit (redelivery)"
)

// CheckNames returns the checks in Table order.
func CheckNames() []string {
	return []string{
		CheckOverlaps, CheckUnitsDoublePulled, CheckMaxDoublePulled,
		CheckStaleDeliveries, CheckStaleAcks, CheckStaleWrites,
		CheckP2, CheckP5, CheckLost, CheckHistories, CheckUnrecorded,
		CheckDupExplained, CheckDupUnexplained, CheckPulledByTwo,
		CheckKeyInversions, CheckKeyReorders,
	}
}

// Status is a check's outcome.
type Status string

// The outcomes of a check.
const (
	OK   Status = "OK"
	Fail Status = "FAIL"
	NA   Status = "n/a"
	// Info marks a measurement that is not a check.
	Info Status = "info"
)

// Violation is one example of a failed check.
type Violation struct {
	Check  string    // one of the Check* names
	At     time.Time // when it happened; zero for a lost row, which has no instant
	Detail string    // the records involved: process, kind, unit, member, epoch, row, times
}

func (v Violation) String() string { return v.Check + ": " + v.Detail }

// Verdict is what Check decided. Counts are of violations unless named
// otherwise; the package doc defines each check.
type Verdict struct {
	// The evidence's size, so a reader can tell a clean verdict from an
	// empty one.
	Processes   int
	Expected    int // processes the harness started
	Truncated   int // history files that ended mid-record
	Deliveries  int
	Settles     int // ack, nak and term records
	LoneSettles int // settles that followed no delivery of their row
	Withheld    int // withheld rows that were never delivered
	KeyedRows   int // delivered rows with a key and sequence (Input.Keys)
	Keys        int // keys of KeyedRows
	Fetches     int
	ClaimEvents int
	Leases      int
	Epochs      int
	SinkWrites  int
	Published   int

	// ClaimChecksNA: no registry, so deliveries, acks and writes are not
	// judged against claims, nor P5. P2NA: no registry (without epochs P2
	// fails: no evidence, no verdict).
	ClaimChecksNA, P2NA bool

	OverlappingWindows int64 // pairs of windows
	UnitsDoublePulled  int
	MaxDoublePulled    int // units double-pulled at one instant, at most
	StaleDeliveries    int // deliveries outside claim
	StaleAcks          int
	StaleWrites        int
	P2Violations       int
	P5Violations       int
	Lost               int
	LostIDs            []string // the first few, sorted
	Unrecorded         int

	// HistoryProblems counts the failures of CheckHistories: missing
	// histories, cut ones, ones of no listed process, or no list at all.
	HistoryProblems   int
	MissingHistories  int
	CutHistories      int // truncated, of a process that was not killed
	UnlistedHistories int

	// UnitsPulledByTwo counts units whose fetch windows of two processes
	// overlap (information, not a check; see countPulls).
	UnitsPulledByTwo int

	Duplicates     int // every sink write after a row's first
	DupTakeover    int // explained by a takeover
	DupReset       int // explained by a RESET
	DupRedelivery  int // explained by NATS's delivery count
	DupUnexplained int

	// OrderingPerKey says the run declared ordering PerKey, so cross-unit
	// inversions fail it; otherwise they are reported as information.
	// KeyOrderNA: no keyed row was delivered (with PerKey that fails).
	OrderingPerKey, KeyOrderNA bool
	// KeyInversions counts rows first delivered before an earlier row of
	// their key, of another unit, was acknowledged; KeysInverted the keys
	// with at least one. KeyReorders counts rows first delivered before
	// an earlier row of their key and of their own unit was acknowledged
	// (NATS's redelivery), and never fails.
	KeyInversions, KeysInverted, KeyReorders int
	// KeyInversionExamples describes the first inversion of each of the
	// first few inverted keys (in key order), whatever the ordering:
	// under None they are not violations.
	KeyInversionExamples []string

	// Violations holds the earliest few examples of each failed check,
	// ordered by instant, lost rows (which have none) last.
	Violations []Violation
	// FirstViolation is the earliest of Violations, "" when there is none.
	FirstViolation string
}

// Clean reports whether every applicable check passed.
func (v Verdict) Clean() bool {
	for _, l := range v.Lines() {
		if l.Status == Fail {
			return false
		}
	}
	return true
}

// Line is one check's row of a verdict table.
type Line struct {
	Check  string
	Value  string
	Status Status
}

// Lines returns one Line per check, in CheckNames order.
func (v Verdict) Lines() []Line {
	explained := v.DupTakeover + v.DupReset + v.DupRedelivery
	return []Line{
		countLine(CheckOverlaps, v.OverlappingWindows, false),
		countLine(CheckUnitsDoublePulled, v.UnitsDoublePulled, false),
		countLine(CheckMaxDoublePulled, v.MaxDoublePulled, false),
		countLine(CheckStaleDeliveries, v.StaleDeliveries, v.ClaimChecksNA),
		countLine(CheckStaleAcks, v.StaleAcks, v.ClaimChecksNA),
		countLine(CheckStaleWrites, v.StaleWrites, v.ClaimChecksNA),
		countLine(CheckP2, v.P2Violations, v.P2NA),
		countLine(CheckP5, v.P5Violations, v.ClaimChecksNA),
		countLine(CheckLost, v.Lost, false),
		countLine(CheckHistories, v.HistoryProblems, false),
		countLine(CheckUnrecorded, v.Unrecorded, false),
		// Explained duplicates are at-least-once delivery working as
		// designed: counted, never a failure.
		{CheckDupExplained, fmt.Sprintf("%d (%d/%d/%d)", explained, v.DupTakeover, v.DupReset, v.DupRedelivery), OK},
		countLine(CheckDupUnexplained, v.DupUnexplained, false),
		{CheckPulledByTwo, fmt.Sprint(v.UnitsPulledByTwo), Info},
		v.keyInversionLine(),
		infoLine(CheckKeyReorders, v.KeyReorders, v.KeyOrderNA),
	}
}

// keyInversionLine is a check only for a run that declared ordering
// PerKey; otherwise it reports what a change did to keys' order.
func (v Verdict) keyInversionLine() Line {
	if v.OrderingPerKey {
		return countLine(CheckKeyInversions, v.KeyInversions, false)
	}
	return infoLine(CheckKeyInversions, v.KeyInversions, v.KeyOrderNA)
}

// infoLine is the line of a measurement that never fails.
func infoLine(check string, n int, na bool) Line {
	if na {
		return Line{check, string(NA), NA}
	}
	return Line{check, fmt.Sprint(n), Info}
}

// countLine is the line of a check that fails on any violation.
func countLine[T int | int64](check string, n T, na bool) Line {
	switch {
	case na:
		return Line{check, string(NA), NA}
	case n == 0:
		return Line{check, "0", OK}
	}
	return Line{check, fmt.Sprint(n), Fail}
}

// Row returns one check's value and status, {"3", "FAIL"}, so a caller can
// put several verdicts side by side; nil for an unknown check.
func (v Verdict) Row(check string) []string {
	for _, l := range v.Lines() {
		if l.Check == check {
			return []string{l.Value, string(l.Status)}
		}
	}
	return nil
}

// Table returns the verdict as a readable table, one row per check, with the
// evidence's size and the first violation under it.
func (v Verdict) Table() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "check\tvalue\tresult")
	for _, l := range v.Lines() {
		fmt.Fprintf(w, "%s\t%s\t%s\n", l.Check, l.Value, l.Status)
	}
	_ = w.Flush()
	fmt.Fprintf(&b, "evidence: %s\n", v.evidence())
	if v.FirstViolation != "" {
		fmt.Fprintf(&b, "first violation: %s\n", v.FirstViolation)
	}
	return b.String()
}

func (v Verdict) evidence() string {
	ordering := OrderingNone
	if v.OrderingPerKey {
		ordering = OrderingPerKey
	}
	return fmt.Sprintf("%d processes of %d expected (%d truncated), %d deliveries, %d settles (%d lone), %d withheld, %d fetches, %d claim events, %d lease events, %d epochs, %d sink writes, %d published, %d keyed rows of %d keys (%d inverted, ordering %s)",
		v.Processes, v.Expected, v.Truncated, v.Deliveries, v.Settles, v.LoneSettles, v.Withheld, v.Fetches, v.ClaimEvents, v.Leases, v.Epochs, v.SinkWrites, v.Published,
		v.KeyedRows, v.Keys, v.KeysInverted, ordering)
}

// SideBySide renders verdicts as columns under titles (e.g. "sequenced",
// "independent"), one row per check, each cell "value status".
func SideBySide(titles []string, verdicts ...Verdict) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	header := []string{"check"}
	for i := range verdicts {
		title := fmt.Sprintf("#%d", i+1)
		if i < len(titles) {
			title = titles[i]
		}
		header = append(header, title)
	}
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, check := range CheckNames() {
		row := []string{check}
		for _, v := range verdicts {
			row = append(row, cell(v.Row(check)))
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	_ = w.Flush()
	return b.String()
}

// cell joins a Row into one cell: "3 FAIL", or "n/a" alone.
func cell(row []string) string {
	if len(row) == 2 && row[1] == string(NA) {
		return row[0]
	}
	return strings.Join(row, " ")
}

// maxExamples is how many violations of one check a Verdict keeps.
const maxExamples = 5

// examples keeps the earliest few violations of each check.
type examples map[string][]violationAt

type violationAt struct {
	at     int64 // wall ns; noInstant for none
	detail string
}

// noInstant sorts violations without an instant after all others.
const noInstant = int64(1<<63 - 1)

func (e examples) add(check string, at int64, detail string) {
	list := e[check]
	if len(list) == maxExamples && at >= list[maxExamples-1].at {
		return
	}
	list = append(list, violationAt{at, detail})
	slices.SortStableFunc(list, func(a, b violationAt) int { return cmp.Compare(a.at, b.at) })
	e[check] = list[:min(len(list), maxExamples)]
}

// into fills the verdict's Violations and FirstViolation.
func (e examples) into(v *Verdict) {
	for _, check := range CheckNames() {
		for _, x := range e[check] {
			var at time.Time
			if x.at != noInstant {
				at = time.Unix(0, x.at).UTC()
			}
			v.Violations = append(v.Violations, Violation{Check: check, At: at, Detail: x.detail})
		}
	}
	slices.SortStableFunc(v.Violations, func(a, b Violation) int {
		return cmp.Compare(instant(a), instant(b))
	})
	if len(v.Violations) > 0 {
		v.FirstViolation = v.Violations[0].String()
	}
}

func instant(v Violation) int64 {
	if v.At.IsZero() {
		return noInstant
	}
	return v.At.UnixNano()
}

// fmtTime formats wall ns in UTC to the nanosecond.
func fmtTime(ns int64) string {
	return time.Unix(0, ns).UTC().Format("2006-01-02T15:04:05.000000000Z")
}
