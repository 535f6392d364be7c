package natsops

import (
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
}

// String renders the finding for logs and status messages.
func (f Finding) String() string {
	action := "left as is"
	if f.Updated {
		action = "updated"
	}
	return fmt.Sprintf("%s: %s is %s, want %s (%s)", f.Object, f.Field, f.Got, f.Want, action)
}

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
		fs = append(fs, Finding{Object: obj, Field: "retention", Want: want.Retention.String(), Got: got.Retention.String()})
	}
	if !changed {
		return fs, nil
	}
	return fs, &next
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
	update := func(field, w, g string, apply func()) {
		apply()
		changed = true
		fs = append(fs, Finding{Object: obj, Field: field, Want: w, Got: g, Updated: true})
	}

	gotFilters := got.FilterSubjects
	if got.FilterSubject != "" {
		gotFilters = append([]string{got.FilterSubject}, gotFilters...)
	}
	if len(gotFilters) != 1 || gotFilters[0] != want.FilterSubject {
		report("filter_subject", want.FilterSubject, list(gotFilters))
	}
	if got.DeliverSubject != "" {
		report("deliver_subject", "(pull)", got.DeliverSubject)
	}
	if want.AckPolicy != got.AckPolicy {
		report("ack_policy", want.AckPolicy.String(), got.AckPolicy.String())
	}
	if want.DeliverPolicy != got.DeliverPolicy {
		report("deliver_policy", want.DeliverPolicy.String(), got.DeliverPolicy.String())
	}
	if want.AckWait != got.AckWait {
		update("ack_wait", want.AckWait.String(), got.AckWait.String(), func() { next.AckWait = want.AckWait })
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
