package history

// Kind of a record.
type Kind string

// The kinds of record. Every file starts with one KindClock record; the
// others describe what the process did to one unit's consumer.
const (
	// KindClock is the first record of every file. It pairs CLOCK_MONOTONIC
	// (Start) with CLOCK_REALTIME (Wall) so a reader can put the file's
	// monotonic times on the registry's wall clock.
	KindClock Kind = "clock"
	// KindFetch is one pull request: Start=sent, End=finished, Rows=rows it
	// returned.
	KindFetch Kind = "fetch"
	// KindDeliver is a row handed to the handler: Start=the instant the SDK's
	// claim check passed, Fetch=when the pull that brought it was sent. It
	// is written BEFORE the handler runs, so a process killed inside its
	// handler still leaves the delivery on record.
	KindDeliver Kind = "deliver"
	// KindAck settles a delivery: Start=the claim check before settling,
	// End=the settle call returned.
	KindAck Kind = "ack"
	// KindNak settles a delivery asking NATS to redeliver; times as KindAck.
	KindNak Kind = "nak"
	// KindTerm settles a delivery telling NATS never to redeliver; times as
	// KindAck.
	KindTerm Kind = "term"
	// KindAbandon is a delivery the handler asked to leave unsettled (e.g. the
	// sink's guard refused a stale write).
	KindAbandon Kind = "abandon"
	// KindWithheld is a row neither delivered nor settled because the claim
	// was lost or the member fenced: Start=the check that failed, Detail=the
	// reason ("fenced", "released").
	KindWithheld Kind = "withheld"
	// KindReset is a consumer RESET issued on takeover of Unit.
	KindReset Kind = "reset"
)

// Record is one line of a history file. The short JSON keys keep files
// small: a busy worker writes one record per delivery and one per ack.
type Record struct {
	Kind          Kind   `json:"k"`
	Unit          string `json:"u,omitempty"`
	Member        string `json:"m,omitempty"`
	Incarnation   int64  `json:"i,omitempty"`
	Epoch         int64  `json:"e,omitempty"`  // the claim's fencing epoch (the token)
	TopologyEpoch int64  `json:"te,omitempty"` // topology epoch the claim was decided under
	RowID         string `json:"r,omitempty"`
	StreamSeq     uint64 `json:"q,omitempty"`
	NumDelivered  uint64 `json:"d,omitempty"` // NATS delivery count of this delivery
	Rows          int    `json:"n,omitempty"`
	Detail        string `json:"x,omitempty"` // e.g. a settle error, or a withheld row's reason ("fenced", "released")
	Start         int64  `json:"s"`           // CLOCK_MONOTONIC nanoseconds
	Fetch         int64  `json:"f,omitempty"` // deliver records: Start of the pull that brought the row
	End           int64  `json:"t,omitempty"`
	Wall          int64  `json:"w,omitempty"` // clock records only: CLOCK_REALTIME ns read at Start
}

// Recorder receives a process's records. Implementations must be safe for
// concurrent use, because every pulling goroutine records, and must not
// block for long, because they are called on the delivery path.
type Recorder interface{ Record(Record) }

// Discard is a Recorder that drops every record. The SDK's cheapest off
// switch is still a nil Recorder; Discard is for callers that want a value.
var Discard Recorder = discard{}

type discard struct{}

func (discard) Record(Record) {}
