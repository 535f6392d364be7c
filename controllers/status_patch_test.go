package controllers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
)

// The status write never disappears silently. Another writer changes the
// object (for real, through the API server) right before each of the
// reconciler's first status patches, so each meets a real conflict:
// with the generation unchanged the write is retried until it lands; when
// the spec moved, the reconcile returns an error, so it is retried rather
// than dropped. Before the fix the write was skipped after three
// conflicts, or at once when the generation moved, and the reconcile
// reported success.
// checks P7
func TestStatusWriteIsRetriedUntilItLandsOrTheReconcileIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name      string
		conflicts int32
		// specMoves: the other writer changes the spec, not an annotation.
		specMoves bool
	}{
		{"five conflicts from annotation writes: the status lands", 5, false},
		{"the spec moves under the patch: the reconcile is retried", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			o := sampleTopology(ns)
			if err := k.Create(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			// Persist the defaults the API server applies on read, so the
			// other writer's annotation writes move no generation.
			if err := k.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
				t.Fatal(err)
			}
			if err := k.Update(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			var caused atomic.Int32
			hook := interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if n := caused.Load(); n < tc.conflicts {
					cur := &topologyv1.ShardTopology{}
					if err := k.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
						return err
					}
					if tc.specMoves {
						cur.Spec.ShardsPerPartition++
					} else {
						cur.Annotations = map[string]string{"test.shardkeeper.dev/writer": fmt.Sprint(n)}
					}
					if err := k.Update(ctx, cur); err != nil {
						return err
					}
					caused.Add(1)
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			}}
			wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k.Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			r := &controllers.ShardTopologyReconciler{Client: interceptor.NewClient(wc, hook), Recorder: events.NewFakeRecorder(100)}
			_, rerr := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(o)})
			t.Logf("reconcile returned %v", rerr)
			got := &topologyv1.ShardTopology{}
			if err := k.Get(context.Background(), client.ObjectKeyFromObject(o), got); err != nil {
				t.Fatal(err)
			}
			landed := len(got.Status.Conditions) > 0
			switch {
			case !landed && rerr == nil:
				t.Fatalf("the status write was dropped after %d conflicts and the reconcile reported success: nothing retries it", caused.Load())
			case caused.Load() != tc.conflicts:
				t.Fatalf("the other writer wrote %d times, want %d: the fault did not take effect", caused.Load(), tc.conflicts)
			case !tc.specMoves && (!landed || rerr != nil):
				t.Fatalf("status landed %t (conditions %v), reconcile error %v: want the write retried until it lands", landed, got.Status.Conditions, rerr)
			}
		})
	}
}
