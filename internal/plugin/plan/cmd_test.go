package plan

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

func proposed(o *topologyv1.ShardTopology) {
	o.Spec.Rollout.Approval = topologyv1.ApprovalManual
	o.Spec.ShardsPerPartition = 8
	o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4}
	o.Status.Plan = &topologyv1.PlanStatus{Hash: "0123456789abcdef", State: topologyv1.PlanProposalReady,
		From: o.Status.ActiveEpoch, To: topologyv1.TopologyShape{Partitions: 2, ShardsPerPartition: 8},
		UnitsAdded: 8, UnitsMoved: 1, UnitsKept: 7, EstimatedDuration: &metav1.Duration{Duration: 41e9},
		Pods: []topologyv1.PodPlan{{Name: "ingest-0", Before: 4, After: 8, MovedIn: 1, Added: 3}, {Name: "ingest-1", Before: 4, After: 8, MovedOut: 1, Added: 5}}}
}

// NAME reads the plan the operator published, per pod, with the hash
// approve needs; without one it says why.
func TestPlanOfATopologyIsWhatTheOperatorPublished(t *testing.T) {
	tests := []struct {
		name     string
		topo     func(*topologyv1.ShardTopology)
		args     []string
		wantCode int
		want     []string
	}{
		{"a proposed plan, per pod, with the approve command", proposed, nil, 0, []string{
			"Plan 0123456789abcdef (ProposalReady)",
			"Change epoch 1 (2x4) -> 2x8: 7 units stay put, 1 move, 8 added, 0 removed; about 41s before Retire.",
			"ingest-0   4        8       1          0           3       0",
			"total      8        16      1          1           8       0",
			"1. Approve", "5. HandOver", "6. Claim",
			"Approve it with: kubectl shardkeeper approve ingest --hash 0123456789abcdef",
		}},
		{"-o json is status.plan", proposed, []string{"-o", "json"}, 0, []string{`"hash": "0123456789abcdef"`, `"unitsMoved": 1`}},
		{"no change wanted says so", func(o *topologyv1.ShardTopology) {
			o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 3, Partitions: 2, ShardsPerPartition: 4}
		}, nil, 0, []string{"No change: the spec (2x4) is the active epoch 3."}},
		{"NAME and --from together are a usage error", proposed, []string{"--from", "4x8"}, plugin.ExitUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, append([]string{"plan", "ingest", "-n", ns}, tt.args...)...)
			if r.Code() != tt.wantCode {
				t.Fatalf("exit %d (%v), want %d\n%s", r.Code(), r.Error, tt.wantCode, r.Out)
			}
			for _, want := range tt.want {
				if !strings.Contains(r.Out, want) {
					t.Errorf("output lacks %q:\n%s", want, r.Out)
				}
			}
		})
	}
}

func TestOfflinePlanIsArithmeticOverThePlacement(t *testing.T) {
	r := env.Run(NewCmd, "plan", "--from", "4x8", "--to", "4x16", "--members", "4")
	if r.Error != nil {
		t.Fatal(r.Error)
	}
	for _, want := range []string{
		"Change 4x8 -> 4x16 (epoch 1 -> 2) over 4 members: 32 units kept (29 stay put, 3 move), 32 added, 0 removed.",
		"worker-3", "total      32       64",
		"2. Freeze", "4. HandOver", "3 units: 1.3 worker-1->worker-0", "6. Retire",
	} {
		if !strings.Contains(r.Out, want) {
			t.Errorf("output lacks %q:\n%s", want, r.Out)
		}
	}
	r = env.Run(NewCmd, "plan", "--from", "2x4", "--to", "2x2", "--members", "3", "-o", "json")
	var p ownership.Plan
	if err := json.Unmarshal([]byte(r.Out), &p); err != nil {
		t.Fatalf("decode: %v\n%s", err, r.Out)
	}
	if p.Kind != ownership.KindTopologyChange || len(p.Steps) != 5 || p.Totals().Retired != 4 {
		t.Fatalf("plan %+v", p)
	}
	for _, args := range [][]string{
		{"plan"},
		{"plan", "--from", "4x8", "--members", "2"},
		{"plan", "--from", "4", "--to", "4x8", "--members", "2"},
		{"plan", "--from", "4x8", "--to", "4x16", "--members", "2", "-o", "xml"},
	} {
		if r := env.Run(NewCmd, args...); r.Code() != plugin.ExitUsage {
			t.Errorf("%q: exit %d (%v), want a usage error", args, r.Code(), r.Error)
		}
	}
	if r := env.Run(NewCmd, "plan", "--from", "4096x4", "--to", "4x4", "--members", "2"); r.Code() != plugin.ExitError {
		t.Errorf("a topology over the limits: exit %d (%v), want 1", r.Code(), r.Error)
	}
}
