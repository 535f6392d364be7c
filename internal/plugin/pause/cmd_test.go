package pause

import (
	"strings"
	"testing"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

func TestPauseSetsTheAnnotationAndRefusesNoOps(t *testing.T) {
	tests := []struct {
		name       string
		topo       func(*topologyv1.ShardTopology)
		args       []string
		wantCode   int
		wantOut    string
		wantErr    string
		wantPaused bool
	}{
		{"pauses a rollout and says the step in progress finishes", func(o *topologyv1.ShardTopology) {
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepRetire}
		}, []string{"ingest"}, 0, "the Retire step in progress finishes; the next step waits", "", true},
		{"pauses during a freeze and says the freeze is finished, not held", func(o *topologyv1.ShardTopology) {
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepFreeze}
		}, []string{"ingest"}, 0, "the freeze in progress is finished", "", true},
		{"pauses an idle topology and says the next change waits", nil, []string{"ingest"}, 0, "nothing is rolling now", "", true},
		{"refuses a topology the annotation already pauses", func(o *topologyv1.ShardTopology) {
			o.Annotations = map[string]string{topologyv1.PausedAnnotation: "true"}
		}, []string{"ingest"}, plugin.ExitError, "", "already paused (annotation", true},
		{"refuses a topology the spec already pauses", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = true },
			[]string{"ingest"}, plugin.ExitError, "", "already paused by spec.rollout.paused", false},
		{"names a missing topology", nil, []string{"nope"}, plugin.ExitError, "", "not found", false},
		{"wants a name", nil, nil, plugin.ExitUsage, "", "want one ShardTopology NAME", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, append([]string{"pause", "-n", ns}, tt.args...)...)
			if r.Code() != tt.wantCode || !strings.Contains(r.Out, tt.wantOut) || (tt.wantErr != "" && !strings.Contains(r.Error.Error(), tt.wantErr)) {
				t.Fatalf("exit %d (%v), out %q; want exit %d, out with %q, error with %q", r.Code(), r.Error, r.Out, tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if got := env.Get(t, ns).Annotations[topologyv1.PausedAnnotation] == "true"; got != tt.wantPaused {
				t.Fatalf("paused annotation set %t, want %t", got, tt.wantPaused)
			}
		})
	}
}
