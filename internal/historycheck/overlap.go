package historycheck

import (
	"cmp"
	"slices"
	"sort"
)

// window is the span of one delivery (or lone settle) on the wall clock.
type window struct {
	start, end int64
	proc       int
	act        *action
}

// overlaps is the P1 overlap result for all units.
type overlaps struct {
	pairs       int64
	units       int
	maxAtOnce   int
	firstByUnit []overlapPair // one example per double-pulled unit
}

// overlapPair is two overlapping windows of different processes; b starts
// no earlier than a.
type overlapPair struct{ a, b window }

// findOverlaps runs the P1 overlap check over windows grouped by unit.
func findOverlaps(byUnit map[string][]window) overlaps {
	var out overlaps
	var regions []span
	for _, ws := range byUnit {
		slices.SortFunc(ws, compareWindows)
		pairs := crossPairs(ws)
		if pairs == 0 {
			continue
		}
		ex, rs := sweepUnit(ws)
		out.pairs += pairs
		out.units++
		out.firstByUnit = append(out.firstByUnit, ex)
		regions = append(regions, rs...)
	}
	out.maxAtOnce = maxAtOnce(regions)
	return out
}

// compareWindows orders by start, then end: the order sweepUnit relies on.
func compareWindows(a, b window) int {
	if c := cmp.Compare(a.start, b.start); c != 0 {
		return c
	}
	return cmp.Compare(a.end, b.end)
}

// crossPairs counts overlapping pairs of windows of different processes:
// all overlapping pairs minus those within one process.
func crossPairs(ws []window) int64 {
	total := countPairs(ws)
	byProc := slices.Clone(ws)
	slices.SortFunc(byProc, func(a, b window) int { return cmp.Compare(a.proc, b.proc) })
	for i := 0; i < len(byProc); {
		j := i
		for j < len(byProc) && byProc[j].proc == byProc[i].proc {
			j++
		}
		total -= countPairs(byProc[i:j])
		i = j
	}
	return total
}

// countPairs counts pairs {v, w} with s_v < e_w and s_w < e_v without
// enumerating them. For each w it counts the v with s_v < e_w, minus those
// with e_v <= s_w (which, as s_v <= e_v, never overlap w), adding back the
// zero-length v at s_w when w itself has zero length (they were in the
// second set but never in the first), and not counting w itself.
func countPairs(ws []window) int64 {
	starts := make([]int64, len(ws))
	ends := make([]int64, len(ws))
	var points []int64
	for i, w := range ws {
		starts[i], ends[i] = w.start, w.end
		if w.start == w.end {
			points = append(points, w.start)
		}
	}
	slices.Sort(starts)
	slices.Sort(ends)
	slices.Sort(points)
	var sum int64
	for _, w := range ws {
		c := countBelow(starts, w.end) - countAtOrBelow(ends, w.start)
		if w.start == w.end {
			c += countAtOrBelow(points, w.start) - countBelow(points, w.start)
		} else {
			c-- // w itself
		}
		sum += int64(c)
	}
	return sum / 2
}

func countBelow(sorted []int64, x int64) int {
	return sort.Search(len(sorted), func(i int) bool { return sorted[i] >= x })
}

func countAtOrBelow(sorted []int64, x int64) int {
	return sort.Search(len(sorted), func(i int) bool { return sorted[i] > x })
}

// span is a closed interval of wall ns.
type span struct{ lo, hi int64 }

// sweepUnit walks one unit's windows in compareWindows order, keeping the
// two processes whose windows so far reach furthest. An earlier window v
// overlaps w iff e_v > s_w (the order makes s_v < e_w follow), so the
// furthest-reaching window of another process overlaps w whenever any does,
// and their intersection contains every other one's. It returns the first
// overlapping pair and the unit's double-pulled instants, merged.
func sweepUnit(ws []window) (overlapPair, []span) {
	var first overlapPair
	found := false
	var regions []span
	best, second := -1, -1 // indices into ws: furthest end, furthest end of another process
	for i, w := range ws {
		v := best
		if v >= 0 && ws[v].proc == w.proc {
			v = second
		}
		if v >= 0 && ws[v].end > w.start {
			if !found {
				first, found = overlapPair{ws[v], w}, true
			}
			regions = append(regions, span{w.start, min(ws[v].end, w.end)})
		}
		best, second = furthest(ws, best, second, i)
	}
	return first, mergeSpans(regions)
}

// furthest updates the two furthest-reaching windows of distinct processes
// with window i.
func furthest(ws []window, best, second, i int) (int, int) {
	w := ws[i]
	switch {
	case best < 0:
		return i, second
	case ws[best].proc == w.proc:
		if w.end > ws[best].end {
			best = i
		}
		return best, second
	case w.end > ws[best].end:
		return i, best
	case second < 0 || w.end > ws[second].end:
		return best, i
	}
	return best, second
}

// mergeSpans merges spans sorted by lo into disjoint ones, so a unit counts
// once at any instant.
func mergeSpans(in []span) []span {
	var out []span
	for _, s := range in {
		if n := len(out); n > 0 && s.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// maxAtOnce is the largest number of spans that contain one instant.
func maxAtOnce(spans []span) int {
	type edge struct {
		at    int64
		delta int
	}
	edges := make([]edge, 0, 2*len(spans))
	for _, s := range spans {
		edges = append(edges, edge{s.lo, +1}, edge{s.hi, -1})
	}
	// Closed spans: at one instant, openings count before closings.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(b.delta, a.delta)
	})
	best, cur := 0, 0
	for _, e := range edges {
		cur += e.delta
		best = max(best, cur)
	}
	return best
}
