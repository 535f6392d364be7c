package approve

import (
	"strings"
	"testing"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

const hash = "0123456789abcdef"

func proposed(o *topologyv1.ShardTopology) {
	o.Spec.Rollout.Approval = topologyv1.ApprovalManual
	o.Spec.ShardsPerPartition = 8
	o.Status.Phase = topologyv1.PhaseAwaitingApproval
	o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4}
	o.Status.Plan = &topologyv1.PlanStatus{Hash: hash, State: topologyv1.PlanProposalReady,
		From: o.Status.ActiveEpoch, To: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 8},
		UnitsAdded: 8, UnitsMoved: 1, UnitsKept: 7,
		Pods: []topologyv1.PodPlan{{Name: "ingest-0", Before: 4, After: 8}, {Name: "ingest-1", Before: 4, After: 8}}}
}

func TestApproveSetsThePlanHashAndRefusesAStaleOne(t *testing.T) {
	tests := []struct {
		name       string
		topo       func(*topologyv1.ShardTopology)
		args       []string
		wantCode   int
		wantOut    string
		wantErr    string
		wantApprov string
	}{
		{"approves the current plan by its hash", proposed, nil, 0, "plan " + hash + " approved: epoch 1 (2x4) -> 2x8, 1 units move, 8 added, 0 removed over 2 pods", "", hash},
		{"approves the plan the person reviewed", proposed, []string{"--hash", hash}, 0, "approved", "", hash},
		{"refuses a plan that changed since it was read", proposed, []string{"--hash", "ffffffffffffffff"}, plugin.ExitError, "",
			"the plan changed since it was read: status.plan.hash is " + hash, ""},
		{"refuses a plan already approved", func(o *topologyv1.ShardTopology) {
			proposed(o)
			o.Annotations = map[string]string{topologyv1.ApproveAnnotation: hash}
		}, nil, plugin.ExitError, "", "already approved", hash},
		{"refuses under automatic approval", func(o *topologyv1.ShardTopology) { proposed(o); o.Spec.Rollout.Approval = topologyv1.ApprovalAutomatic },
			nil, plugin.ExitError, "", `approval "Automatic"`, ""},
		{"refuses when no plan waits", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Approval = topologyv1.ApprovalManual },
			nil, plugin.ExitError, "", "no plan waiting for approval", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, append([]string{"approve", "ingest", "-n", ns}, tt.args...)...)
			if r.Code() != tt.wantCode || !strings.Contains(r.Out, tt.wantOut) || (tt.wantErr != "" && !strings.Contains(r.Error.Error(), tt.wantErr)) {
				t.Fatalf("exit %d (%v), out %q; want exit %d, out with %q, error with %q", r.Code(), r.Error, r.Out, tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if got := env.Get(t, ns).Annotations[topologyv1.ApproveAnnotation]; got != tt.wantApprov {
				t.Fatalf("approve annotation %q, want %q", got, tt.wantApprov)
			}
		})
	}
}
