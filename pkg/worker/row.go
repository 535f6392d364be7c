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

// known is s, or Abandon for a value outside the Settlement constants
// (settle leaves such a row unsettled, as it does an abandoned one).
func (s Settlement) known() Settlement {
	if s < Ack || s > Abandon {
		return Abandon
	}
	return s
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

// ackSubjects reads one consumer's ack subjects. Every row a consumer
// delivers shares the subject's head, up to and with the consumer's name
// ($JS.ACK.[<domain>.<account hash>.]<stream>.<consumer>.): once a full
// parse found it, a row whose subject starts with it has only its tail
// parsed. Counting and hopping the head's tokens again was a third of the
// parse (make bench row c counts every nanosecond a row costs, README).
// Only the puller's goroutine uses it.
type ackSubjects struct {
	head string
	// domains: the head is of the newer form, whose tail may carry more
	// tokens after the pending count.
	domains bool
}

// parse reads reply's fields; ok is false for a subject of another shape.
// A subject that starts with the head but whose tail is not a tail of the
// head's form (stream and consumer names equal to another form's domain
// and hash) goes to the full parse, so the cache never changes an answer.
func (a *ackSubjects) parse(reply string) (ackFields, bool) {
	if a.head != "" && strings.HasPrefix(reply, a.head) {
		if f, ok := ackTail(reply[len(a.head):], a.domains); ok {
			return f, true
		}
	}
	f, head, domains, ok := parseAck(reply)
	if ok {
		a.head, a.domains = strings.Clone(reply[:head]), domains
	}
	return f, ok
}

// ackMetadata reads a delivered row's stream sequence, delivery count and
// the consumer's pending count from its ack reply subject; ok is false
// for a subject of another shape.
func ackMetadata(reply string) (ackFields, bool) {
	f, _, _, ok := parseAck(reply)
	return f, ok
}

// parseAck reads reply by the same token positions as nats.go's parser
// ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>
// from older servers, $JS.ACK.<domain>.<account hash>.<stream>.... from
// newer ones), but nothing else: Msg.Metadata also parses and allocates
// every other field, a cost on every row that a plain consumer need not
// pay. head is the length of the subject's head (ackSubjects), domains
// whether it is of the newer form.
func parseAck(reply string) (f ackFields, head int, domains, ok bool) {
	rest, found := strings.CutPrefix(reply, "$JS.ACK.")
	if !found {
		return f, 0, false, false
	}
	skip := 2 // stream, consumer
	switch n := strings.Count(rest, ".") + 3; {
	case n == 9:
	case n >= 11:
		skip, domains = 4, true // domain, account hash, stream, consumer
	default:
		return f, 0, false, false
	}
	// The count above guarantees skip more dots.
	head = len(reply) - len(rest)
	for range skip {
		head += strings.IndexByte(reply[head:], '.') + 1
	}
	f, ok = ackTail(reply[head:], domains)
	return f, head, domains, ok
}

// ackTail reads <delivered>.<sseq>.<cseq>.<time>.<pending>, followed by
// more tokens only in the newer form, summing digits as it scans: token
// slices and strconv were two thirds of the parse's 60 ns.
func ackTail(tail string, domains bool) (f ackFields, ok bool) {
	i := 0
	if f.delivered, i, ok = decimalToken(tail, i); !ok {
		return f, false
	}
	if f.streamSeq, i, ok = decimalToken(tail, i); !ok {
		return f, false
	}
	for range 2 { // cseq, time: not read
		if i > len(tail) {
			return f, false
		}
		j := strings.IndexByte(tail[i:], '.')
		if j < 0 {
			return f, false
		}
		i += j + 1
	}
	if f.pending, i, ok = decimalToken(tail, i); !ok {
		return f, false
	}
	return f, i > len(tail) || domains
}

// decimalToken parses the unsigned decimal token of s that starts at i
// and returns it with the index after the dot that ends it (len(s)+1 when
// the token ends s). Up to 19 digits cannot overflow a uint64 and are
// summed by hand; longer ones go to strconv.
func decimalToken(s string, i int) (v uint64, next int, ok bool) {
	start := i
	for ; i < len(s) && s[i] != '.'; i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, 0, false
		}
		v = v*10 + uint64(c)
	}
	switch n := i - start; {
	case n <= 0:
		return 0, 0, false
	case n > 19:
		var err error
		if v, err = strconv.ParseUint(s[start:i], 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return v, i + 1, true
}
