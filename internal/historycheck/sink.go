package historycheck

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// deliveryKey is what ties a sink write to the delivery that made it.
type deliveryKey struct {
	row, member string
	epoch       int64
}

// checkSink is completeness (every write has its delivery on record) and
// duplicates (every repeated write is explained).
func (c *checker) checkSink(v *Verdict) {
	byKey := c.deliveriesByKey()
	var byRow map[string][]int // row id -> indices into Sink, for rows written twice or more
	first := make(map[string]int, len(c.in.Sink))
	for i := range c.in.Sink {
		w := &c.in.Sink[i]
		if c.deliveryOf(byKey, w) == nil {
			v.Unrecorded++
			c.ex.add(CheckUnrecorded, w.At.UnixNano(), describeWrite(w)+": no delivery of the row by that member at that epoch is on record at or before it")
		}
		if j, ok := first[w.RowID]; !ok {
			first[w.RowID] = i
		} else {
			if byRow == nil {
				byRow = map[string][]int{}
			}
			if len(byRow[w.RowID]) == 0 {
				byRow[w.RowID] = []int{j}
			}
			byRow[w.RowID] = append(byRow[w.RowID], i)
		}
	}
	for _, writes := range byRow {
		slices.SortStableFunc(writes, func(a, b int) int { return c.in.Sink[a].At.Compare(c.in.Sink[b].At) })
		for k := 1; k < len(writes); k++ {
			c.judgeDuplicate(v, byKey, &c.in.Sink[writes[k-1]], &c.in.Sink[writes[k]])
		}
	}
}

// deliveriesByKey indexes deliveries by (row, member, epoch), each list
// sorted by start. Without a registry epochs are not evidence and are left
// out of the key.
func (c *checker) deliveriesByKey() map[deliveryKey][]*delivery {
	out := make(map[deliveryKey][]*delivery, len(c.ev.deliveries))
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i]
		k := c.key(d.rec.RowID, d.member, d.rec.Epoch)
		out[k] = append(out[k], d)
	}
	for _, list := range out {
		slices.SortStableFunc(list, func(a, b *delivery) int { return cmp.Compare(a.start, b.start) })
	}
	return out
}

func (c *checker) key(row, member string, epoch int64) deliveryKey {
	if c.in.NoRegistry {
		epoch = 0
	}
	return deliveryKey{row, member, epoch}
}

// deliveryOf is the delivery that made write w: of the deliveries of its
// row by its member at its epoch, the latest that started at or before the
// write; nil when none is on record (a write before any delivery of its
// row escaped the history as surely as one with no delivery at all).
func (c *checker) deliveryOf(byKey map[deliveryKey][]*delivery, w *SinkWrite) *delivery {
	list := byKey[c.key(w.RowID, w.Member, w.Epoch)]
	at := w.At.UnixNano()
	i := sort.Search(len(list), func(i int) bool { return list[i].start > at }) - 1
	if i < 0 {
		return nil
	}
	return list[i]
}

// judgeDuplicate classifies write later, a repeat of write earlier.
func (c *checker) judgeDuplicate(v *Verdict, byKey map[deliveryKey][]*delivery, earlier, later *SinkWrite) {
	v.Duplicates++
	dE, dL := c.deliveryOf(byKey, earlier), c.deliveryOf(byKey, later)
	switch {
	case dE != nil && !dE.acked && c.tookOver(dE, dL):
		v.DupTakeover++
	case c.resetBetween(later.Unit, instantOf(dE, earlier), instantOf(dL, later)):
		v.DupReset++
	case dL != nil && dL.rec.NumDelivered > 1:
		v.DupRedelivery++
	default:
		v.DupUnexplained++
		c.ex.add(CheckDupUnexplained, later.At.UnixNano(), fmt.Sprintf("%s repeats %s (%s): no takeover (the earlier delivery acked, or no change of owner or incarnation came between), no reset of the unit came between, and NATS counted the later one as delivery %s",
			describeWrite(later), describeWrite(earlier), c.describeDelivery(dE), c.deliveryCount(dL)))
	}
}

// tookOver says whether the unit changed hands between delivery dE and
// the later delivery dL of its row: they are of different members or
// incarnations (or processes), or the claim history shows another owner or
// incarnation holding the unit in between. A process that naks its own
// write and writes the row again has taken nothing over.
func (c *checker) tookOver(dE, dL *delivery) bool {
	if dL == nil {
		return false
	}
	if dE.member != dL.member || dE.rec.Incarnation != dL.rec.Incarnation || dE.proc != dL.proc {
		return true
	}
	if c.in.NoRegistry {
		return false
	}
	list := c.claimIndex().claims[dE.rec.Unit]
	from := holding(len(list), func(i int) int64 { return list[i].at }, dE.start)
	for i := max(from, 0); i < len(list) && list[i].at <= dL.start; i++ {
		if e := list[i].ev; e.Owner != "" && (e.Owner != dE.member || e.Incarnation != dE.rec.Incarnation) {
			return true
		}
	}
	return false
}

// instantOf is the delivery's start, or the write's instant when the
// delivery is not on record.
func instantOf(d *delivery, w *SinkWrite) int64 {
	if d != nil {
		return d.start
	}
	return w.At.UnixNano()
}

// resetBetween reports whether a RESET of unit was issued strictly between
// lo and hi.
func (c *checker) resetBetween(unit string, lo, hi int64) bool {
	ts := c.ev.resets[unit]
	i := sort.Search(len(ts), func(i int) bool { return ts[i] > lo })
	return i < len(ts) && ts[i] < hi
}

func (c *checker) describeDelivery(d *delivery) string {
	if d == nil {
		return "its delivery is not on record"
	}
	s := c.describe(&d.action)
	if d.settle != nil {
		s += ", settled by " + c.describe(d.settle)
	}
	return s
}

func (c *checker) deliveryCount(d *delivery) string {
	switch {
	case d == nil:
		return "unknown (not on record)"
	case d.rec.NumDelivered == 0:
		return "unknown (not recorded)"
	}
	return fmt.Sprintf("%d (%s)", d.rec.NumDelivered, c.describe(&d.action))
}
