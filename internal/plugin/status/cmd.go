// Package status is "kubectl shardkeeper status [NAME] [-w]": a
// ShardTopology's phase, epochs, units, census, plan and rollout step by
// step from what the operator wrote in status, a list of topologies
// without NAME, and with --watch a live progress bar that exits 0 when the
// topology is Ready and ExitStalled when it is Stalled, for scripts.
package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

type options struct {
	f             *plugin.Factory
	out           *plugin.OutputFlags
	watch         bool
	timeout       time.Duration
	events        int
	allNamespaces bool
}

// NewCmd returns the status command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	o := &options{f: f}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show a ShardTopology's phase, plan and rollout step by step; --watch follows it until Ready or Stalled",
		Long: `Shows a ShardTopology as the operator reports it: phase, epochs, units,
census, the plan waiting for approval, the rollout step by step, the last
rollout, conditions and the latest Events. Without NAME it lists the
topologies of the namespace (-A: of every namespace).

With --watch it prints a progress bar of units moved and pods done at every
change and exits when the topology is Ready at its current generation (exit
0) or Stalled (exit 3), or after --timeout (exit 4).`,
		Example: `  kubectl shardkeeper status ingest
  kubectl shardkeeper status ingest -w --timeout 10m
  kubectl shardkeeper status -A -o wide`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return plugin.Usagef("at most one NAME, got %q", args)
			}
			return nil
		},
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args)
		},
	}
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "follow the topology until it is Ready (exit 0) or Stalled (exit 3)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 0, "with --watch, give up after this long (exit 4); 0 waits forever")
	cmd.Flags().IntVar(&o.events, "events", 10, "how many of the latest Events to show; 0 for none")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list the topologies of every namespace")
	o.out = f.AddOutputFlags(cmd)
	return cmd
}

func (o *options) run(ctx context.Context, args []string) error {
	switch {
	case o.events < 0:
		return plugin.Usagef("--events must not be negative, got %d", o.events)
	case o.timeout < 0:
		return plugin.Usagef("--timeout must not be negative, got %s", o.timeout)
	case o.watch && len(args) == 0:
		return plugin.Usagef("--watch follows one topology: give its NAME")
	case o.allNamespaces && len(args) == 1:
		return plugin.Usagef("-A lists topologies; it does not go with a NAME")
	}
	c, err := o.f.Client()
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return o.list(c)
	}
	if o.watch {
		return o.follow(ctx, c, args[0])
	}
	rctx, cancel := o.f.Context()
	defer cancel()
	t, err := o.f.Get(rctx, c, args[0])
	if err != nil {
		return err
	}
	if !o.out.Human() {
		return o.out.Print(o.f.Out, t)
	}
	var evs []eventsv1.Event
	if o.events > 0 {
		var list eventsv1.EventList
		// Events are best effort: a user may read topologies but not events.
		if err := c.List(rctx, &list, client.InNamespace(t.Namespace)); err == nil {
			evs = eventsAbout(list.Items, t, o.events)
		}
	}
	return Print(o.f.Out, t, evs, o.f.Clock())
}

// list prints the topologies of the namespace, or of all with -A.
func (o *options) list(c client.Client) error {
	ctx, cancel := o.f.Context()
	defer cancel()
	var opts []client.ListOption
	if !o.allNamespaces {
		ns, err := o.f.Namespace()
		if err != nil {
			return err
		}
		opts = append(opts, client.InNamespace(ns))
	}
	var list topologyv1.ShardTopologyList
	if err := c.List(ctx, &list, opts...); err != nil {
		return fmt.Errorf("list shardtopologies: %w", err)
	}
	if !o.out.Human() {
		list.SetGroupVersionKind(topologyv1.GroupVersion.WithKind("ShardTopologyList"))
		return o.out.Print(o.f.Out, &list)
	}
	if len(list.Items) == 0 {
		fmt.Fprintln(o.f.ErrOut, "No shardtopologies found.")
		return nil
	}
	header, rows := listRows(list.Items, o.allNamespaces, o.out.Wide(), o.f.Clock())
	return plugin.PrintTable(o.f.Out, header, rows)
}

// follow watches one topology and draws its progress until it is Ready
// or Stalled at its current generation, or the timeout passes. A watch
// the API server closes is opened again from the last resourceVersion.
func (o *options) follow(ctx context.Context, c client.WithWatch, name string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	t, err := o.f.Get(ctx, c, name)
	if err != nil {
		return err
	}
	bar := newProgress(o.f.Out, time.Now())
	bar.pending = func(t *topologyv1.ShardTopology) string { return podRollPending(ctx, c, t) }
	for {
		if done, err := bar.show(t); done {
			return err
		}
		w, err := c.Watch(ctx, &topologyv1.ShardTopologyList{}, client.InNamespace(t.Namespace),
			client.MatchingFields{"metadata.name": t.Name})
		if err != nil {
			return o.ended(ctx, fmt.Errorf("watch shardtopology %s/%s: %w", t.Namespace, t.Name, err))
		}
		t, err = o.consume(ctx, w, t, bar)
		w.Stop()
		var d doneErr
		if errors.As(err, &d) {
			return d.err
		}
		if err != nil {
			return err
		}
	}
}

// consume draws every change the watch brings until the topology is done
// (returned as an error or nil with done) or the watch closes (nil error,
// to open another).
func (o *options) consume(ctx context.Context, w watch.Interface, last *topologyv1.ShardTopology, bar *progress) (*topologyv1.ShardTopology, error) {
	// A pod roll the StatefulSet still waits for ends without a change of
	// the topology's status: look at the StatefulSet again now and then.
	tick := time.NewTicker(rollPoll)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if done, err := bar.show(last); done {
				return last, doneErr{err}
			}
		case <-ctx.Done():
			return last, o.ended(ctx, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return last, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return last, fmt.Errorf("shardtopology %s/%s was deleted", last.Namespace, last.Name)
			case watch.Error:
				return last, nil // expired or closed: watch again
			}
			t, ok := ev.Object.(*topologyv1.ShardTopology)
			if !ok {
				continue
			}
			last = t
			if done, err := bar.show(t); done {
				return t, doneErr{err}
			}
		}
	}
}

// doneErr carries the watch's verdict (nil for Ready) out of consume.
type doneErr struct{ err error }

func (d doneErr) Error() string {
	if d.err == nil {
		return "done"
	}
	return d.err.Error()
}

func (o *options) ended(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return plugin.WithCode(plugin.ExitTimeout, fmt.Errorf("not Ready within --timeout %s", o.timeout))
	}
	return err
}

// Verdict says whether a watch is over: nil error and true when t is
// Ready at its current generation, an ExitStalled error when Stalled.
func Verdict(t *topologyv1.ShardTopology) (bool, error) {
	if t.Status.ObservedGeneration != t.Generation {
		return false, nil
	}
	if c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionStalled); c != nil && c.Status == "True" {
		return true, plugin.WithCode(plugin.ExitStalled, fmt.Errorf("shardtopology %s/%s is Stalled (%s): %s", t.Namespace, t.Name, c.Reason, c.Message))
	}
	if meta.IsStatusConditionTrue(t.Status.Conditions, topologyv1.ConditionReady) {
		return true, nil
	}
	return false, nil
}

// progress draws one line per change: elapsed time, phase, step, a bar of
// units moved and one of pods done. On a terminal it redraws in place.
type progress struct {
	w     io.Writer
	start time.Time
	last  string
	tty   bool
	// pending says why a Ready topology is not done yet ("" when it is).
	pending func(*topologyv1.ShardTopology) string
}

// rollPoll is how often a watch that waits for a pod roll reads the
// StatefulSet again.
const rollPoll = 2 * time.Second

// podRollPending says why the workload's pods still wait for a roll, or
// "": after kubectl set image the topology stays Ready at an unchanged
// generation until the operator starts rolling, so Ready alone ended the
// watch at once. A pod roll is pending while the StatefulSet controller
// has not seen its latest generation, or fewer pods than its replicas run
// its update revision. Best effort: a person who may not read
// StatefulSets gets the verdict of status alone.
func podRollPending(ctx context.Context, c client.Reader, t *topologyv1.ShardTopology) string {
	name := t.Spec.Workload.StatefulSetName
	sts := &appsv1.StatefulSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: t.Namespace, Name: name}, sts); err != nil {
		return ""
	}
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	switch {
	case sts.Status.ObservedGeneration == 0:
		// No StatefulSet controller has reported on it (just created, or
		// none runs, as in tests): nothing to judge by.
		return ""
	case sts.Status.ObservedGeneration < sts.Generation:
		return fmt.Sprintf("StatefulSet %s changed (generation %d, its controller saw %d)", name, sts.Generation, sts.Status.ObservedGeneration)
	case sts.Status.UpdateRevision != "" && sts.Status.UpdatedReplicas < replicas:
		return fmt.Sprintf("StatefulSet %s has %d/%d pods at revision %s", name, sts.Status.UpdatedReplicas, replicas, sts.Status.UpdateRevision)
	}
	return ""
}

func newProgress(w io.Writer, start time.Time) *progress {
	p := &progress{w: w, start: start}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// show draws t if its line changed and reports whether the watch is over.
// Ready is not the end while pending says a pod roll waits.
func (p *progress) show(t *topologyv1.ShardTopology) (bool, error) {
	done, err := Verdict(t)
	line := ProgressLine(t)
	if done && err == nil && p.pending != nil {
		if why := p.pending(t); why != "" {
			done, line = false, line+"; waiting for a pod roll: "+why
		}
	}
	if line != p.last {
		elapsed := time.Since(p.start).Truncate(time.Second)
		if p.tty {
			fmt.Fprintf(p.w, "\r\033[K%6s  %s", elapsed, line)
		} else {
			fmt.Fprintf(p.w, "%6s  %s\n", elapsed, line)
		}
		p.last = line
	}
	if done {
		if p.tty {
			fmt.Fprintln(p.w)
		}
		return true, err
	}
	return false, nil
}

// ProgressLine is one line of the watch: phase, step, the bars and the
// operator's progress text.
func ProgressLine(t *topologyv1.ShardTopology) string {
	st := &t.Status
	step, moved, toMove, done, total := "-", int32(0), int32(0), int32(0), int32(0)
	if r := st.Rollout; r != nil {
		step = r.Step
		moved, toMove, done, total = r.UnitsMoved, r.UnitsToMove, r.PodsDone, r.PodsTotal
	}
	if p := st.Plan; p != nil && p.State == topologyv1.PlanProposalReady {
		step = topologyv1.StepApprove
	}
	line := fmt.Sprintf("%-16s %-9s units moved %s %3d/%-3d  pods done %s %2d/%-2d  %s",
		orDash(string(st.Phase)), step, Bar(moved, toMove, 20), moved, toMove, Bar(done, total, 10), done, total, strings.TrimSpace(st.Progress))
	// Once nothing rolls, say how the last rollout ended: a watch that
	// started mid-way ends on its record, not on empty bars alone.
	if l := st.LastRollout; st.Rollout == nil && l != nil {
		line += fmt.Sprintf("; last rollout: %s %s", l.Kind, l.Result)
		if l.Duration != nil {
			line += " in " + l.Duration.Duration.String()
		}
	}
	return line
}

// Bar draws n of total as a bar of width cells; an empty total is a bar
// of dots.
func Bar(n, total int32, width int) string {
	if total <= 0 {
		return "[" + strings.Repeat(".", width) + "]"
	}
	fill := int(int64(min(n, total)) * int64(width) / int64(total))
	return "[" + strings.Repeat("#", fill) + strings.Repeat("-", width-fill) + "]"
}
