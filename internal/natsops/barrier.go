package natsops

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the order barrier of a change of V (issue 24, design.md section 8)
// reads from NATS: each partition stream's last sequence around the
// transform's switch, the rows stored around it (to find the switch), and
// whether an old unit's consumer acknowledged every row up to it.
// internal/ownership decides what they mean; this file only reads.

// errCodeNoMessageFound is the JetStream API's "no message found".
const errCodeNoMessageFound = 10037

// StreamPosition is one partition stream's last sequence, and whether
// its subject transform routes as the layout says (Layout.Transform).
type StreamPosition struct {
	LastSeq uint64
	// Routed: the stream's transform is the layout's. Read in the same
	// reply as LastSeq, so when it holds every row above LastSeq is routed
	// by the layout's transform.
	Routed bool
}

// StreamPositions reads each of l's partition streams' position, by
// partition.
func StreamPositions(ctx context.Context, nc *nats.Conn, l Layout) (map[int]StreamPosition, error) {
	jsa := jsAPI{nc}
	out := make(map[int]StreamPosition, l.Partitions)
	for p := 0; p < l.Partitions; p++ {
		si, err := jsa.streamInfo(ctx, l.StreamName(p))
		if err != nil {
			return nil, fmt.Errorf("read the last sequence of stream %s: %w", l.StreamName(p), err)
		}
		out[p] = StreamPosition{LastSeq: si.State.LastSeq, Routed: sameTransform(si.Config.SubjectTransform, l.Transform(p))}
	}
	return out, nil
}

// ShardRow is a row of a partition stream as the transform routed it: the
// shard its subject names and its key (the subject's last token).
type ShardRow struct {
	Seq   uint64
	Shard int
	Key   string
}

// RowAt reads partition p's row at seq. ok is false when there is no such
// row (deleted, or never stored) or its subject is not a routed row of
// this layout (<prefix>.ingest.<p>.<s>.<key>).
func RowAt(ctx context.Context, nc *nats.Conn, l Layout, p int, seq uint64) (ShardRow, bool, error) {
	msg, err := msgGet(ctx, jsAPI{nc}, l.StreamName(p), api.JSApiMsgGetRequest{Seq: seq})
	if err != nil || msg == nil {
		return ShardRow{}, false, err
	}
	s, key, ok := l.parseRoutedSubject(p, msg.Subject)
	return ShardRow{Seq: msg.Sequence, Shard: s, Key: key}, ok, nil
}

// parseRoutedSubject splits <prefix>.ingest.<p>.<s>.<key>.
func (l Layout) parseRoutedSubject(p int, subject string) (shard int, key string, ok bool) {
	rest, found := strings.CutPrefix(subject, fmt.Sprintf("%s.ingest.%d.", l.SubjectPrefix, p))
	if !found {
		return 0, "", false
	}
	num, key, found := strings.Cut(rest, ".")
	if !found || key == "" || strings.Contains(key, ".") {
		return 0, "", false
	}
	s, err := strconv.Atoi(num)
	if err != nil || s < 0 {
		return 0, "", false
	}
	return s, key, true
}

// msgGet reads one stored row; nil, nil when there is none.
func msgGet(ctx context.Context, jsa jsAPI, stream string, req api.JSApiMsgGetRequest) (*api.StoredMsg, error) {
	var resp api.JSApiMsgGetResponse
	err := jsa.do(ctx, fmt.Sprintf(api.JSApiMsgGetT, stream), &req, &resp)
	switch {
	case api.IsNatsError(err, errCodeNoMessageFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read a row of stream %s: %w", stream, err)
	}
	return resp.Message, nil
}

// Drain is what NATS says of an old unit's consumer against a switch
// sequence: whether every row of the unit at or below it was acknowledged.
type Drain struct {
	// Drained: every row of the unit at or below the switch was
	// acknowledged, or the consumer is gone (retired once drained).
	Drained bool
	// Retired: the consumer does not exist.
	Retired bool
	// AckFloor is the consumer's ack floor (stream sequence).
	AckFloor uint64
	// Pending and AckPending are the consumer's undelivered and
	// unacknowledged rows.
	Pending    uint64
	AckPending int
	// FirstOpen is the first row of the unit above the ack floor (not
	// acknowledged, or not known to be), 0 when none was read.
	FirstOpen uint64
}

// DrainedTo reads whether unit (p, s)'s consumer acknowledged every row of
// the unit at or below seq.
//
// The ack floor alone is not enough. nats-server (consumer.go,
// moveAckFloor) moves a filtered consumer's floor to the row it acked, or
// to just below the next row it has delivered and not acknowledged, or,
// with nothing delivered outstanding, to just below the next row it would
// deliver; so a consumer that acknowledged its last row before seq and
// then received a row after it keeps its floor below seq until that row is
// acknowledged. A new unit's worker holds such a row (a moved key waiting
// for its own predecessor), and two units that feed each other (16 -> 12:
// units 4 and 8) would wait for each other for ever. So: drained when the
// floor is at or above seq, or nothing is pending or unacknowledged, or
// the unit's first row above the floor (read from the stream by the
// consumer's filter) is above seq: every row at or below the floor is
// acknowledged, and the unit has none between the floor and seq. Each
// reading only grows (the floor never goes back), so reading the
// consumer before the stream errs on the side of waiting.
func DrainedTo(ctx context.Context, nc *nats.Conn, l Layout, p, s int, seq uint64) (Drain, error) {
	jsa := jsAPI{nc}
	ref := l.ConsumerRef(Unit{Partition: p, Shard: s})
	ci, err := jsa.consumerInfo(ctx, ref.Stream, ref.Name)
	switch {
	case api.IsNatsError(err, errCodeConsumerNotFound):
		return Drain{Drained: true, Retired: true}, nil
	case err != nil:
		return Drain{}, fmt.Errorf("read consumer %s: %w", ref, err)
	}
	d := Drain{AckFloor: ci.AckFloor.Stream, Pending: ci.NumPending, AckPending: ci.NumAckPending}
	if d.Pending == 0 && d.AckPending == 0 {
		d.Drained = true
		return d, nil
	}
	d.Drained, d.FirstOpen, err = settledTo(ctx, jsa, l, p, s, d.AckFloor, seq)
	if err != nil {
		return Drain{}, fmt.Errorf("read unit %s's first row above its ack floor: %w", ref, err)
	}
	return d, nil
}

// settledTo says whether every row of unit (p, s) at or below seq is
// settled, given that every one at or below settled is: settled reaches
// seq, or the unit's first row above settled (read from the stream by
// the unit's filter, returned as firstOpen) lies beyond seq.
func settledTo(ctx context.Context, jsa jsAPI, l Layout, p, s int, settled, seq uint64) (ok bool, firstOpen uint64, err error) {
	if settled >= seq {
		return true, 0, nil
	}
	msg, err := msgGet(ctx, jsa, l.StreamName(p), api.JSApiMsgGetRequest{Seq: settled + 1, NextFor: l.FilterSubject(p, s)})
	if err != nil || msg == nil {
		return err == nil, 0, err
	}
	return msg.Sequence > seq, msg.Sequence, nil
}

// MarkPasses is DrainedTo's test with a holder's drained-to mark (Mark,
// recorded under its claim token) in place of the ack floor: every row of
// unit (p, s) at or below seq is acknowledged or held as a moved-in key's
// row when the mark reaches seq or the unit has no row between the mark
// and seq. The operator lifts a change of N's old unit by it when held
// rows keep the floor low (design.md section 8).
func MarkPasses(ctx context.Context, nc *nats.Conn, l Layout, p, s int, mark, seq uint64) (bool, error) {
	ok, _, err := settledTo(ctx, jsAPI{nc}, l, p, s, mark, seq)
	if err != nil {
		return false, fmt.Errorf("read unit %d.%d's first row above its mark %d: %w", p, s, mark, err)
	}
	return ok, nil
}

// Mark is how far a unit's rows are known to be settled, as its holder
// can say between batches under the order barrier of a change of N
// (design.md section 8). There, rows of keys that move
// into the unit arrive below its own switch S_p and wait in the holder,
// unacknowledged, so the ack floor cannot pass S_p; the holder alone knows
// which of the pending rows are such held rows.
type Mark struct {
	// Seq: every row of the unit at or below it is acknowledged or is one
	// of the holder's held rows.
	Seq uint64
	// Exact: the consumer's pending rows were exactly the held ones, so
	// Seq is the last row delivered; otherwise Seq is the ack floor.
	Exact bool
	// AckPending is the consumer's unacknowledged rows, as read.
	AckPending int
}

// MarkOf reads a unit's consumer for its holder, which holds held
// rows, delivered and not acknowledged, and has no other row in flight
// (between batches, every row of the last one settled or held).
//
// When the consumer's pending acknowledgements number exactly held, no
// row outside the held ones is pending, so every row of the unit up to
// the last one delivered (delivered.stream_seq; first deliveries come in
// stream order) is acknowledged or held: the mark is that row. A held row
// is always among the pending (nats-server keeps a row in o.pending until
// it is acknowledged or terminated; a nak or an ack_wait expiry only
// queues its redelivery). Otherwise something else is pending (a row the
// previous holder left, a nak'd row waiting for redelivery) that the
// holder may never have seen, and only the floor is safe: a mark built
// from the rows a new holder saw would pass rows its predecessor left
// unacknowledged, which come back after newer ones.
//
// The count proves something only while the caller is the unit's sole
// holder: a stale holder's held rows may have been released and
// acknowledged by its successor, and then the counts can match with
// another row pending. Its answer counts only under the current claim.
func MarkOf(ctx context.Context, js jetstream.JetStream, ref ConsumerRef, held int) (Mark, error) {
	c, err := js.Consumer(ctx, ref.Stream, ref.Name)
	if err != nil {
		return Mark{}, fmt.Errorf("read consumer %s: %w", ref, err)
	}
	ci := c.CachedInfo() // read by the lookup just made
	if ci.NumAckPending == held || !markCountsPending {
		return Mark{Seq: ci.Delivered.Stream, Exact: true, AckPending: ci.NumAckPending}, nil
	}
	return Mark{Seq: ci.AckFloor.Stream, AckPending: ci.NumAckPending}, nil
}
