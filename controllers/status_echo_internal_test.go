package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

func TestOnlyAStatusEchoIsFilteredOut(t *testing.T) {
	base := func() *topologyv1.ShardTopology {
		o := &topologyv1.ShardTopology{}
		o.Generation = 3
		o.ResourceVersion = "10"
		o.Annotations = map[string]string{"a": "1"}
		o.Labels = map[string]string{"l": "1"}
		o.Finalizers = []string{topologyv1.Finalizer}
		o.Status.Phase = topologyv1.PhasePending
		return o
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		change func(*topologyv1.ShardTopology)
		wakes  bool
	}{
		{"status and resourceVersion only (the operator's own patch)", func(o *topologyv1.ShardTopology) {
			o.ResourceVersion = "11"
			o.Status.Phase = topologyv1.PhaseReady
			o.Status.Progress = "epoch 2"
		}, false},
		{"the spec (generation)", func(o *topologyv1.ShardTopology) { o.Generation++; o.Spec.Partitions = 4 }, true},
		{"an annotation (approve)", func(o *topologyv1.ShardTopology) { o.Annotations["topology.shardkeeper.dev/approve"] = "h" }, true},
		{"an annotation removed", func(o *topologyv1.ShardTopology) { o.Annotations = nil }, true},
		{"a label", func(o *topologyv1.ShardTopology) { o.Labels["l"] = "2" }, true},
		{"a finalizer removed", func(o *topologyv1.ShardTopology) { o.Finalizers = nil }, true},
		{"the deletion timestamp set", func(o *topologyv1.ShardTopology) { o.DeletionTimestamp = &now }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, nu := base(), base()
			tc.change(nu)
			if got := notAStatusEcho.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: nu}); got != tc.wakes {
				t.Fatalf("wakes a reconcile: %v, want %v", got, tc.wakes)
			}
		})
	}
	if !notAStatusEcho.Create(event.CreateEvent{Object: base()}) || !notAStatusEcho.Delete(event.DeleteEvent{Object: base()}) {
		t.Fatal("create and delete events must wake a reconcile")
	}
}
