package natsops

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jsm.go/api"
)

// Finding is one difference between what the layout wants and what the
// server has.
type Finding struct {
	// Object is "stream <name>" or "consumer <stream>/<name>".
	Object string
	// Field is the JSON name of the configuration field.
	Field string
	Want  string
	Got   string
	// Updated says Provision changed the field to Want. False means the
	// change is impossible (an immutable field) or unsafe (it would change
	// which rows an object holds), and a person has to decide.
	Updated bool
	// Unsafe says the object as it is can lose rows, or deliver them
	// where no claim guards them (a stream limit that drops unconsumed
	// rows, a consumer that acks on delivery, pushes, or serves another
	// filter). Provision refuses it with an *UnsafeConfigError; Want then
	// says what is allowed.
	Unsafe bool
}

// String renders the finding for logs and status messages.
func (f Finding) String() string {
	if f.Unsafe {
		return fmt.Sprintf("%s: %s is %s; allowed: %s", f.Object, f.Field, f.Got, f.Want)
	}
	action := "left as is"
	if f.Updated {
		action = "updated"
	}
	return fmt.Sprintf("%s: %s is %s, want %s (%s)", f.Object, f.Field, f.Got, f.Want, action)
}

// ErrUnsafeConfig is what errors.Is finds in an *UnsafeConfigError.
var ErrUnsafeConfig = errors.New("NATS object configuration can lose rows")

// UnsafeConfigError says streams or unit consumers are configured so that
// rows can be dropped before their unit's owner acknowledges them, or
// delivered outside the claim that guards them. Provision changes none of
// it (each needs a person: most of these fields cannot be changed back on
// a live object) and the topology goes no further until it is fixed.
type UnsafeConfigError struct {
	Findings []Finding
}

func (e *UnsafeConfigError) Error() string {
	parts := make([]string, 0, min(len(e.Findings), 3))
	for i, f := range e.Findings {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(e.Findings)-3))
			break
		}
		parts = append(parts, f.String())
	}
	return "refused: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrUnsafeConfig) true.
func (e *UnsafeConfigError) Is(target error) bool { return target == ErrUnsafeConfig }

func streamObject(stream string) string { return "stream " + stream }

func consumerObject(stream, consumer string) string { return "consumer " + stream + "/" + consumer }

// streamDrift compares the fields of a stream the layout owns and returns
// the findings and the configuration to send when something safe differs
// (nil when nothing does). Subjects are only ever added: removing one would
// stop capturing rows someone may still publish.
func streamDrift(want, got api.StreamConfig, ownsTransform bool) ([]Finding, *api.StreamConfig) {
	obj := streamObject(want.Name)
	var fs []Finding
	next := got
	changed := false

	var missing []string
	for _, s := range want.Subjects {
		if !slices.Contains(got.Subjects, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		next.Subjects = append(slices.Clone(got.Subjects), missing...)
		changed = true
	}
	if !sameSet(want.Subjects, got.Subjects) {
		fs = append(fs, Finding{Object: obj, Field: "subjects", Want: list(want.Subjects), Got: list(got.Subjects), Updated: len(missing) > 0})
	}

	if !sameTransform(want.SubjectTransform, got.SubjectTransform) {
		f := Finding{Object: obj, Field: "subject_transform", Want: transform(want.SubjectTransform), Got: transform(got.SubjectTransform)}
		if ownsTransform {
			next.SubjectTransform = want.SubjectTransform
			f.Updated, changed = true, true
		}
		fs = append(fs, f)
	}
	if want.Replicas != got.Replicas {
		next.Replicas = want.Replicas
		changed = true
		fs = append(fs, Finding{Object: obj, Field: "num_replicas", Want: fmt.Sprint(want.Replicas), Got: fmt.Sprint(got.Replicas), Updated: true})
	}
	if want.Storage != got.Storage {
		fs = append(fs, Finding{Object: obj, Field: "storage", Want: want.Storage.String(), Got: got.Storage.String()})
	}
	if want.Retention != got.Retention {
		fs = append(fs, Finding{Object: obj, Field: "retention", Want: want.Retention.String(), Got: got.Retention.String(),
			Unsafe: got.Retention == api.InterestPolicy})
		if got.Retention == api.InterestPolicy {
			fs[len(fs)-1].Want = "limits (or workqueue): interest retention drops a row no consumer is interested in when it is stored"
		}
	}
	fs = append(fs, streamLimits(obj, got)...)
	if f, ok := maxConsumersDrift(obj, want.MaxConsumers, got.MaxConsumers); ok {
		next.MaxConsumers = want.MaxConsumers
		changed = true
		fs = append(fs, f)
	}
	if want.DenyDelete && !got.DenyDelete {
		// Safe: nothing of shardkeeper deletes single rows, and the
		// server lets deny_delete be set (never cleared) on a live
		// stream.
		next.DenyDelete = true
		changed = true
		fs = append(fs, Finding{Object: obj, Field: "deny_delete", Want: "true", Got: "false", Updated: true})
	}
	if o, _ := ownerOf(want.Metadata); ownerDrift(got.Metadata, o) {
		next.Metadata = withOwner(got.Metadata, o)
		changed = true
		fs = append(fs, Finding{Object: obj, Field: "metadata." + OwnerKey, Want: o.String(), Got: ownerString(got.Metadata), Updated: true})
	}
	if !changed {
		return fs, nil
	}
	return fs, &next
}

// maxConsumersDrift reports a stream whose max_consumers is unset or below
// want, and says it is to be raised. Unset (-1, or 0 as older streams may
// say) is drift even where it works: nats-server 2.15 counts it as unset
// and refuses the stream's 1001st consumer, so the stream would stop V
// above 1000 the day its servers move to 2.15. Raising it is safe (it
// changes no row the stream holds) and the servers take it on a live
// stream (2.14 and 2.15 alike: their TestJetStreamClusterStreamUpdate-
// MaxConsumersLimit); a limit above want is someone's choice and left.
func maxConsumersDrift(obj string, want, got int) (Finding, bool) {
	if got > 0 && got >= want {
		return Finding{}, false
	}
	g := fmt.Sprint(got)
	if got <= 0 {
		g += " (unset: nats-server 2.15 then refuses the stream's 1001st consumer)"
	}
	return Finding{Object: obj, Field: "max_consumers", Want: fmt.Sprint(want), Got: g, Updated: true}, true
}

// streamLimits reports every setting of got that can drop a stored row
// before the unit's owner acknowledged it. A limit is allowed only with
// discard new (the stream then refuses the publish, and a publisher that
// waits for the stream's ack sees it), and never max_age, a per-message
// TTL, rollups or a sealed stream.
func streamLimits(obj string, got api.StreamConfig) []Finding {
	var fs []Finding
	unsafe := func(field, g, allowed string) {
		fs = append(fs, Finding{Object: obj, Field: field, Want: allowed, Got: g, Unsafe: true})
	}
	if got.MaxAge > 0 {
		unsafe("max_age", got.MaxAge.String(), "0 (no age limit): rows older than max_age are dropped whether or not they were consumed")
	}
	if got.Discard != api.DiscardNew {
		for _, l := range []struct {
			field string
			v     int64
		}{{"max_msgs", got.MaxMsgs}, {"max_bytes", got.MaxBytes}} {
			if l.v > 0 {
				unsafe(l.field, fmt.Sprintf("%d with discard %s", l.v, got.Discard),
					"-1 (no limit), or a limit with discard new: discard old drops the oldest rows, consumed or not, to make room")
			}
		}
	}
	if got.MaxMsgsPer > 0 && (got.Discard != api.DiscardNew || !got.DiscardNewPer) {
		unsafe("max_msgs_per_subject", fmt.Sprintf("%d with discard %s, discard_new_per_subject %t", got.MaxMsgsPer, got.Discard, got.DiscardNewPer),
			"-1 (no limit), or a limit with discard new and discard_new_per_subject: otherwise a subject's oldest rows are dropped to make room")
	}
	if got.AllowMsgTTL {
		unsafe("allow_msg_ttl", "true", "false: a publisher's Nats-TTL header would expire rows nobody consumed")
	}
	if got.RollupAllowed {
		unsafe("allow_rollup_hdrs", "true", "false: a publisher's Nats-Rollup header purges the subject's stored rows")
	}
	if got.Sealed {
		unsafe("sealed", "true", "false: a sealed stream stores no new row")
	}
	return fs
}

func ownerString(meta map[string]string) string {
	if o, ok := ownerOf(meta); ok {
		return o.String()
	}
	return "(none)"
}

// consumerDrift is streamDrift for a unit consumer. What it serves (filter,
// push or pull) and the immutable policies are reported, never changed.
func consumerDrift(stream string, want, got api.ConsumerConfig) ([]Finding, *api.ConsumerConfig) {
	obj := consumerObject(stream, want.Durable)
	var fs []Finding
	next := got
	changed := false
	report := func(field, w, g string) {
		fs = append(fs, Finding{Object: obj, Field: field, Want: w, Got: g})
	}
	refuse := func(field, allowed, g string) {
		fs = append(fs, Finding{Object: obj, Field: field, Want: allowed, Got: g, Unsafe: true})
	}
	update := func(field, w, g string, apply func()) {
		apply()
		changed = true
		fs = append(fs, Finding{Object: obj, Field: field, Want: w, Got: g, Updated: true})
	}

	gotFilters := got.FilterSubjects
	if got.FilterSubject != "" {
		gotFilters = append([]string{got.FilterSubject}, gotFilters...)
	}
	// Unsafe: rows of other units delivered under this unit's claim, rows
	// pushed to whoever subscribes, rows acknowledged before the handler
	// ran. None of it can be changed on a live consumer without changing
	// which rows it holds; a person deletes or fixes it.
	if len(gotFilters) != 1 || gotFilters[0] != want.FilterSubject {
		refuse("filter_subject", want.FilterSubject+" only: another filter delivers rows of other units under this unit's claim", list(gotFilters))
	}
	if got.DeliverSubject != "" {
		refuse("deliver_subject", "none (a pull consumer): a push consumer delivers to whoever subscribes, outside any claim", got.DeliverSubject)
	}
	if want.AckPolicy != got.AckPolicy {
		refuse("ack_policy", want.AckPolicy.String()+": any other policy acknowledges rows the handler has not settled", got.AckPolicy.String())
	}
	if want.DeliverPolicy != got.DeliverPolicy {
		report("deliver_policy", want.DeliverPolicy.String(), got.DeliverPolicy.String())
	}
	if want.AckWait != got.AckWait {
		update("ack_wait", want.AckWait.String(), got.AckWait.String(), func() { next.AckWait = want.AckWait })
	}
	if want.MaxAckPending != got.MaxAckPending {
		update("max_ack_pending", fmt.Sprint(want.MaxAckPending), fmt.Sprint(got.MaxAckPending), func() { next.MaxAckPending = want.MaxAckPending })
	}
	if want.MaxDeliver != got.MaxDeliver {
		update("max_deliver", fmt.Sprint(want.MaxDeliver), fmt.Sprint(got.MaxDeliver), func() { next.MaxDeliver = want.MaxDeliver })
	}
	if want.Replicas != got.Replicas {
		update("num_replicas", fmt.Sprint(want.Replicas), fmt.Sprint(got.Replicas), func() { next.Replicas = want.Replicas })
	}
	if want.PriorityPolicy != got.PriorityPolicy {
		update("priority_policy", want.PriorityPolicy.String(), got.PriorityPolicy.String(), func() { next.PriorityPolicy = want.PriorityPolicy })
	}
	if !slices.Equal(want.PriorityGroups, got.PriorityGroups) {
		update("priority_groups", list(want.PriorityGroups), list(got.PriorityGroups), func() { next.PriorityGroups = want.PriorityGroups })
	}
	if want.PinnedTTL != got.PinnedTTL {
		update("priority_timeout", want.PinnedTTL.String(), got.PinnedTTL.String(), func() { next.PinnedTTL = want.PinnedTTL })
	}
	if got.InactiveThreshold > 0 {
		// A durable with an inactivity threshold is deleted by the server
		// when nobody pulls for that long, and its ack floor with it.
		update("inactive_threshold", "0", got.InactiveThreshold.String(), func() { next.InactiveThreshold = 0 })
	}
	if o, _ := ownerOf(want.Metadata); ownerDrift(got.Metadata, o) {
		update("metadata."+OwnerKey, o.String(), ownerString(got.Metadata), func() { next.Metadata = withOwner(got.Metadata, o) })
	}
	if slices.ContainsFunc(fs, func(f Finding) bool { return f.Unsafe }) {
		// A refused consumer is left exactly as it is (a safe update may
		// not even apply: a push consumer takes no priority group).
		for i := range fs {
			fs[i].Updated = false
		}
		return fs, nil
	}
	if !changed {
		return fs, nil
	}
	return fs, &next
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	return true
}

func sameTransform(a, b *api.SubjectTransformConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func transform(t *api.SubjectTransformConfig) string {
	if t == nil {
		return "(none)"
	}
	return t.Source + " -> " + t.Destination
}

func list(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ",")
}
