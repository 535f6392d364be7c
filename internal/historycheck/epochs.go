package historycheck

import (
	"fmt"
	"math"
	"slices"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// epochs answers P2's questions from the epochs' shapes and active
// intervals.
type epochs struct {
	byNumber map[int64][]EpochSpan
	firstIn  map[string]int64 // unit -> earliest activation of an epoch containing it; MaxInt64: none
	all      []EpochSpan
}

func indexEpochs(spans []EpochSpan) *epochs {
	e := &epochs{byNumber: map[int64][]EpochSpan{}, firstIn: map[string]int64{}, all: spans}
	for _, s := range spans {
		e.byNumber[s.Number] = append(e.byNumber[s.Number], s)
	}
	return e
}

func shape(s EpochSpan) ownership.Topology {
	return ownership.Topology{Partitions: s.Partitions, Shards: s.Shards}
}

// active reports whether x lies in the span's active interval.
func active(s EpochSpan, x int64) bool {
	return !s.ActivatedAt.IsZero() && s.ActivatedAt.UnixNano() <= x && (s.RetiredAt.IsZero() || x < s.RetiredAt.UnixNano())
}

// claimViolation says why a claim or adopt decision breaks P2, or "".
func (e *epochs) claimViolation(c *ClaimEvent) string {
	spans, ok := e.byNumber[c.Under]
	if !ok {
		return fmt.Sprintf("decided under epoch %d, which the registry does not know", c.Under)
	}
	x := c.At.UnixNano()
	if !slices.ContainsFunc(spans, func(s EpochSpan) bool { return active(s, x) }) {
		return fmt.Sprintf("decided under epoch %d outside its active interval %s", c.Under, intervals(spans))
	}
	u, err := ownership.ParseUnit(c.Unit)
	if err != nil {
		return err.Error()
	}
	if shape(spans[0]).Contains(u) {
		return ""
	}
	for _, s := range e.all {
		if s.Number < c.Under && shape(s).Contains(u) {
			return "" // a leaving unit, adopted to be drained
		}
	}
	return fmt.Sprintf("unit %s is in neither epoch %d's %s nor an earlier epoch", c.Unit, c.Under, shape(spans[0]))
}

// deliveryViolation says why delivering unit at x breaks P2, or "": the unit
// must belong to an epoch activated by then, the active one or one it is
// leaving.
func (e *epochs) deliveryViolation(unit string, x int64) string {
	first, ok := e.firstIn[unit]
	if !ok {
		first = e.firstActivation(unit)
		e.firstIn[unit] = first
	}
	switch {
	case first == math.MaxInt64:
		return fmt.Sprintf("unit %s is in no activated epoch", unit)
	case x < first:
		return fmt.Sprintf("unit %s is in no epoch active by then (the first one holding it activated at %s)", unit, fmtTime(first))
	}
	return ""
}

// firstActivation is the earliest activation of an epoch containing unit,
// or MaxInt64 (also for a name that is not a unit).
func (e *epochs) firstActivation(unit string) int64 {
	first := int64(math.MaxInt64)
	u, err := ownership.ParseUnit(unit)
	if err != nil {
		return first
	}
	for _, s := range e.all {
		if !s.ActivatedAt.IsZero() && shape(s).Contains(u) {
			first = min(first, s.ActivatedAt.UnixNano())
		}
	}
	return first
}

// together reports each epoch whose active interval begins inside an
// earlier-activated one's: the design keeps exactly one epoch active at a
// time.
func (e *epochs) together(report func(at int64, detail string)) {
	var spans []EpochSpan
	for _, s := range e.all {
		if !s.ActivatedAt.IsZero() {
			spans = append(spans, s)
		}
	}
	slices.SortStableFunc(spans, func(a, b EpochSpan) int { return a.ActivatedAt.Compare(b.ActivatedAt) })
	reach, reacher := int64(math.MinInt64), EpochSpan{}
	for _, s := range spans {
		at := s.ActivatedAt.UnixNano()
		if at < reach {
			report(at, fmt.Sprintf("epoch %d activated at %s while epoch %d was active %s", s.Number, fmtTime(at), reacher.Number, intervals([]EpochSpan{reacher})))
		}
		if end := retiredNanos(s); end > reach {
			reach, reacher = end, s
		}
	}
}

func retiredNanos(s EpochSpan) int64 {
	if s.RetiredAt.IsZero() {
		return math.MaxInt64
	}
	return s.RetiredAt.UnixNano()
}

// intervals formats active intervals as [from, to).
func intervals(spans []EpochSpan) string {
	out := ""
	for i, s := range spans {
		if i > 0 {
			out += ", "
		}
		switch {
		case s.ActivatedAt.IsZero():
			out += "(never active)"
		case s.RetiredAt.IsZero():
			out += fmt.Sprintf("[%s, now)", fmtTime(s.ActivatedAt.UnixNano()))
		default:
			out += fmt.Sprintf("[%s, %s)", fmtTime(s.ActivatedAt.UnixNano()), fmtTime(s.RetiredAt.UnixNano()))
		}
	}
	return out
}
