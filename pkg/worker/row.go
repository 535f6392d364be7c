package worker

import (
	"strconv"

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
