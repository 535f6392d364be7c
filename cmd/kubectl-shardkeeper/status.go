package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// statusFlags are the flags of "status".
type statusFlags struct {
	name       string
	namespace  string
	kubeconfig string
	context    string
	events     int
	format     string
}

// runStatus prints one ShardTopology's phase, epochs, units, census,
// conditions and rollout step by step, with its latest Events, from what
// the operator wrote in status.
func runStatus(args []string) error {
	f, err := parseStatusFlags(args)
	if err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	ns := f.namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return fmt.Errorf("namespace from kubeconfig: %w", err)
		}
	}
	scheme := runtime.NewScheme()
	if err := topologyv1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := eventsv1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connect to the API server: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t := &topologyv1.ShardTopology{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: f.name}, t); err != nil {
		return fmt.Errorf("get shardtopology %s/%s: %w", ns, f.name, err)
	}
	if f.format == formatJSON {
		return printJSON(stdout, t)
	}
	var evs []eventsv1.Event
	if f.events > 0 {
		var list eventsv1.EventList
		// Events are best effort: a user may read topologies but not events.
		if err := c.List(ctx, &list, client.InNamespace(ns)); err == nil {
			evs = eventsAbout(list.Items, t, f.events)
		}
	}
	return printStatus(stdout, t, evs, time.Now())
}

func parseStatusFlags(args []string) (statusFlags, error) {
	var f statusFlags
	fs := newFlagSet("status")
	fs.StringVar(&f.namespace, "n", "", "namespace (default: the kubeconfig context's)")
	fs.StringVar(&f.namespace, "namespace", "", "namespace (default: the kubeconfig context's)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "kubeconfig context (default: the current one)")
	fs.IntVar(&f.events, "events", 10, "how many of the latest Events to show; 0 for none")
	format := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kubectl shardkeeper status NAME [-n NAMESPACE] [--kubeconfig FILE] [-o json]\n\n"+
			"Shows a ShardTopology's phase, epochs, units, census, conditions and the rollout step by step.\n\n")
		fs.PrintDefaults()
	}
	// The name may come before or after the flags.
	var names []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return f, err
			}
			return f, fmt.Errorf("%w: %w", errUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		names = append(names, fs.Arg(0))
		args = fs.Args()[1:]
	}
	f.format = *format
	switch {
	case len(names) == 0:
		return f, fmt.Errorf("%w: the ShardTopology's NAME is required", errUsage)
	case len(names) > 1:
		return f, fmt.Errorf("%w: one NAME, got %q", errUsage, names)
	case f.events < 0:
		return f, fmt.Errorf("%w: --events must not be negative", errUsage)
	}
	f.name = names[0]
	return f, checkFormat(f.format)
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

// printStatus writes the topology as a person reads it: a summary, the
// rollout step by step, the conditions and the latest Events.
func printStatus(w io.Writer, t *topologyv1.ShardTopology, evs []eventsv1.Event, now time.Time) error {
	st := &t.Status
	fmt.Fprintf(w, "ShardTopology %s/%s  generation %d (observed %d)\n", t.Namespace, t.Name, t.Generation, st.ObservedGeneration)
	fmt.Fprintf(w, "Phase:     %s\n", orDash(string(st.Phase)))
	fmt.Fprintf(w, "Progress:  %s\n", orDash(st.Progress))
	fmt.Fprintf(w, "Spec:      %dx%d (%d units)%s\n", t.Spec.Partitions, t.Spec.ShardsPerPartition, t.Spec.Units(), pausedNote(t))
	fmt.Fprintf(w, "Active:    %s\n", epochLine(st.ActiveEpoch))
	if st.TargetEpoch != nil {
		fmt.Fprintf(w, "Target:    %s\n", epochLine(st.TargetEpoch))
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
	fmt.Fprintf(w, "Census:    %s\n", censusLine(st.Census, now))
	if err := printRollout(w, st.Rollout, now); err != nil {
		return err
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(st.Conditions))
	for _, c := range st.Conditions {
		rows = append(rows, []string{c.Type, string(c.Status), c.Reason, age(c.LastTransitionTime.Time, now), c.Message})
	}
	if err := printTable(w, []string{"condition", "status", "reason", "age", "message"}, rows); err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows = rows[:0]
	for _, e := range evs {
		rows = append(rows, []string{age(eventTime(e), now), e.Type, e.Reason, e.Note})
	}
	return printTable(w, []string{"last seen", "type", "reason", "event"}, rows)
}

// printRollout lists the rollout's steps with a mark each: [x] done, [>]
// in progress, [ ] to come.
func printRollout(w io.Writer, r *topologyv1.RolloutStatus, now time.Time) error {
	if r == nil {
		fmt.Fprintln(w, "Rollout:   none in progress")
		return nil
	}
	started := ""
	if r.StartedAt != nil {
		started = ", started " + age(r.StartedAt.Time, now) + " ago"
	}
	fmt.Fprintf(w, "\nRollout (%s%s):\n", r.Kind, started)
	switch r.Kind {
	case topologyv1.RolloutKindTopology:
		if r.FromEpoch != nil {
			fmt.Fprintf(w, "  from %s\n", epochLine(r.FromEpoch))
		}
		steps := topologyv1.TopologySteps
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
				detail += ", for " + age(p.Since.Time, now)
			}
			fmt.Fprintf(w, "  %s %-20s %s\n", mark, p.Name, detail)
		}
		if r.Message != "" {
			fmt.Fprintf(w, "  now: %s\n", r.Message)
		}
	default:
		fmt.Fprintf(w, "  step %s: %s\n", r.Step, r.Message)
	}
	return nil
}

func epochLine(e *topologyv1.TopologyEpoch) string {
	if e == nil {
		return "-"
	}
	return fmt.Sprintf("epoch %d, %dx%d (%d units)", e.Number, e.Partitions, e.ShardsPerPartition, int(e.Partitions)*int(e.ShardsPerPartition))
}

func censusLine(c *topologyv1.CensusStatus, now time.Time) string {
	if c == nil || c.ObservedAt == nil {
		return "not taken yet"
	}
	below := "none below the floor"
	if len(c.BelowFloor) > 0 {
		below = "below the floor: " + strings.Join(c.BelowFloor, ", ")
	}
	return fmt.Sprintf("%d servers, lowest %s, %s (taken %s ago)", c.Servers, c.MinVersion, below, age(c.ObservedAt.Time, now))
}

func pausedNote(t *topologyv1.ShardTopology) string {
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

// age renders how long ago t was, the way kubectl does (5s, 3m, 2h, 4d).
func age(t, now time.Time) string {
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
