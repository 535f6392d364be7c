package abort

import (
	"strings"
	"testing"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

func TestAbortSetsOrClearsTheAnnotationAndRefusesNoOps(t *testing.T) {
	active := func(o *topologyv1.ShardTopology) {
		o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4}
	}
	pending := func(o *topologyv1.ShardTopology) {
		active(o)
		o.Spec.ShardsPerPartition = 8
		o.Status.TargetEpoch = &topologyv1.TopologyEpoch{Number: 2, Partitions: 2, ShardsPerPartition: 8}
		o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepFreeze}
	}
	tests := []struct {
		name        string
		topo        func(*topologyv1.ShardTopology)
		args        []string
		wantCode    int
		wantOut     string
		wantErr     string
		wantAborted bool
	}{
		{"aborts a pending epoch and says the active one stays", pending, nil, 0,
			"pending epoch 2 (2x8) will be retired, its new consumers deleted once empty; epoch 1 (2x4) stays active", "", true},
		{"holds a change that has not started", func(o *topologyv1.ShardTopology) { active(o); o.Spec.Partitions = 4 }, nil, 0,
			"the change to 4x4 will not start", "", true},
		{"refuses when the spec is the active epoch", active, nil, plugin.ExitError, "", "has no topology change to abort", false},
		{"refuses a change already activated", func(o *topologyv1.ShardTopology) {
			active(o)
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepClaim}
		}, nil, plugin.ExitError, "", "already active (step Claim)", false},
		{"refuses a second abort", func(o *topologyv1.ShardTopology) {
			pending(o)
			o.Annotations = map[string]string{topologyv1.AbortAnnotation: "true"}
		}, nil, plugin.ExitError, "", "already aborting", true},
		{"clears an abort", func(o *topologyv1.ShardTopology) {
			pending(o)
			o.Annotations = map[string]string{topologyv1.AbortAnnotation: "true"}
		}, []string{"--clear"}, 0, "abort cleared", "", false},
		{"refuses to clear what is not set", pending, []string{"--clear"}, plugin.ExitError, "", "no abort annotation to clear", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, append([]string{"abort", "ingest", "-n", ns}, tt.args...)...)
			if r.Code() != tt.wantCode || !strings.Contains(r.Out, tt.wantOut) || (tt.wantErr != "" && !strings.Contains(r.Error.Error(), tt.wantErr)) {
				t.Fatalf("exit %d (%v), out %q; want exit %d, out with %q, error with %q", r.Code(), r.Error, r.Out, tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if got := env.Get(t, ns).IsAbortRequested(); got != tt.wantAborted {
				t.Fatalf("abort requested %t, want %t", got, tt.wantAborted)
			}
		})
	}
}
