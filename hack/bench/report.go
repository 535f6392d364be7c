package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// verdict says whether a row met its goal.
type verdict string

const (
	met    verdict = "met"
	missed verdict = "MISSED"
	noGoal verdict = "-"
)

// result is one line of the table, with what explains it.
type result struct {
	row      string
	what     string
	measured string
	baseline string
	ratio    string
	goal     string
	verdict  verdict
	// notes say what exactly was measured (rounds, subsets, setup).
	notes []string
	// why explains a missed goal or a failed measurement.
	why []string
	// profile is the top of the CPU profile taken during the row, printed
	// when the goal was missed.
	profile []string
}

// judge is met when ok, else missed.
func judge(ok bool) verdict {
	if ok {
		return met
	}
	return missed
}

// printTable prints every result as a Markdown table, so the README can
// quote a run as it is.
func printTable(w io.Writer, rs []result) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | what | measured | baseline (same run) | ratio | goal | verdict |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.row, r.what, cell(r.measured), cell(r.baseline),
			cell(r.ratio), cell(r.goal), cell(string(r.verdict)))
	}
}

func cell(s string) string {
	if s == "" {
		return "-"
	}
	return strings.ReplaceAll(s, "|", "/")
}

// printDetails prints each row's notes, and for a missed goal its reasons
// and profile.
func printDetails(w io.Writer, rs []result) {
	for _, r := range rs {
		if len(r.notes) == 0 && len(r.why) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s. %s (%s)\n", r.row, r.what, r.verdict)
		for _, n := range r.notes {
			fmt.Fprintf(w, "   %s\n", n)
		}
		if r.verdict == met {
			continue
		}
		for _, y := range r.why {
			fmt.Fprintf(w, "   why: %s\n", y)
		}
		if len(r.profile) > 0 {
			fmt.Fprintln(w, "   profile (go tool pprof -top; the why above says which):")
			for _, l := range r.profile {
				fmt.Fprintf(w, "     %s\n", l)
			}
		}
	}
}

// median of ds (the upper one of an even count); zero for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// medianFloat is median for float64.
func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// ms renders a duration for the table.
func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

// durations renders a list of durations.
func durations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = ms(d)
	}
	return strings.Join(parts, " ")
}
