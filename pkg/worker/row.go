package worker

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/pkg/shard"
)

// Row is one message of a unit, handed to the Handler with the claim it was
// delivered under.
type Row struct {
	// Unit the row belongs to.
	Unit shard.Unit
	// Token is the claim at its fencing epoch. A sink in the registry's
	// database makes its write conditional on it (GuardSQL); a sink
	// elsewhere refuses tokens older than one it has admitted for the
	// unit, so a write from a member that lost the claim is refused.
	Token shard.Token
	// Subject, Data and Headers are the message's.
	Subject string
	Data    []byte
	Headers map[string][]string
	// StreamSeq is the row's sequence in its partition stream.
	StreamSeq uint64
	// NumDelivered counts deliveries as NATS knows them; a consumer RESET
	// starts it again at 1, so sinks count duplicates themselves too.
	NumDelivered uint64
}

// RowIDHeader carries a row's unique id (the JetStream de-duplication
// header publishers set).
const RowIDHeader = "Nats-Msg-Id"

// DefaultRowID is a row's id: its RowIDHeader, or else its unit and stream
// sequence.
func DefaultRowID(row Row) string {
	if ids := row.Headers[RowIDHeader]; len(ids) > 0 && ids[0] != "" {
		return ids[0]
	}
	return row.Unit.String() + "@" + strconv.FormatUint(row.StreamSeq, 10)
}

// Settlement is the Handler's verdict on a row.
type Settlement int

const (
	// Ack settles the row as done.
	Ack Settlement = iota
	// Nak asks for redelivery now (to this member or the next owner).
	Nak
	// Term drops the row for good: NATS never redelivers it.
	Term
	// Abandon leaves the row unsettled: NATS redelivers it after ack
	// wait. Handlers return it when the sink refused a stale write.
	Abandon
)

func (s Settlement) String() string {
	switch s {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case Term:
		return "term"
	default:
		return "abandon"
	}
}

// settle applies s to msg.
func settle(msg jetstream.Msg, s Settlement) error {
	switch s {
	case Ack:
		return msg.Ack()
	case Nak:
		return msg.Nak()
	case Term:
		return msg.Term()
	default:
		return nil
	}
}

// ackFields are what the SDK reads from a row's ack subject.
type ackFields struct {
	streamSeq, delivered, pending uint64
}

// ackMetadata reads a delivered row's stream sequence, delivery count and
// the consumer's pending count from its ack reply subject, by the same
// token positions as nats.go's parser ($JS.ACK.<stream>.<consumer>.
// <delivered>.<sseq>.<cseq>.<time>.<pending> from older servers,
// $JS.ACK.<domain>.<account hash>.<stream>.... from newer ones), but
// nothing else: Msg.Metadata also parses and allocates every other
// field, a cost on every row that a plain consumer need not pay. ok is
// false for a subject of another shape. It hops tokens with IndexByte and
// parses digits by hand: strings.Cut and strconv were two thirds of its
// 60 ns, and every nanosecond a row costs here costs several more in the
// process's and the server's CPU (make bench row c, README).
func ackMetadata(reply string) (f ackFields, ok bool) {
	rest, found := strings.CutPrefix(reply, "$JS.ACK.")
	if !found {
		return f, false
	}
	skip := 2 // stream, consumer
	switch n := strings.Count(rest, ".") + 3; {
	case n == 9:
	case n >= 11:
		skip = 4 // domain, account hash, stream, consumer
	default:
		return f, false
	}
	// The count above guarantees skip+4 more dots.
	for range skip {
		rest = rest[strings.IndexByte(rest, '.')+1:]
	}
	var tok [5]string // delivered, sseq, cseq, time, pending
	for i := range 4 {
		j := strings.IndexByte(rest, '.')
		tok[i], rest = rest[:j], rest[j+1:]
	}
	if j := strings.IndexByte(rest, '.'); j >= 0 {
		rest = rest[:j]
	}
	tok[4] = rest
	var oks [3]bool
	f.delivered, oks[0] = parseDecimal(tok[0])
	f.streamSeq, oks[1] = parseDecimal(tok[1])
	f.pending, oks[2] = parseDecimal(tok[4])
	return f, oks[0] && oks[1] && oks[2]
}

// parseDecimal parses an unsigned decimal. Up to 19 digits cannot
// overflow a uint64 and are summed by hand; longer ones go to strconv.
func parseDecimal(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 19 {
		v, err := strconv.ParseUint(s, 10, 64)
		return v, err == nil
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		v = v*10 + uint64(c)
	}
	return v, true
}
