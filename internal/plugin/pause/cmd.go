// Package pause is "kubectl shardkeeper pause NAME": it sets the annotation
// topology.shardkeeper.dev/paused=true with a merge patch, says what will
// happen, and refuses to pause a topology that is already paused.
package pause

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// NewCmd returns the pause command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	return &cobra.Command{
		Use:               "pause NAME",
		Short:             "Hold a ShardTopology's rollout before its next step (annotation " + topologyv1.PausedAnnotation + ")",
		Example:           "  kubectl shardkeeper pause ingest",
		Args:              plugin.ExactlyOneName,
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			return run(f, args[0])
		},
	}
}

func run(f *plugin.Factory, name string) error {
	return f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		switch {
		case t.Annotations[topologyv1.PausedAnnotation] == "true":
			return fmt.Errorf("shardtopology %s/%s is already paused (annotation %s=true); resume it with kubectl shardkeeper resume %s",
				t.Namespace, t.Name, topologyv1.PausedAnnotation, t.Name)
		case t.Spec.Rollout.Paused:
			return fmt.Errorf("shardtopology %s/%s is already paused by spec.rollout.paused=true", t.Namespace, t.Name)
		}
		v := "true"
		if err := plugin.PatchAnnotation(ctx, c, t, topologyv1.PausedAnnotation, &v); err != nil {
			return err
		}
		fmt.Fprintf(f.Out, "shardtopology %s/%s paused: %s Units keep flowing. Resume with: kubectl shardkeeper resume %s\n",
			t.Namespace, t.Name, whatHappens(t), t.Name)
		return nil
	})
}

// whatHappens says what pause holds, from the rollout in status.
func whatHappens(t *topologyv1.ShardTopology) string {
	r := t.Status.Rollout
	switch {
	case r != nil && (r.Step == topologyv1.StepFreeze || r.Step == topologyv1.StepActivate):
		// The operator never holds a freeze: claims are frozen while it lasts.
		return "the freeze in progress is finished (the new epoch activates once every live worker acknowledged it); the steps after it wait."
	case r != nil && r.Kind == topologyv1.RolloutKindPods:
		return fmt.Sprintf("the pod roll (%d/%d pods done) finishes the pod in flight and starts no other.", r.PodsDone, r.PodsTotal)
	case r != nil:
		return fmt.Sprintf("the %s step in progress finishes; the next step waits.", r.Step)
	case t.Status.Plan != nil:
		return fmt.Sprintf("the change to %s waits before its first step.", t.Status.Plan.To)
	}
	return "nothing is rolling now; the next change or pod roll waits before its first step."
}
