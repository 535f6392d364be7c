package resume

import (
	"strings"
	"testing"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

func TestResumeRemovesTheAnnotationAndRefusesNoOps(t *testing.T) {
	paused := func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.PausedAnnotation: "true"}
	}
	tests := []struct {
		name          string
		topo          func(*topologyv1.ShardTopology)
		wantCode      int
		wantOut       string
		wantErr       string
		wantAnnotated bool
	}{
		{"resumes a topology the annotation pauses", func(o *topologyv1.ShardTopology) {
			paused(o)
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepActivate}
		}, 0, "resumed: the next step starts", "", false},
		{"says the spec still holds it when both pause", func(o *topologyv1.ShardTopology) { paused(o); o.Spec.Rollout.Paused = true },
			0, "spec.rollout.paused=true still holds the rollout", "", false},
		{"refuses a topology that is not paused", nil, plugin.ExitError, "", "is not paused", false},
		{"refuses to edit a pause the spec sets", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = true },
			plugin.ExitError, "", "which this command does not change", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, "resume", "ingest", "-n", ns)
			if r.Code() != tt.wantCode || !strings.Contains(r.Out, tt.wantOut) || (tt.wantErr != "" && !strings.Contains(r.Error.Error(), tt.wantErr)) {
				t.Fatalf("exit %d (%v), out %q; want exit %d, out with %q, error with %q", r.Code(), r.Error, r.Out, tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if _, got := env.Get(t, ns).Annotations[topologyv1.PausedAnnotation]; got != tt.wantAnnotated {
				t.Fatalf("paused annotation present %t, want %t", got, tt.wantAnnotated)
			}
		})
	}
}
