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
			c.ex.add(CheckUnrecorded, w.At.UnixNano(), describeWrite(w)+": no delivery of the row by that member at that epoch is on record")
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
// write, else the first; nil when none is on record.
func (c *checker) deliveryOf(byKey map[deliveryKey][]*delivery, w *SinkWrite) *delivery {
	list := byKey[c.key(w.RowID, w.Member, w.Epoch)]
	if len(list) == 0 {
		return nil
	}
	at := w.At.UnixNano()
	i := sort.Search(len(list), func(i int) bool { return list[i].start > at }) - 1
	return list[max(i, 0)]
}

// judgeDuplicate classifies write later, a repeat of write earlier.
func (c *checker) judgeDuplicate(v *Verdict, byKey map[deliveryKey][]*delivery, earlier, later *SinkWrite) {
	v.Duplicates++
	dE, dL := c.deliveryOf(byKey, earlier), c.deliveryOf(byKey, later)
	switch {
	case dE != nil && !dE.acked:
		v.DupTakeover++
	case c.resetBetween(later.Unit, instantOf(dE, earlier), instantOf(dL, later)):
		v.DupReset++
	case dL != nil && dL.rec.NumDelivered > 1:
		v.DupRedelivery++
	default:
		v.DupUnexplained++
		c.ex.add(CheckDupUnexplained, later.At.UnixNano(), fmt.Sprintf("%s repeats %s (%s): the earlier delivery was acked, no reset of the unit came between, and NATS counted the later one as delivery %s",
			describeWrite(later), describeWrite(earlier), c.describeDelivery(dE), c.deliveryCount(dL)))
	}
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
