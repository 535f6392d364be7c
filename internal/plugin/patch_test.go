package plugin_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

// The operator's status writes move the resourceVersion: abort right
// after resume failed with "the object has been modified" although
// nothing a person writes had changed. PatchAnnotation patches again
// then, and only then: a change to the spec, the annotations or the
// labels since the read is still a conflict, and so is a status change
// the verb's recheck refuses.
func TestPatchAnnotationRetriesWhenOnlyStatusMoved(t *testing.T) {
	tests := []struct {
		name      string
		meanwhile func(*topologyv1.ShardTopology)
		status    bool
		recheck   func(*topologyv1.ShardTopology) error
		wantErr   string
		wantSet   bool
	}{
		{"the operator wrote status", func(o *topologyv1.ShardTopology) { o.Status.Progress = "moved on" }, true, nil, "", true},
		{"someone changed the spec", func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 16 }, false, nil, "its spec changed", false},
		{"someone set another annotation", func(o *topologyv1.ShardTopology) {
			o.Annotations = map[string]string{topologyv1.PausedAnnotation: "true"}
		}, false, nil, "its annotations changed", false},
		{"status moved and the verb's recheck refuses it", func(o *topologyv1.ShardTopology) { o.Status.Progress = "activated" }, true,
			func(fresh *topologyv1.ShardTopology) error {
				if fresh.Status.Progress == "activated" {
					return errRefused
				}
				return nil
			}, "refused by recheck", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			ns := env.Namespace(t)
			env.Topology(t, ns, nil)
			read := env.Get(t, ns)
			// Someone writes between the command's read and its patch.
			moved := read.DeepCopy()
			tt.meanwhile(moved)
			var err error
			// Merge patches, as kubectl annotate and the operator send
			// (an Update from a typed client would also rewrite the
			// spec's zero fields and bump the generation).
			if tt.status {
				err = env.Client.Status().Patch(ctx, moved, client.MergeFrom(read))
			} else {
				err = env.Client.Patch(ctx, moved, client.MergeFrom(read))
			}
			if err != nil {
				t.Fatal(err)
			}
			if now := env.Get(t, ns); now.ResourceVersion == read.ResourceVersion {
				t.Fatalf("the write meanwhile did not move the resourceVersion: the test proves nothing")
			}
			v := "true"
			var checks []func(*topologyv1.ShardTopology) error
			if tt.recheck != nil {
				checks = append(checks, tt.recheck)
			}
			err = plugin.PatchAnnotation(ctx, env.Client, read, topologyv1.AbortAnnotation, &v, checks...)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("patch after a status write: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			case tt.wantErr != "" && tt.recheck == nil && !apierrors.IsConflict(err):
				t.Fatalf("error %v is not the API server's conflict", err)
			}
			got := env.Get(t, ns)
			if got.IsAbortRequested() != tt.wantSet {
				t.Fatalf("abort annotation set %v, want %v", got.IsAbortRequested(), tt.wantSet)
			}
			if tt.wantSet && got.Status.Progress != "moved on" {
				t.Fatalf("the retried patch lost the status written meanwhile: %q", got.Status.Progress)
			}
		})
	}
}

var errRefused = refusedError{}

type refusedError struct{}

func (refusedError) Error() string { return "refused by recheck" }
