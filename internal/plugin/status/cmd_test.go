package status

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

var statusNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *metav1.Time { t := metav1.NewTime(statusNow.Add(-d)); return &t }

// midRollout is a ShardTopology as the operator reports it in the middle
// of a change from 2x4 to 2x8.
func midRollout(o *topologyv1.ShardTopology) {
	o.Spec.ShardsPerPartition = 8
	o.Status = topologyv1.ShardTopologyStatus{
		Phase:       topologyv1.PhaseRollingOut,
		Progress:    "epoch 1 (2x4): units 8/8 owned; -> epoch 2 (2x8): Freeze",
		ActiveEpoch: &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4},
		TargetEpoch: &topologyv1.TopologyEpoch{Number: 2, Partitions: 2, ShardsPerPartition: 8},
		Units:       &topologyv1.UnitCounts{Total: 8, Owned: 8},
		Census: &topologyv1.CensusStatus{ObservedAt: ago(12 * time.Second), ServerCount: 3, MinVersion: "2.12.15", BelowFloor: []string{"nats-2"},
			Servers: []topologyv1.CensusServer{{Name: "nats-2", Version: "2.12.15", Cluster: "c", Role: "member", BelowFloor: true}}},
		Rollout: &topologyv1.RolloutStatus{
			Kind: topologyv1.RolloutKindTopology, Step: topologyv1.StepFreeze, StartedAt: ago(90 * time.Second), UnitsToMove: 9,
			FromEpoch: &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4},
			Message:   "1/2 live members acknowledged the freeze; waiting for ingest-1",
		},
		LastRollout: &topologyv1.LastRolloutStatus{Kind: topologyv1.RolloutKindPods, To: "ingest-7c9f", Result: topologyv1.RolloutSucceeded,
			FinishedAt: ago(time.Hour), Duration: &metav1.Duration{Duration: 95 * time.Second}},
		Conditions: []metav1.Condition{
			{Type: topologyv1.ConditionReady, Status: metav1.ConditionFalse, Reason: topologyv1.ReasonRollingOut, Message: "waiting", LastTransitionTime: *ago(90 * time.Second)},
			{Type: topologyv1.ConditionVersionFloorMet, Status: metav1.ConditionFalse, Reason: topologyv1.ReasonBelowFloor, Message: "nats-2 (2.12.15)", LastTransitionTime: *ago(time.Hour)},
		},
	}
}

func TestPrintShowsTheRolloutStepByStep(t *testing.T) {
	tests := []struct {
		name string
		topo func(*topologyv1.ShardTopology)
		want []string
	}{
		{"a topology change marks steps done, current and to come, in the API's vocabulary", midRollout, []string{
			"ShardTopology prod/ingest  generation 4 (observed 4)",
			"Phase:     RollingOut",
			"Spec:      2x8 (16 units), approval Automatic",
			"Target:    epoch 2, 2x8 (16 units)",
			"Census:    3 servers, lowest 2.12.15, below the floor: nats-2 (taken 12s ago)",
			"Rollout (Topology, started 90s ago):",
			"[x] Provision",
			"[>] Freeze    1/2 live members acknowledged the freeze; waiting for ingest-1",
			"[ ] Activate", "[ ] HandOver", "[ ] Claim", "[ ] Retire",
			"Last:      Pods to ingest-7c9f Succeeded in 1m35s, finished 60m ago",
			"VersionFloorMet   False    BelowFloor",
		}},
		{"a plan waiting for approval is shown with its hash, Approve among the steps", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			o.Spec.Rollout.Approval = topologyv1.ApprovalManual
			o.Status.Rollout, o.Status.TargetEpoch = nil, nil
			o.Status.Plan = &topologyv1.PlanStatus{Hash: "0123456789abcdef", State: topologyv1.PlanProposalReady, ProposedAt: ago(time.Minute), Message: "waits for approval"}
		}, []string{"approval Manual", "Plan 0123456789abcdef (ProposalReady, proposed 60s ago): waits for approval", "Rollout:   none in progress"}},
		{"a pod roll lists every pod", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			o.Status.TargetEpoch = nil
			o.Status.Rollout = &topologyv1.RolloutStatus{Kind: topologyv1.RolloutKindPods, PodsDone: 1, PodsTotal: 3, Message: "pod ingest-1: handing over",
				Pods: []topologyv1.PodRollStatus{
					{Name: "ingest-2", Step: topologyv1.PodStepDone},
					{Name: "ingest-1", Step: topologyv1.PodStepHandingOver, Holds: 3, Since: ago(4 * time.Second)},
					{Name: "ingest-0", Step: topologyv1.PodStepWaiting},
				}}
		}, []string{
			"1/3 pods done, highest ordinal first",
			"[x] ingest-2             Done",
			"[>] ingest-1             HandingOver, holds 3 units, for 4s",
			"[ ] ingest-0             Waiting",
			"now: pod ingest-1: handing over",
		}},
		{"an order barrier names the new units waiting and the old units draining", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			sw := int64(200)
			o.Status.OrderBarrier = &topologyv1.OrderBarrierStatus{Epoch: 2, FromShards: 8, ToShards: 16, Partitions: 1, Switched: 1,
				Predecessors: 8, Lifted: 6, UnitsWaiting: 2, CheckedAt: ago(2 * time.Second),
				Waiting:  []topologyv1.BarrierWait{{Unit: "0.14", For: []string{"0.6"}}, {Unit: "0.15", For: []string{"0.7"}}},
				Draining: []topologyv1.BarrierDrain{{Unit: "0.6", SwitchSeq: &sw, AckFloor: 150, FirstOpen: 161, Pending: 12, AckPending: 3}},
				Unread:   []string{"0.7: context deadline exceeded"}}
		}, []string{
			"Order:     barrier of epoch 2 (8 -> 16 shards): 2 new units hold moved keys' rows; 6/8 old units drained, 1/1 switches recorded (checked 2s ago)",
			"0.14     waits for 0.6",
			"0.6      draining: ack floor 150, switch at 200, 12 pending, 3 unacknowledged, first open row 161",
			"not read: 0.7: context deadline exceeded",
		}},
		{"an order barrier of a change of N names the partitions and the publishers behind", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			sw := int64(900)
			o.Status.OrderBarrier = &topologyv1.OrderBarrierStatus{Epoch: 4, FromShards: 4, ToShards: 4, FromPartitions: 4, ToPartitions: 6,
				Partitions: 4, Predecessors: 16, Lifted: 15, UnitsWaiting: 1, CheckedAt: ago(time.Second),
				PublishersBehind: []string{"orders-api (epoch 3)"},
				Waiting:          []topologyv1.BarrierWait{{Unit: "0.1", For: []string{"2.1"}}},
				Draining:         []topologyv1.BarrierDrain{{Unit: "2.1", SwitchSeq: &sw, AckFloor: 850, Pending: 0, AckPending: 4, Mark: 870}}}
		}, []string{
			"Order:     barrier of epoch 4 (4 -> 6 partitions): 1 new units hold moved keys' rows; 15/16 old units drained, 0/4 switches recorded (checked 1s ago)",
			"switches wait for publishers on an older epoch: orders-api (epoch 3)",
			"2.1      draining: ack floor 850, switch at 900, 0 pending, 4 unacknowledged, holder's mark 870",
		}},
		{"a lifted order barrier says so", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			o.Status.OrderBarrier = &topologyv1.OrderBarrierStatus{Epoch: 3, FromShards: 16, ToShards: 12, Partitions: 1, Switched: 1, Predecessors: 16, Lifted: 16}
		}, []string{"Order:     barrier of epoch 3 (16 -> 12 shards) lifted: all 16 old units drained to the switch"}},
		{"members that are not pods of the workload are named", func(o *topologyv1.ShardTopology) {
			midRollout(o)
			o.Spec.Workload.StatefulSetName = "ingest"
			o.Status.Members = &topologyv1.MemberStatus{Live: 3, Foreign: 1, ForeignNames: []string{"laptop-debug"}, ForeignUnits: 4}
		}, []string{"Members:   3 live; 1 NOT pods of StatefulSet ingest, holding 4 units: laptop-debug"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: "prod", Generation: 4},
				Spec: topologyv1.ShardTopologySpec{Partitions: 2, ShardsPerPartition: 4}}
			tt.topo(o)
			o.Status.ObservedGeneration = 4
			var b bytes.Buffer
			if err := Print(&b, o, nil, statusNow); err != nil {
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

// The command reads through a kubeconfig and kubectl's flags, as kubectl
// would, and prints what cli-runtime's printers print for -o.
func TestStatusReadsTheAPIServerWithKubectlFlagsAndPrinters(t *testing.T) {
	ns := env.Namespace(t)
	env.Topology(t, ns, midRollout)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"one topology, human view", []string{"ingest", "-n", ns}, 0, []string{"ShardTopology " + ns + "/ingest", "[>] Freeze", "Target:    epoch 2, 2x8"}},
		{"-o json is the object", []string{"ingest", "-n", ns, "-o", "json"}, 0, []string{`"phase": "RollingOut"`, `"kind": "ShardTopology"`}},
		{"-o yaml is the object", []string{"ingest", "-n", ns, "-o", "yaml"}, 0, []string{"phase: RollingOut"}},
		{"-o jsonpath picks a field", []string{"ingest", "-n", ns, "-o", "jsonpath={.status.rollout.step}"}, 0, []string{"Freeze"}},
		{"no name lists the namespace", []string{"-n", ns}, 0, []string{"NAME     PARTITIONS   SHARDS   EPOCH   PHASE        READY", "ingest   2            8        1       RollingOut   False"}},
		{"-A -o wide lists every namespace with the reason", []string{"-A", "-o", "wide"}, 0, []string{"NAMESPACE", "REASON", ns, "RollingOut   False   epoch 1 (2x4)"}},
		{"a missing topology is an error", []string{"missing", "-n", ns}, plugin.ExitError, nil},
		{"-w wants a name", []string{"-w", "-n", ns}, plugin.ExitUsage, nil},
		{"a bad -o is a usage error", []string{"ingest", "-n", ns, "-o", "xml"}, plugin.ExitUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := env.Run(NewCmd, append([]string{"status"}, tt.args...)...)
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
	r := env.Run(NewCmd, "status", "ingest", "-n", ns, "-o", "json")
	var o topologyv1.ShardTopology
	if err := json.Unmarshal([]byte(r.Out), &o); err != nil || o.Status.Census == nil || len(o.Status.Census.Servers) != 1 {
		t.Fatalf("-o json does not decode to the topology with its census servers: %v", err)
	}
}

// --watch draws progress and exits 0 once Ready at the current generation,
// ExitStalled once Stalled, ExitTimeout after --timeout.
func TestStatusWatchExitsReadyStalledOrTimedOut(t *testing.T) {
	setCond := func(typ string, status metav1.ConditionStatus, reason string) func(*topologyv1.ShardTopology) {
		return func(o *topologyv1.ShardTopology) {
			o.Status.Rollout = nil
			o.Status.TargetEpoch = nil
			o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 2, Partitions: 2, ShardsPerPartition: 8}
			o.Status.Phase = topologyv1.PhaseReady
			o.Status.Progress = "epoch 2 (2x8): units 16/16 owned"
			if typ == topologyv1.ConditionStalled {
				o.Status.Phase = topologyv1.PhaseStalled
			}
			meta.SetStatusCondition(&o.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: "m"})
		}
	}
	tests := []struct {
		name     string
		then     func(*topologyv1.ShardTopology)
		args     []string
		wantCode int
		wantLast string
	}{
		{"Ready at the current generation exits 0", setCond(topologyv1.ConditionReady, metav1.ConditionTrue, topologyv1.ReasonReady), nil, 0, "Ready"},
		{"Stalled exits 3", setCond(topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound), nil, plugin.ExitStalled, "Stalled"},
		{"nothing happening exits 4 after the timeout", nil, []string{"--timeout", "1s"}, plugin.ExitTimeout, "RollingOut"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			o := env.Topology(t, ns, midRollout)
			done := make(chan plugintest.Result, 1)
			go func() { done <- env.Run(NewCmd, append([]string{"status", "ingest", "-n", ns, "-w"}, tt.args...)...) }()
			if tt.then != nil {
				// Whether the watch sees the rollout first or not, it must
				// end on this status.
				tt.then(o)
				if err := env.Client.Status().Update(context.Background(), o); err != nil {
					t.Fatal(err)
				}
			}
			var r plugintest.Result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("status -w did not exit within 30s")
			}
			lines := strings.Split(strings.TrimSpace(r.Out), "\n")
			if r.Code() != tt.wantCode || !strings.Contains(lines[len(lines)-1], tt.wantLast) {
				t.Fatalf("exit %d (%v), want %d; last line should show %s:\n%s", r.Code(), r.Error, tt.wantCode, tt.wantLast, r.Out)
			}
			if !strings.Contains(r.Out, "units moved [") || !strings.Contains(r.Out, "pods done [") {
				t.Fatalf("no progress bars:\n%s", r.Out)
			}
		})
	}
}

func TestBar(t *testing.T) {
	for _, tt := range []struct {
		n, total int32
		want     string
	}{{0, 0, "[....]"}, {0, 4, "[----]"}, {2, 4, "[##--]"}, {5, 4, "[####]"}} {
		if got := Bar(tt.n, tt.total, 4); got != tt.want {
			t.Errorf("Bar(%d, %d) = %s, want %s", tt.n, tt.total, got, tt.want)
		}
	}
}

// Shell completion offers the topologies of the namespace for NAME.
func TestCompletionOffersTopologyNames(t *testing.T) {
	ns := env.Namespace(t)
	env.Topology(t, ns, nil)
	r := env.Run(NewCmd, "__complete", "status", "-n", ns, "")
	if r.Error != nil || !strings.HasPrefix(r.Out, "ingest\n") {
		t.Fatalf("completion %v:\n%s", r.Error, r.Out)
	}
}

// After kubectl set image the topology is still Ready at an unchanged
// generation until the operator starts the roll: --watch exited 0 at
// once. It waits while the StatefulSet has pods not at its update
// revision, and exits 0 once every pod is.
func TestStatusWatchWaitsForAPendingPodRoll(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	env.Topology(t, ns, func(o *topologyv1.ShardTopology) {
		o.Status.ActiveEpoch = &topologyv1.TopologyEpoch{Number: 1, Partitions: 2, ShardsPerPartition: 4}
		o.Status.Phase = topologyv1.PhaseReady
		o.Status.Progress = "epoch 1 (2x4): units 8/8 owned"
		o.Status.Conditions = []metav1.Condition{{Type: topologyv1.ConditionReady, Status: metav1.ConditionTrue, Reason: topologyv1.ReasonReady, Message: "m", LastTransitionTime: metav1.Now()}}
	})
	// The StatefulSet as its controller reports it right after kubectl set
	// image: a new update revision, one of three pods on it.
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr(int32(3)),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:v2"}}},
			},
		},
	}
	if err := env.Client.Create(ctx, sts); err != nil {
		t.Fatal(err)
	}
	sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: 3, UpdatedReplicas: 1, CurrentRevision: "ingest-1", UpdateRevision: "ingest-2"}
	if err := env.Client.Status().Update(ctx, sts); err != nil {
		t.Fatal(err)
	}

	done := make(chan plugintest.Result, 1)
	go func() { done <- env.Run(NewCmd, "status", "ingest", "-n", ns, "-w", "--timeout", "60s") }()
	select {
	case r := <-done:
		t.Fatalf("status -w exited %d while 2 of 3 pods wait for the roll:\n%s", r.Code(), r.Out)
	case <-time.After(3 * time.Second):
	}
	sts.Status.UpdatedReplicas, sts.Status.CurrentRevision = 3, "ingest-2"
	if err := env.Client.Status().Update(ctx, sts); err != nil {
		t.Fatal(err)
	}
	var r plugintest.Result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("status -w did not exit within 20s of the roll's end")
	}
	if r.Code() != 0 || !strings.Contains(r.Out, "waiting for a pod roll: StatefulSet ingest has 1/3 pods at revision ingest-2") {
		t.Fatalf("exit %d (%v), want 0 after saying what it waited for:\n%s", r.Code(), r.Error, r.Out)
	}
}

func ptr[T any](v T) *T { return &v }
