// Package approve is "kubectl shardkeeper approve NAME": under
// spec.rollout.approval: Manual it sets the annotation
// topology.shardkeeper.dev/approve to the hash of the plan in status.plan,
// with a merge patch carrying the resourceVersion it read. --hash names the
// plan the person reviewed (kubectl shardkeeper plan NAME prints it); when
// the plan changed since, the command refuses, and the operator itself
// refuses an annotation that names another plan.
package approve

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
)

// NewCmd returns the approve command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	var hash string
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Approve the plan a ShardTopology proposes (spec.rollout.approval: Manual)",
		Example: `  kubectl shardkeeper plan ingest          # review the plan and its hash
  kubectl shardkeeper approve ingest --hash 3f2a9c0d1e4b5a69`,
		Args:              plugin.ExactlyOneName,
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			return run(f, args[0], hash)
		},
	}
	cmd.Flags().StringVar(&hash, "hash", "", "the plan hash you reviewed; refused if the plan changed since (default: the current plan's)")
	return cmd
}

func run(f *plugin.Factory, name, hash string) error {
	return f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		p := t.Status.Plan
		switch {
		case t.Spec.Rollout.Approval != topologyv1.ApprovalManual:
			return fmt.Errorf("shardtopology %s/%s has spec.rollout.approval %q: its changes roll out without approval", t.Namespace, t.Name, approvalOf(t))
		case p == nil || p.State != topologyv1.PlanProposalReady:
			return fmt.Errorf("shardtopology %s/%s has no plan waiting for approval (phase %s)", t.Namespace, t.Name, t.Status.Phase)
		case hash != "" && hash != p.Hash:
			return fmt.Errorf("the plan changed since it was read: status.plan.hash is %s, not %s; review it again with kubectl shardkeeper plan %s",
				p.Hash, hash, t.Name)
		case t.Annotations[topologyv1.ApproveAnnotation] == p.Hash:
			return fmt.Errorf("plan %s of shardtopology %s/%s is already approved; the operator starts it at its next reconcile", p.Hash, t.Namespace, t.Name)
		}
		v := p.Hash
		// Approve the plan that was read, or nothing: a status write that
		// moved the resourceVersion may also have brought a new plan.
		recheck := func(fresh *topologyv1.ShardTopology) error {
			if fp := fresh.Status.Plan; fp == nil || fp.Hash != v || fp.State != topologyv1.PlanProposalReady {
				return fmt.Errorf("the plan changed while approving: status.plan is now %s, not %s; review it again with kubectl shardkeeper plan %s", planText(fp), v, t.Name)
			}
			return nil
		}
		if err := plugin.PatchAnnotation(ctx, c, t, topologyv1.ApproveAnnotation, &v, recheck); err != nil {
			return err
		}
		est := "unknown"
		if p.EstimatedDuration != nil {
			est = p.EstimatedDuration.Duration.String()
		}
		fmt.Fprintf(f.Out, "shardtopology %s/%s: plan %s approved: %s -> %s, %d units move, %d added, %d removed over %d pods, about %s before Retire.\nFollow it with: kubectl shardkeeper status %s -w\n",
			t.Namespace, t.Name, p.Hash, fromShape(p), p.To, p.UnitsMoved, p.UnitsAdded, p.UnitsRemoved, len(p.Pods), est, t.Name)
		return nil
	})
}

func approvalOf(t *topologyv1.ShardTopology) topologyv1.ApprovalPolicy {
	if t.Spec.Rollout.Approval == "" {
		return topologyv1.ApprovalAutomatic
	}
	return t.Spec.Rollout.Approval
}

func fromShape(p *topologyv1.PlanStatus) string {
	if p.From == nil {
		return "-"
	}
	return fmt.Sprintf("epoch %d (%dx%d)", p.From.Number, p.From.Partitions, p.From.ShardsPerPartition)
}

func planText(p *topologyv1.PlanStatus) string {
	if p == nil {
		return "gone"
	}
	return fmt.Sprintf("%s (%s)", p.Hash, p.State)
}
