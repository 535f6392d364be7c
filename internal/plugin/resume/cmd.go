// Package resume is "kubectl shardkeeper resume NAME": it removes the
// annotation topology.shardkeeper.dev/paused with a merge patch and
// refuses when the topology is not paused by it.
package resume

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// NewCmd returns the resume command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	return &cobra.Command{
		Use:               "resume NAME",
		Short:             "Let a paused ShardTopology's rollout go on (removes annotation " + topologyv1.PausedAnnotation + ")",
		Example:           "  kubectl shardkeeper resume ingest",
		Args:              plugin.ExactlyOneName,
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			return run(f, args[0])
		},
	}
}

func run(f *plugin.Factory, name string) error {
	return f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		_, annotated := t.Annotations[topologyv1.PausedAnnotation]
		switch {
		case !annotated && t.Spec.Rollout.Paused:
			// The spec belongs to whoever applies it (often GitOps): the
			// plugin does not edit it behind their back.
			return fmt.Errorf("shardtopology %s/%s is paused by spec.rollout.paused=true, which this command does not change; set spec.rollout.paused to false where the spec is kept",
				t.Namespace, t.Name)
		case !annotated:
			return fmt.Errorf("shardtopology %s/%s is not paused", t.Namespace, t.Name)
		}
		if err := plugin.PatchAnnotation(ctx, c, t, topologyv1.PausedAnnotation, nil); err != nil {
			return err
		}
		if t.Spec.Rollout.Paused {
			fmt.Fprintf(f.Out, "shardtopology %s/%s: annotation %s removed, but spec.rollout.paused=true still holds the rollout\n",
				t.Namespace, t.Name, topologyv1.PausedAnnotation)
			return nil
		}
		next := "the next step starts at the operator's next reconcile"
		if r := t.Status.Rollout; r == nil && t.Status.Plan == nil {
			next = "nothing is rolling; the next change or pod roll starts when it comes"
		}
		fmt.Fprintf(f.Out, "shardtopology %s/%s resumed: %s. Follow it with: kubectl shardkeeper status %s -w\n", t.Namespace, t.Name, next, t.Name)
		return nil
	})
}
