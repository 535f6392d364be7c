package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

func TestComputeStatusSaysWhetherTheRegistryIsDurable(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		d      *poolctl.Durability
		status metav1.ConditionStatus
		reason string
	}{
		{"asynchronous standby", &poolctl.Durability{Reason: poolctl.DurableAsynchronous, Message: "async"}, metav1.ConditionFalse, poolctl.DurableAsynchronous},
		{"synchronous standby", &poolctl.Durability{Durable: true, Reason: poolctl.DurableSynchronous, Message: "sync"}, metav1.ConditionTrue, poolctl.DurableSynchronous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
			st := computeStatus(topo, observation{durability: tt.d, registry: registryWith(1, 1, 1, 1, nil)}, now)
			c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionRegistryDurable)
			if c == nil || c.Status != tt.status || c.Reason != tt.reason || c.Message != tt.d.Message {
				t.Fatalf("RegistryDurable %+v, want %s/%s", c, tt.status, tt.reason)
			}
		})
	}
	t.Run("not read keeps the last value", func(t *testing.T) {
		topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
		topo.Status.Conditions = []metav1.Condition{{Type: topologyv1.ConditionRegistryDurable, Status: metav1.ConditionTrue,
			Reason: poolctl.DurableSynchronous, LastTransitionTime: metav1.NewTime(now)}}
		st := computeStatus(topo, observation{registry: registryWith(1, 1, 1, 1, nil)}, now)
		if c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionRegistryDurable); c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("RegistryDurable %+v after a reconcile that did not read it; want the last value kept", c)
		}
	})
}
