package historycheck

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// keyedRow is what the per-key order check knows of one row of a key.
type keyedRow struct {
	id, key string
	seq     int64
	// first is the Start of its earliest deliver record; firstProc the
	// process that made it.
	first     int64
	firstProc int
	// unit is the unit of its last deliver record (in Start order): where
	// the row lives, or last lived.
	unit     string
	lastSeen int64
	// acked is the Start of its earliest ack or term record whose settle
	// call reported no error; hasAck says there is one.
	acked  int64
	hasAck bool
}

// checkKeyOrder is the per-key order check (see the package doc): for
// each key, a row's first delivery must come after every earlier row of
// the key was acknowledged. A row delivered before an earlier row of
// another unit was acknowledged is a cross-unit inversion (what a change
// of N or V without an ordering barrier causes); one delivered before an
// earlier row of its own unit was acknowledged is a reorder within the
// unit (NATS's redelivery), counted apart and never a failure.
func (c *checker) checkKeyOrder(v *Verdict) {
	switch c.in.Ordering {
	case "", OrderingNone:
	case OrderingPerKey:
		v.OrderingPerKey = true
	default:
		// An ordering the checker does not know is judged as the strictest,
		// and said so: a typo must not turn a check into information.
		v.OrderingPerKey = true
		v.KeyInversions++
		c.ex.add(CheckKeyInversions, noInstant, fmt.Sprintf("Input.Ordering %q is neither %s nor %s (nor empty)", c.in.Ordering, OrderingNone, OrderingPerKey))
	}
	byKey := c.keyedRows()
	if len(byKey) == 0 {
		v.KeyOrderNA = true
		if v.OrderingPerKey {
			// Ordering PerKey declared, yet no keyed row was delivered: no
			// evidence, no verdict.
			v.KeyInversions++
			c.ex.add(CheckKeyInversions, noInstant, "the run declares ordering PerKey, but no row with a key and sequence (Input.Keys) was delivered: per-key order cannot be judged")
		}
		return
	}
	keys := slices.Sorted(maps.Keys(byKey))
	inverted := map[string]bool{}
	for _, key := range keys {
		rows := byKey[key]
		v.KeyedRows += len(rows)
		for _, inv := range judgeKey(rows) {
			j, i := inv.later, inv.earlier
			if !inv.cross {
				v.KeyReorders++
				continue
			}
			v.KeyInversions++
			detail := fmt.Sprintf("key %s: row %s (seq %d) first delivered on unit %s by %s at %s, before row %s (seq %d) of unit %s was acknowledged at %s",
				key, j.id, j.seq, j.unit, c.in.Processes[j.firstProc].Name, fmtTime(j.first), i.id, i.seq, i.unit, fmtTime(i.acked))
			if len(v.KeyInversionExamples) < maxExamples && !inverted[key] {
				v.KeyInversionExamples = append(v.KeyInversionExamples, detail)
			}
			if v.OrderingPerKey {
				c.ex.add(CheckKeyInversions, j.first, detail)
			}
			inverted[key] = true
		}
	}
	v.Keys, v.KeysInverted = len(byKey), len(inverted)
}

// keyedRows gathers, per key, the delivered rows Input.Keys names.
func (c *checker) keyedRows() map[string][]*keyedRow {
	if len(c.in.Keys) == 0 {
		return nil
	}
	rows := make(map[string]*keyedRow, len(c.in.Keys))
	for i := range c.ev.deliveries {
		d := &c.ev.deliveries[i]
		k, ok := c.in.Keys[d.rec.RowID]
		if !ok || d.rec.RowID == "" {
			continue
		}
		r := rows[d.rec.RowID]
		if r == nil {
			r = &keyedRow{id: d.rec.RowID, key: k.Key, seq: k.Seq, first: d.start, firstProc: d.proc, unit: d.rec.Unit, lastSeen: d.start}
			rows[d.rec.RowID] = r
		}
		if d.start < r.first {
			r.first, r.firstProc = d.start, d.proc
		}
		if d.start >= r.lastSeen {
			r.unit, r.lastSeen = d.rec.Unit, d.start
		}
	}
	for i := range c.ev.settles {
		a := &c.ev.settles[i]
		if (a.rec.Kind != history.KindAck && a.rec.Kind != history.KindTerm) || a.rec.Detail != "" {
			continue
		}
		if r := rows[a.rec.RowID]; r != nil && (!r.hasAck || a.start < r.acked) {
			r.acked, r.hasAck = a.start, true
		}
	}
	byKey := map[string][]*keyedRow{}
	for _, r := range rows {
		byKey[r.key] = append(byKey[r.key], r)
	}
	return byKey
}

// inversion is a later row of a key delivered before an earlier one was
// acknowledged; cross says the earlier one is of another unit.
type inversion struct {
	later, earlier *keyedRow
	cross          bool
}

// judgeKey finds, for each row of one key, whether its first delivery
// came before an earlier row's acknowledgement: one inversion per such
// row, cross-unit when any such earlier row is of another unit. A sweep in
// sequence order keeps, per unit, the latest acknowledgement of the rows
// so far, so a key of n rows over u units costs n*u.
func judgeKey(rows []*keyedRow) []inversion {
	slices.SortFunc(rows, func(a, b *keyedRow) int {
		return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.first, b.first), cmp.Compare(a.id, b.id))
	})
	latest := map[string]*keyedRow{} // unit -> its earlier row acknowledged last
	var out []inversion
	for from := 0; from < len(rows); {
		// Rows of one sequence number are not earlier than each other.
		to := from + 1
		for to < len(rows) && rows[to].seq == rows[from].seq {
			to++
		}
		for _, j := range rows[from:to] {
			var same, other *keyedRow
			for unit, i := range latest {
				if i.acked <= j.first {
					continue
				}
				if unit != j.unit {
					if other == nil || i.acked > other.acked {
						other = i
					}
				} else {
					same = i
				}
			}
			switch {
			case other != nil:
				out = append(out, inversion{later: j, earlier: other, cross: true})
			case same != nil:
				out = append(out, inversion{later: j, earlier: same})
			}
		}
		for _, i := range rows[from:to] {
			if i.hasAck && (latest[i.unit] == nil || i.acked > latest[i.unit].acked) {
				latest[i.unit] = i
			}
		}
		from = to
	}
	return out
}
