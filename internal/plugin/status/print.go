package status

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// Print writes the topology as a person reads it: a summary, the plan
// waiting for approval, the rollout step by step, the last rollout, the
// conditions and the latest Events.
func Print(w io.Writer, t *topologyv1.ShardTopology, evs []eventsv1.Event, now time.Time) error {
	st := &t.Status
	fmt.Fprintf(w, "ShardTopology %s/%s  generation %d (observed %d)\n", t.Namespace, t.Name, t.Generation, st.ObservedGeneration)
	fmt.Fprintf(w, "Phase:     %s\n", orDash(string(st.Phase)))
	fmt.Fprintf(w, "Progress:  %s\n", orDash(st.Progress))
	fmt.Fprintf(w, "Spec:      %dx%d (%d units), approval %s%s\n", t.Spec.Partitions, t.Spec.ShardsPerPartition, t.Spec.Units(), approvalOf(t), Notes(t))
	fmt.Fprintf(w, "Active:    %s\n", EpochLine(st.ActiveEpoch))
	if st.TargetEpoch != nil {
		fmt.Fprintf(w, "Target:    %s\n", EpochLine(st.TargetEpoch))
	}
	if u := st.Units; u != nil {
		line := fmt.Sprintf("%d total, %d owned, %d unowned, %d multiply owned", u.Total, u.Owned, u.Unowned, u.MultiplyOwned)
		if u.Stalled > 0 {
			line += fmt.Sprintf("; %d owned but stalled (not flowing)", u.Stalled)
		}
		if u.Retiring > 0 {
			line += fmt.Sprintf("; %d that left are retired once drained", u.Retiring)
		}
		fmt.Fprintf(w, "Units:     %s\n", line)
	}
	if m := st.Members; m != nil {
		line := fmt.Sprintf("%d live", m.Live)
		if m.Foreign > 0 {
			line += fmt.Sprintf("; %d NOT pods of StatefulSet %s, holding %d units: %s", m.Foreign, t.Spec.Workload.StatefulSetName, m.ForeignUnits, strings.Join(m.ForeignNames, ", "))
			if int(m.Foreign) > len(m.ForeignNames) {
				line += ", ..."
			}
		}
		fmt.Fprintf(w, "Members:   %s\n", line)
	}
	fmt.Fprintf(w, "Census:    %s\n", CensusLine(st.Census, now))
	printOrderBarrier(w, st.OrderBarrier, now)
	if p := st.Plan; p != nil && p.State == topologyv1.PlanProposalReady {
		fmt.Fprintf(w, "\nPlan %s (%s, proposed %s ago): %s\n", p.Hash, p.State, Age(timeOf(p.ProposedAt), now), p.Message)
	}
	printRollout(w, t, now)
	if l := st.LastRollout; l != nil {
		fmt.Fprintf(w, "Last:      %s\n", LastRolloutLine(l, now))
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(st.Conditions))
	for _, c := range st.Conditions {
		rows = append(rows, []string{c.Type, string(c.Status), c.Reason, Age(c.LastTransitionTime.Time, now), c.Message})
	}
	if err := plugin.PrintTable(w, []string{"condition", "status", "reason", "age", "message"}, rows); err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows = rows[:0]
	for _, e := range evs {
		rows = append(rows, []string{Age(eventTime(e), now), e.Type, e.Reason, e.Note})
	}
	return plugin.PrintTable(w, []string{"last seen", "type", "reason", "event"}, rows)
}

// printRollout lists the rollout's steps with a mark each: [x] done, [>]
// in progress, [ ] to come. The steps are the API's (TopologySteps), the
// same names plan shows.
func printRollout(w io.Writer, t *topologyv1.ShardTopology, now time.Time) {
	r := t.Status.Rollout
	if r == nil {
		fmt.Fprintln(w, "Rollout:   none in progress")
		return
	}
	started := ""
	if r.StartedAt != nil {
		started = ", started " + Age(r.StartedAt.Time, now) + " ago"
	}
	fmt.Fprintf(w, "\nRollout (%s%s):\n", r.Kind, started)
	switch r.Kind {
	case topologyv1.RolloutKindTopology:
		if r.FromEpoch != nil {
			fmt.Fprintf(w, "  from %s\n", EpochLine(r.FromEpoch))
		}
		steps := Steps(t)
		if r.Step == topologyv1.StepAbort {
			steps = []string{topologyv1.StepAbort}
		}
		cur := slices.Index(steps, r.Step)
		for i, s := range steps {
			mark, note := "[ ]", ""
			switch {
			case i < cur:
				mark = "[x]"
			case i == cur:
				mark, note = "[>]", r.Message
			}
			if s == topologyv1.StepClaim && r.UnitsToMove > 0 && i <= cur {
				note = strings.TrimSpace(fmt.Sprintf("%d/%d moved units held by their new owner. %s", r.UnitsMoved, r.UnitsToMove, note))
			}
			fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %s %-9s %s", mark, s, note), " "))
		}
	case topologyv1.RolloutKindPods:
		fmt.Fprintf(w, "  %d/%d pods done, highest ordinal first\n", r.PodsDone, r.PodsTotal)
		for _, p := range r.Pods {
			mark := "[ ]"
			switch p.Step {
			case topologyv1.PodStepDone:
				mark = "[x]"
			case topologyv1.PodStepHandingOver, topologyv1.PodStepDeleting, topologyv1.PodStepRejoining:
				mark = "[>]"
			}
			detail := p.Step
			if p.Holds > 0 {
				detail += fmt.Sprintf(", holds %d units", p.Holds)
			}
			if p.Since != nil && mark == "[>]" {
				detail += ", for " + Age(p.Since.Time, now)
			}
			fmt.Fprintf(w, "  %s %-20s %s\n", mark, p.Name, detail)
		}
		if r.Message != "" {
			fmt.Fprintf(w, "  now: %s\n", r.Message)
		}
	default:
		fmt.Fprintf(w, "  step %s: %s\n", r.Step, r.Message)
	}
}

// Steps are the steps a topology change of t goes through: Approve only
// under manual approval.
func Steps(t *topologyv1.ShardTopology) []string {
	if t.Spec.Rollout.Approval == topologyv1.ApprovalManual {
		return topologyv1.TopologySteps
	}
	return slices.DeleteFunc(slices.Clone(topologyv1.TopologySteps), func(s string) bool { return s == topologyv1.StepApprove })
}

// EpochLine renders an epoch for people.
func EpochLine(e *topologyv1.TopologyEpoch) string {
	if e == nil {
		return "-"
	}
	return fmt.Sprintf("epoch %d, %dx%d (%d units)", e.Number, e.Partitions, e.ShardsPerPartition, int(e.Partitions)*int(e.ShardsPerPartition))
}

// CensusLine summarises the last census.
func CensusLine(c *topologyv1.CensusStatus, now time.Time) string {
	if c == nil || c.ObservedAt == nil {
		return "not taken yet"
	}
	below := "none below the floor"
	if len(c.BelowFloor) > 0 {
		below = "below the floor: " + strings.Join(c.BelowFloor, ", ")
	}
	return fmt.Sprintf("%d servers, lowest %s, %s (taken %s ago)", c.ServerCount, c.MinVersion, below, Age(c.ObservedAt.Time, now))
}

// LastRolloutLine summarises the rollout that finished last.
func LastRolloutLine(l *topologyv1.LastRolloutStatus, now time.Time) string {
	var span string
	switch {
	case l.From != "" && l.To != "":
		span = " " + l.From + " -> " + l.To
	case l.To != "":
		span = " to " + l.To
	}
	took := ""
	if l.Duration != nil {
		took = " in " + l.Duration.Duration.String()
	}
	return fmt.Sprintf("%s%s %s%s, finished %s ago", l.Kind, span, l.Result, took, Age(timeOf(l.FinishedAt), now))
}

func approvalOf(t *topologyv1.ShardTopology) string {
	if t.Spec.Rollout.Approval == "" {
		return string(topologyv1.ApprovalAutomatic)
	}
	return string(t.Spec.Rollout.Approval)
}

// Notes lists what holds the topology: pause, abort, deletion.
func Notes(t *topologyv1.ShardTopology) string {
	var notes []string
	if t.IsPaused() {
		notes = append(notes, "paused")
	}
	if t.IsAbortRequested() {
		notes = append(notes, "abort requested")
	}
	if !t.DeletionTimestamp.IsZero() {
		notes = append(notes, "being deleted")
	}
	if len(notes) == 0 {
		return ""
	}
	return ", " + strings.Join(notes, ", ")
}

// eventsAbout keeps the latest n Events about t, oldest first.
func eventsAbout(all []eventsv1.Event, t *topologyv1.ShardTopology, n int) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range all {
		if e.Regarding.Kind == "ShardTopology" && e.Regarding.Name == t.Name && (e.Regarding.UID == "" || e.Regarding.UID == t.UID) {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

func eventTime(e eventsv1.Event) time.Time {
	if e.Series != nil {
		return e.Series.LastObservedTime.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// listRows are the rows of a list of topologies, kubectl get's columns
// (the CRD's printer columns) with REASON under -o wide.
func listRows(items []topologyv1.ShardTopology, allNamespaces, wide bool, now time.Time) ([]string, [][]string) {
	header := []string{"name", "partitions", "shards", "epoch", "phase", "ready", "progress", "age"}
	if allNamespaces {
		header = append([]string{"namespace"}, header...)
	}
	if wide {
		header = append(header, "reason")
	}
	var rows [][]string
	for _, t := range items {
		epoch, ready, reason := "", "", ""
		if e := t.Status.ActiveEpoch; e != nil {
			epoch = fmt.Sprint(e.Number)
		}
		if c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionReady); c != nil {
			ready, reason = string(c.Status), c.Reason
		}
		row := []string{t.Name, fmt.Sprint(t.Spec.Partitions), fmt.Sprint(t.Spec.ShardsPerPartition), epoch, string(t.Status.Phase), ready, t.Status.Progress,
			Age(t.CreationTimestamp.Time, now)}
		if allNamespaces {
			row = append([]string{t.Namespace}, row...)
		}
		if wide {
			row = append(row, reason)
		}
		rows = append(rows, row)
	}
	return header, rows
}

// Age renders how long ago t was, the way kubectl does (5s, 3m, 2h, 4d).
func Age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printOrderBarrier shows the order barrier of the latest PerKey change of
// V or N: the new units holding moved keys' rows, the old units they wait
// for, how far those were seen draining, and, for a change of N, the
// publishers the switches wait for.
func printOrderBarrier(w io.Writer, b *topologyv1.OrderBarrierStatus, now time.Time) {
	if b == nil {
		return
	}
	checked := "not read this time"
	if b.CheckedAt != nil {
		checked = "checked " + Age(b.CheckedAt.Time, now) + " ago"
	}
	shape := fmt.Sprintf("%d -> %d shards", b.FromShards, b.ToShards)
	if b.FromPartitions != 0 {
		shape = fmt.Sprintf("%d -> %d partitions", b.FromPartitions, b.ToPartitions)
	}
	if b.UnitsWaiting == 0 {
		fmt.Fprintf(w, "Order:     barrier of epoch %d (%s) lifted: all %d old units drained to the switch\n",
			b.Epoch, shape, b.Predecessors)
		return
	}
	fmt.Fprintf(w, "Order:     barrier of epoch %d (%s): %d new units hold moved keys' rows; %d/%d old units drained, %d/%d switches recorded (%s)\n",
		b.Epoch, shape, b.UnitsWaiting, b.Lifted, b.Predecessors, b.Switched, b.Partitions, checked)
	if len(b.PublishersBehind) > 0 {
		fmt.Fprintf(w, "           switches wait for publishers on an older epoch: %s\n", strings.Join(b.PublishersBehind, ", "))
	}
	for _, wt := range b.Waiting {
		fmt.Fprintf(w, "           %-8s waits for %s\n", wt.Unit, strings.Join(wt.For, ", "))
	}
	if n := int(b.UnitsWaiting) - len(b.Waiting); n > 0 {
		fmt.Fprintf(w, "           and %d more\n", n)
	}
	for _, d := range b.Draining {
		sw := "switch not recorded"
		if d.SwitchSeq != nil {
			sw = fmt.Sprintf("switch at %d", *d.SwitchSeq)
		}
		line := fmt.Sprintf("           %-8s draining: ack floor %d, %s, %d pending, %d unacknowledged", d.Unit, d.AckFloor, sw, d.Pending, d.AckPending)
		if d.FirstOpen > 0 {
			line += fmt.Sprintf(", first open row %d", d.FirstOpen)
		}
		if d.Mark > 0 {
			line += fmt.Sprintf(", holder's mark %d", d.Mark)
		}
		fmt.Fprintln(w, line)
	}
	for _, u := range b.Unread {
		fmt.Fprintf(w, "           not read: %s\n", u)
	}
}
