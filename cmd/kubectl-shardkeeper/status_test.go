package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

var statusNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *metav1.Time { t := metav1.NewTime(statusNow.Add(-d)); return &t }

// topologyMidRollout is a ShardTopology as the operator reports it in the
// middle of a change from 2x4 to 2x8.
func topologyMidRollout() *topologyv1.ShardTopology {
	return &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: "prod", Generation: 4},
		Spec:       topologyv1.ShardTopologySpec{Partitions: 2, ShardsPerPartition: 8},
		Status: topologyv1.ShardTopologyStatus{
			ObservedGeneration: 4,
			Phase:              topologyv1.PhaseRollingOut,
			Progress:           "epoch 1 (2x4): units 8/8 owned; -> epoch 2 (2x8): Freeze",
			ActiveEpoch:        &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4},
			TargetEpoch:        &topologyv1.TopologyEpoch{Number: 2, Partitions: 2, ShardsPerPartition: 8},
			Units:              &topologyv1.UnitCounts{Total: 8, Owned: 8},
			Census:             &topologyv1.CensusStatus{ObservedAt: ago(12 * time.Second), Servers: 3, MinVersion: "2.12.15", BelowFloor: []string{"nats-2"}},
			Rollout: &topologyv1.RolloutStatus{
				Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepFreeze, StartedAt: ago(90 * time.Second),
				FromEpoch: &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4},
				Message:   "1/2 live members acknowledged the freeze; waiting for ingest-1",
			},
			Conditions: []metav1.Condition{
				{Type: topologyv1.ConditionReady, Status: metav1.ConditionFalse, Reason: topologyv1.ReasonRollingOut, Message: "waiting", LastTransitionTime: *ago(90 * time.Second)},
				{Type: topologyv1.ConditionVersionFloorMet, Status: metav1.ConditionFalse, Reason: topologyv1.ReasonBelowFloor, Message: "nats-2 (2.12.15)", LastTransitionTime: *ago(time.Hour)},
			},
		},
	}
}

func TestStatusShowsTheRolloutStepByStep(t *testing.T) {
	tests := []struct {
		name string
		topo func() *topologyv1.ShardTopology
		want []string
	}{
		{"a topology change marks steps done, current and to come", topologyMidRollout, []string{
			"ShardTopology prod/ingest  generation 4 (observed 4)",
			"Phase:     RollingOut",
			"Active:    epoch 1, 2x4 (8 units)",
			"Target:    epoch 2, 2x8 (16 units)",
			"Census:    3 servers, lowest 2.12.15, below the floor: nats-2 (taken 12s ago)",
			"Rollout (Topology, started 90s ago):",
			"[x] Provision",
			"[>] Freeze    1/2 live members acknowledged the freeze; waiting for ingest-1",
			"[ ] Activate",
			"[ ] Retire",
			"VersionFloorMet   False    BelowFloor",
		}},
		{"a pod roll lists every pod", func() *topologyv1.ShardTopology {
			o := topologyMidRollout()
			o.Status.TargetEpoch = nil
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindPods, PodsDone: 1, PodsTotal: 3, Message: "pod ingest-1: handing over",
				Pods: []topologyv1.PodRollStatus{
					{Name: "ingest-2", Step: topologyv1.PodStepDone},
					{Name: "ingest-1", Step: topologyv1.PodStepHandingOver, Holds: 3, Since: ago(4 * time.Second)},
					{Name: "ingest-0", Step: topologyv1.PodStepWaiting},
				}}
			return o
		}, []string{
			"1/3 pods done, highest ordinal first",
			"[x] ingest-2             Done",
			"[>] ingest-1             HandingOver, holds 3 units, for 4s",
			"[ ] ingest-0             Waiting",
			"now: pod ingest-1: handing over",
		}},
		{"nothing rolling says so", func() *topologyv1.ShardTopology {
			o := topologyMidRollout()
			o.Status.Rollout, o.Status.TargetEpoch = nil, nil
			return o
		}, []string{"Rollout:   none in progress"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printStatus(&b, tt.topo(), nil, statusNow); err != nil {
				t.Fatal(err)
			}
			for _, want := range tt.want {
				if !strings.Contains(b.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, b.String())
				}
			}
		})
	}
}

func TestStatusFlags(t *testing.T) {
	for _, args := range [][]string{{"ingest", "-n", "prod"}, {"-n", "prod", "ingest"}, {"--namespace=prod", "ingest", "-o", "json"}} {
		f, err := parseStatusFlags(args)
		if err != nil || f.name != "ingest" || f.namespace != "prod" {
			t.Errorf("%q: %+v, %v", args, f, err)
		}
	}
	for _, args := range [][]string{{}, {"a", "b"}, {"a", "-o", "yaml"}, {"a", "--events", "-1"}} {
		if _, err := parseStatusFlags(args); !errors.Is(err, errUsage) {
			t.Errorf("%q: error %v, want a usage error", args, err)
		}
	}
}

// The command reads the object through a kubeconfig, as kubectl would.
func TestStatusReadsTheTopologyThroughAKubeconfig(t *testing.T) {
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	user, err := env.AddUser(envtest.User{Name: "reader", Groups: []string{"system:masters"}}, env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = topologyv1.AddToScheme(scheme)
	_ = corev1.AddToScheme(scheme)
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prod"}}); err != nil {
		t.Fatal(err)
	}
	o := topologyMidRollout()
	st := o.Status
	o.Status = topologyv1.ShardTopologyStatus{}
	o.Spec.NATS.URLs = []string{"nats://nats:4222"}
	o.Spec.Registry.DSNSecretRef = topologyv1.SecretKeyRef{Name: "r", Key: "dsn"}
	o.Spec.Workload.StatefulSetName = "ingest"
	if err := c.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	o.Status = st
	o.Status.ObservedGeneration = o.Generation
	if err := c.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}

	out, err := capture(t, "status", "ingest", "-n", "prod", "--kubeconfig", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ShardTopology prod/ingest", "[>] Freeze", "Target:    epoch 2, 2x8"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = capture(t, "status", "ingest", "-n", "prod", "--kubeconfig", path, "-o", "json")
	if err != nil || !strings.Contains(out, `"phase": "RollingOut"`) {
		t.Fatalf("json output %v:\n%s", err, out)
	}
	if _, err := capture(t, "status", "missing", "-n", "prod", "--kubeconfig", path); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing topology: %v", err)
	}
}
