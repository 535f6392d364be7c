package sim

// This file models one durable pull consumer per unit, with the
// pinned_client priority policy: what the members' pullers, UNPIN and
// RESET act on.

// msgState is where one row stands in its consumer.
type msgState int

const (
	msgAvailable msgState = iota // never delivered, or back for redelivery
	msgInFlight                  // delivered, waiting for its ack
	msgAcked
)

// msg is one row of a unit's stream as its consumer sees it.
type msg struct {
	// seq is the row's stream sequence: its partition stream's in an
	// ordered run (order.go), its unit's otherwise.
	seq        uint64
	rowID      string
	key        string // the row's key in an ordered run, "" otherwise
	state      msgState
	deliveries uint64 // NATS's delivery count
	// pending: in the consumer's pending set (nats-server's o.pending,
	// what num_ack_pending counts): delivered and not acknowledged since.
	// A nak or an ack_wait expiry keeps it there; an ack or a RESET takes
	// it out.
	pending bool
	to      *process
	ackBy   int64 // in flight: redelivered after this instant (ack_wait)
}

// consumer is one unit's durable consumer with one priority group.
type consumer struct {
	unit string
	msgs []*msg
	// pin is the process pinned, nil when none; pinnedAt is its last pull
	// request, from which the pinned TTL runs.
	pin      *process
	pinnedAt int64
	// delivered is the highest stream sequence delivered since the last
	// RESET (the consumer info's delivered.stream_seq).
	delivered uint64
}

// pinned returns the pinned process, letting a pin lapse whose holder has
// not pulled for the pinned TTL.
func (c *consumer) pinned(now, ttl int64) *process {
	if c.pin != nil && now-c.pinnedAt >= ttl {
		c.pin = nil
	}
	return c.pin
}

// fetch answers a pull request from p that arrived now: nil, false when
// another process holds the pin (NATS answers such a request with a pin
// mismatch); else up to batch rows, which are then in flight to p.
func (c *consumer) fetch(p *process, now int64, batch int, ttl, ackWait int64) ([]delivered, bool) {
	if pin := c.pinned(now, ttl); pin != nil && pin != p {
		return nil, false
	}
	c.pin, c.pinnedAt = p, now
	var out []delivered
	for _, m := range c.msgs {
		if len(out) == batch {
			break
		}
		if m.state == msgInFlight && now >= m.ackBy {
			m.state = msgAvailable // ack_wait ran out
		}
		if m.state != msgAvailable {
			continue
		}
		m.state, m.to, m.ackBy, m.pending = msgInFlight, p, now+ackWait, true
		c.delivered = max(c.delivered, m.seq)
		m.deliveries++
		out = append(out, delivered{m: m, deliveries: m.deliveries})
	}
	return out, true
}

// delivered is one row handed out by a fetch, with its delivery count then.
type delivered struct {
	m          *msg
	deliveries uint64
	// fetched is when the pull that brought a held row was sent;
	// released marks a held row let go, delivered without another look
	// at the barrier (puller.go).
	fetched  int64
	released bool
}

// ack settles a delivery. NATS takes an ack of a row still pending from
// whoever sends it; a row acked already stays acked.
func (c *consumer) ack(m *msg) {
	if m.state != msgAcked {
		m.state, m.to, m.pending = msgAcked, nil, false
	}
}

// nak puts a delivered row back for redelivery at once, if that delivery
// is still the row's latest (a nak of an older delivery is ignored).
func (c *consumer) nak(m *msg, deliveries uint64) {
	if m.state == msgInFlight && m.deliveries == deliveries {
		m.state, m.to = msgAvailable, nil
	}
}

// inProgress restarts a delivery's ack wait (NATS's +WPI), if that
// delivery is still the row's latest and unacknowledged.
func (c *consumer) inProgress(m *msg, deliveries uint64, now, ackWait int64) {
	if m.state == msgInFlight && m.deliveries == deliveries {
		m.ackBy = now + ackWait
	}
}

// unpin lifts the pin, so the next pull request is pinned.
func (c *consumer) unpin() { c.pin = nil }

// reset moves the consumer back to its ack floor: every row not acked is
// available again at once, nothing is pending, and delivered goes back
// to the floor.
func (c *consumer) reset() {
	for _, m := range c.msgs {
		if m.state == msgInFlight {
			m.state, m.to = msgAvailable, nil
		}
		m.pending = false
	}
	c.delivered = c.ackFloor()
}

// ackFloor is the consumer's ack floor: just below its first row not
// acknowledged, or its last row when every one is.
func (c *consumer) ackFloor() uint64 {
	floor := uint64(0)
	for _, m := range c.msgs {
		if m.state != msgAcked {
			return m.seq - 1
		}
		floor = m.seq
	}
	return floor
}

// ackPending counts the pending rows (num_ack_pending).
func (c *consumer) ackPending() int {
	n := 0
	for _, m := range c.msgs {
		if m.pending {
			n++
		}
	}
	return n
}

// unacked counts rows not acked yet.
func (c *consumer) unacked() int {
	n := 0
	for _, m := range c.msgs {
		if m.state != msgAcked {
			n++
		}
	}
	return n
}
