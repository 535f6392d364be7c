// Package abort is "kubectl shardkeeper abort NAME": it sets the annotation
// topology.shardkeeper.dev/abort=true with a merge patch, so the operator
// retires a pending topology epoch and keeps the active one, says what
// will happen, and refuses when there is nothing to abort. --clear removes
// the annotation.
package abort

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// NewCmd returns the abort command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	var clear bool
	cmd := &cobra.Command{
		Use:   "abort NAME",
		Short: "Go back to the active epoch: retire a pending topology change (annotation " + topologyv1.AbortAnnotation + ")",
		Long: `Sets the annotation ` + topologyv1.AbortAnnotation + `=true. The operator retires the pending
epoch and keeps the active one; while the annotation is set no new epoch
starts and the topology is Stalled (RolloutAborted), until the spec goes
back to the active N and V or the annotation is removed (abort --clear).
A change that is already active cannot be aborted: change the spec back.`,
		Example: `  kubectl shardkeeper abort ingest
  kubectl shardkeeper abort ingest --clear`,
		Args:              plugin.ExactlyOneName,
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			return run(f, args[0], clear)
		},
	}
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the abort annotation instead of setting it")
	return cmd
}

func run(f *plugin.Factory, name string, clear bool) error {
	return f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		if clear {
			if _, ok := t.Annotations[topologyv1.AbortAnnotation]; !ok {
				return fmt.Errorf("shardtopology %s/%s has no abort annotation to clear", t.Namespace, t.Name)
			}
			if err := plugin.PatchAnnotation(ctx, c, t, topologyv1.AbortAnnotation, nil); err != nil {
				return err
			}
			fmt.Fprintf(f.Out, "shardtopology %s/%s: abort cleared; a spec that differs from the active epoch (%s) rolls out again\n",
				t.Namespace, t.Name, activeShape(t))
			return nil
		}
		if t.IsAbortRequested() {
			return fmt.Errorf("shardtopology %s/%s is already aborting (annotation %s=true)", t.Namespace, t.Name, topologyv1.AbortAnnotation)
		}
		what, err := whatHappens(t)
		if err != nil {
			return err
		}
		v := "true"
		// What abort does depends on status: should the operator's status
		// writes that moved the resourceVersion also have activated the
		// change, abort is refused as when read.
		recheck := func(fresh *topologyv1.ShardTopology) error { _, err := whatHappens(fresh); return err }
		if err := plugin.PatchAnnotation(ctx, c, t, topologyv1.AbortAnnotation, &v, recheck); err != nil {
			return err
		}
		fmt.Fprintf(f.Out, "shardtopology %s/%s: abort requested: %s The topology stays Stalled (RolloutAborted) until spec is %s again or: kubectl shardkeeper abort %s --clear\n",
			t.Namespace, t.Name, what, activeShape(t), t.Name)
		return nil
	})
}

// whatHappens says what the abort will do, or why there is nothing to
// abort.
func whatHappens(t *topologyv1.ShardTopology) (string, error) {
	st := &t.Status
	a := st.ActiveEpoch
	switch {
	case st.TargetEpoch != nil:
		return fmt.Sprintf("pending epoch %d (%dx%d) will be retired, its new consumers deleted once empty; epoch %s stays active.",
			st.TargetEpoch.Number, st.TargetEpoch.Partitions, st.TargetEpoch.ShardsPerPartition, activeShape(t)), nil
	case a == nil:
		return "", fmt.Errorf("shardtopology %s/%s has no active epoch yet, so there is nothing to go back to", t.Namespace, t.Name)
	case a.Partitions != t.Spec.Partitions || a.ShardsPerPartition != t.Spec.ShardsPerPartition:
		return fmt.Sprintf("the change to %dx%d will not start; epoch %s stays active.", t.Spec.Partitions, t.Spec.ShardsPerPartition, activeShape(t)), nil
	case st.Rollout != nil && st.Rollout.Kind == topologyv1.RolloutKindTopology:
		return "", fmt.Errorf("shardtopology %s/%s: epoch %s is already active (step %s); abort only retires a pending epoch: set the spec back to go back",
			t.Namespace, t.Name, activeShape(t), st.Rollout.Step)
	}
	return "", fmt.Errorf("shardtopology %s/%s has no topology change to abort: the spec matches the active epoch %s", t.Namespace, t.Name, activeShape(t))
}

func activeShape(t *topologyv1.ShardTopology) string {
	a := t.Status.ActiveEpoch
	if a == nil {
		return "(none)"
	}
	return fmt.Sprintf("%d (%dx%d)", a.Number, a.Partitions, a.ShardsPerPartition)
}
