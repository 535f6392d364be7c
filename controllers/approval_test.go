package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
	"github.com/shardkeeper/shardkeeper/internal/plugin/status"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// writeKubeconfig writes a kubeconfig reaching the test API server as an
// administrator.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	kc, err := kubetest.Kubeconfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Under spec.rollout.approval: Manual a change of V is planned and
// published in status.plan, but nothing is frozen until the approve
// annotation carries the plan's hash. An approval of a plan that changed
// since it was read (here: a member joined, so units move differently) is
// refused with a reason and an Event; the approval of the current plan
// rolls the change out, and the finished rollout leaves a record.
// checks P2, checks P7
func TestManualApprovalWaitsRefusesAStaleHashAndProceedsOnTheCurrentOne(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 2, shards: 4})
	f.topo.Spec.Rollout.Approval = topologyv1.ApprovalManual
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "w-0", false)
	f.waitReady(60 * time.Second) // the first epoch needs no approval

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 8 })
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		p := o.Status.Plan
		if o.Status.Phase != topologyv1.PhaseAwaitingApproval || p == nil || p.State != topologyv1.PlanProposalReady || o.Status.ObservedGeneration != o.Generation {
			return fmt.Errorf("phase %s plan %+v, want AwaitingApproval with a ProposalReady plan", o.Status.Phase, p)
		}
		return nil
	})
	stale := st.Status.Plan
	if stale.UnitsAdded != 8 || stale.UnitsRemoved != 0 || stale.To.ShardsPerPartition != 8 || len(stale.Pods) != 1 || stale.EstimatedDuration == nil || len(stale.Hash) != 16 {
		t.Fatalf("plan %+v: want 8 units added over one pod, an estimate and a 16-digit hash", stale)
	}
	wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonAwaitingApproval)
	waitEvent(t, f.ns, "PlanProposed", stale.Hash)
	// Nothing is frozen while the plan waits.
	consistently(t, 2*time.Second, func() error {
		if s := f.snapshot(); s.Pending != nil || s.Active == nil || s.Active.Number != 1 {
			return fmt.Errorf("registry moved before approval: active %+v pending %+v", s.Active, s.Pending)
		}
		return nil
	})

	// A second member joins: the plan the person read is no longer the
	// one that would run. The current plan is read once w-1 took its
	// share of the first epoch: every unit it takes changes the moves,
	// and so the hash (CI read a plan of a half-taken share, and the
	// refusal named a later one).
	startSimWorker(t, f.reg, f.key(), "w-1", false)
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		p := o.Status.Plan
		if p == nil || p.Hash == stale.Hash || len(p.Pods) != 2 {
			return fmt.Errorf("plan %+v, want a new plan over two pods", p)
		}
		settled := settledShares(f.snapshot())
		for _, pod := range p.Pods {
			if pod.Before != settled[pod.Name] {
				return fmt.Errorf("plan's pods %+v, want them holding their settled shares %v", p.Pods, settled)
			}
		}
		return nil
	})
	current := st.Status.Plan.Hash

	f.update(func(o *topologyv1.ShardTopology) {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[topologyv1.ApproveAnnotation] = stale.Hash
	})
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionReady); c == nil || c.Reason != topologyv1.ReasonApprovalRefused {
			return fmt.Errorf("Ready %+v, want reason ApprovalRefused", c)
		}
		return nil
	})
	c := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonApprovalRefused)
	if !strings.Contains(c.Message, stale.Hash) || !strings.Contains(c.Message, current) {
		t.Fatalf("refusal %q names neither the stale hash %s nor the current %s", c.Message, stale.Hash, current)
	}
	waitEvent(t, f.ns, "ApprovalRefused", stale.Hash)
	consistently(t, 2*time.Second, func() error {
		if s := f.snapshot(); s.Pending != nil || s.Active.Number != 1 {
			return errors.New("a stale approval started the change")
		}
		return nil
	})

	// kubectl shardkeeper status -w follows the approved change to Ready,
	// through a kubeconfig as a person would run it (README shows this
	// output).
	kubeconfig := writeKubeconfig(t)
	watched := make(chan plugintest.Result, 1)
	go func() {
		watched <- plugintest.RunWith(kubeconfig, status.NewCmd, "status", "ingest", "-n", f.ns, "-w", "--timeout", "90s")
	}()
	f.update(func(o *topologyv1.ShardTopology) { o.Annotations[topologyv1.ApproveAnnotation] = current })
	waitEvent(t, f.ns, "PlanApproved", current)
	r := <-watched
	t.Logf("kubectl shardkeeper status ingest -w (exit %d):\n%s", r.Code(), r.Out)
	if r.Code() != 0 || !strings.Contains(r.Out, "Ready") {
		t.Fatalf("status -w: exit %d (%v)", r.Code(), r.Error)
	}
	st = f.waitStatus(10*time.Second, func(o *topologyv1.ShardTopology) error {
		if a := o.Status.ActiveEpoch; a == nil || a.Number != 2 || a.ShardsPerPartition != 8 || o.Status.Phase != topologyv1.PhaseReady {
			return fmt.Errorf("phase %s active %+v, want Ready at epoch 2 (2x8)", o.Status.Phase, a)
		}
		return nil
	})
	last := st.Status.LastRollout
	if last == nil || last.Kind != topologyv1.RolloutKindTopology || last.Result != topologyv1.RolloutSucceeded ||
		last.From != "epoch 1 (2x4)" || last.To != "epoch 2 (2x8)" || last.PlanHash != current || last.Duration == nil {
		t.Fatalf("last rollout %+v", last)
	}
	if st.Status.Plan != nil || st.Status.Rollout != nil {
		t.Fatalf("plan %+v rollout %+v left after the change", st.Status.Plan, st.Status.Rollout)
	}
	// The annotation still names the plan rolled out: that approves
	// nothing new and is not stale.
	wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionTrue, topologyv1.ReasonReady)
	// The registry's replication settings come with every Observe: the
	// test's PostgreSQL has no standby.
	wantConditionOf(t, st, topologyv1.ConditionRegistryDurable, metav1.ConditionFalse, poolctl.DurableNoStandby)
}

// The approve annotation stays on the object after the change it
// approved has finished. Once a pod roll (kubectl set image) finished
// after that change, status.lastRollout describes the roll and no longer
// carries the plan's hash, and the next change read the leftover
// annotation as a stale approval: an immediate ApprovalRefused Warning.
// It must wait for its own approval instead.
// checks P7
func TestAnApprovalOfAFinishedChangeIsNotRefusedAsStale(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 2, shards: 4})
	f.topo.Spec.Rollout.Approval = topologyv1.ApprovalManual
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "w-0", false)
	f.waitReady(60 * time.Second)

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 8 })
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if p := o.Status.Plan; p == nil || p.State != topologyv1.PlanProposalReady {
			return fmt.Errorf("plan %+v, want ProposalReady", p)
		}
		return nil
	})
	approved := st.Status.Plan.Hash
	f.update(func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.ApproveAnnotation: approved}
	})
	st = f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if a := o.Status.ActiveEpoch; a == nil || a.ShardsPerPartition != 8 || o.Status.Phase != topologyv1.PhaseReady {
			return fmt.Errorf("phase %s active %+v, want Ready at 2x8", o.Status.Phase, a)
		}
		return nil
	})

	// A pod roll finishes: its record replaces the change's, as
	// finishedRollout writes it (the roll itself needs pods, which
	// pod_roll_test.go runs; the record is what matters here).
	now := metav1.Now()
	before := st.DeepCopy()
	st.Status.LastRollout = &topologyv1.LastRolloutStatus{Kind: topologyv1.RolloutKindPods, To: "ingest-7c9f", Result: topologyv1.RolloutSucceeded,
		StartedAt: &now, FinishedAt: &now, Duration: &metav1.Duration{}}
	if err := k.Status().Patch(context.Background(), st, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	if got := f.get(); got.Annotations[topologyv1.ApproveAnnotation] != approved || got.Status.LastRollout.Kind != topologyv1.RolloutKindPods {
		t.Fatalf("annotation %q last rollout %+v: the leftover approval or the roll's record is missing, the test proves nothing",
			got.Annotations[topologyv1.ApproveAnnotation], got.Status.LastRollout)
	}

	// The next change waits for its own approval; the leftover one is
	// neither applied nor refused.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 16 })
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if p := o.Status.Plan; p == nil || p.State != topologyv1.PlanProposalReady || p.To.ShardsPerPartition != 16 {
			return fmt.Errorf("plan %+v, want a ProposalReady plan to 2x16", p)
		}
		return nil
	})
	consistently(t, 3*time.Second, func() error {
		o := f.get()
		if c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionReady); c == nil || c.Reason != topologyv1.ReasonAwaitingApproval {
			return fmt.Errorf("Ready %+v, want AwaitingApproval: the leftover approval %s was read as stale", c, approved)
		}
		if evs := listEvents(t, f.ns, "ApprovalRefused"); len(evs) > 0 {
			return fmt.Errorf("ApprovalRefused Event: %s", evs[0].Note)
		}
		return nil
	})
}

// An approval names one epoch number: after a change that reached pending
// and was reverted (the pending epoch retired), the same change asked
// again is planned to the next epoch the registry will write, so its hash
// differs and the approval still on the object does not start it. Before
// the fix the plan named active+1 both times, and the old approval rolled
// the second change out unread.
// checks P7
func TestAnApprovalGivenBeforeARevertDoesNotApproveTheNextChange(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.topo.Spec.Rollout.Approval = topologyv1.ApprovalManual
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	w := startSimWorker(t, f.reg, f.key(), "w-0", false)
	f.waitReady(60 * time.Second)

	proposed := func() *topologyv1.PlanStatus {
		t.Helper()
		st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
			if p := o.Status.Plan; o.Status.Phase != topologyv1.PhaseAwaitingApproval || p == nil || o.Status.ObservedGeneration != o.Generation {
				return fmt.Errorf("plan %+v, want one awaiting approval", p)
			}
			return nil
		})
		return st.Status.Plan
	}
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	first := proposed()
	// Approved; the worker holds its ack, so the epoch stays pending.
	w.holdAcks.Store(true)
	f.update(func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.ApproveAnnotation: first.Hash}
	})
	eventually(t, 20*time.Second, func() error {
		if p := f.snapshot().Pending; p == nil || p.Number != 2 {
			return fmt.Errorf("pending %+v, want epoch 2", p)
		}
		return nil
	})
	// Reverted while pending: epoch 2 is retired.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 2 })
	eventually(t, 20*time.Second, func() error {
		if s := f.snapshot(); s.Pending != nil || s.Active.Number != 1 {
			return fmt.Errorf("active %+v pending %+v, want epoch 1 and nothing pending", s.Active, s.Pending)
		}
		return nil
	})
	// The same change again, with the first approval still set. It must
	// not start the change. Whether it is refused aloud depends on whether
	// the status write recording it as started (status.approvedPlanHash)
	// landed before the revert moved the spec: then it is neither applied
	// nor refused (AwaitingApproval), else ApprovalRefused. Either way the
	// change waits for its own approval.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		c := meta.FindStatusCondition(o.Status.Conditions, topologyv1.ConditionReady)
		if c == nil || (c.Reason != topologyv1.ReasonAwaitingApproval && c.Reason != topologyv1.ReasonApprovalRefused) ||
			o.Status.ObservedGeneration != o.Generation {
			return fmt.Errorf("Ready %+v, want AwaitingApproval or ApprovalRefused at this generation", c)
		}
		return nil
	})
	if p := st.Status.Plan; p == nil || p.Hash == first.Hash {
		t.Fatalf("plan %+v: want a hash other than the approved %s", p, first.Hash)
	}
	consistently(t, 2*time.Second, func() error {
		if p := f.snapshot().Pending; p != nil {
			return fmt.Errorf("epoch %d written as pending on an approval of another epoch's plan", p.Number)
		}
		return nil
	})
}

// The approval of a Manual change is recorded in status before the change
// starts. The final status patch of a reconcile is dropped when the spec
// moved meanwhile; an approval recorded only there (after the pending
// epoch was written) was lost with it, and the annotation left behind was
// then refused as stale once the change finished. Every status patch is
// watched here: the first one carrying the approved hash must land while
// the registry still has no pending epoch.
// checks P7
func TestAManualApprovalIsRecordedBeforeItsEpochIsWritten(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.topo.Spec.Rollout.Approval = topologyv1.ApprovalManual
	f.withStatefulSet(0, "w")
	f.create()
	type patchSeen struct {
		approved string
		pending  bool
	}
	var (
		mu      sync.Mutex
		patches []patchSeen
	)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ic := interceptor.NewClient(wc, interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
		if err := c.SubResource(sub).Patch(ctx, obj, patch, opts...); err != nil {
			return err
		}
		if o, ok := obj.(*topologyv1.ShardTopology); ok {
			mu.Lock()
			// Before the topology's first reconcile there is no registry
			// row, and nothing pending.
			snap, err := f.reg.Snapshot(ctx, f.key())
			patches = append(patches, patchSeen{approved: o.Status.ApprovedPlanHash, pending: err == nil && snap.Pending != nil})
			mu.Unlock()
		}
		return nil
	}})
	r := &controllers.ShardTopologyReconciler{Client: ic, Recorder: events.NewFakeRecorder(10000)}
	startSimWorker(t, f.reg, f.key(), "w-0", false)
	eventually(t, 60*time.Second, func() error {
		if st := reconcileOnce(t, r, f.topo); st.Status.Phase != topologyv1.PhaseReady {
			return fmt.Errorf("phase %s, want Ready", st.Status.Phase)
		}
		return nil
	})

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	var hash string
	eventually(t, 30*time.Second, func() error {
		st := reconcileOnce(t, r, f.topo)
		if p := st.Status.Plan; p == nil || p.State != topologyv1.PlanProposalReady || st.Status.ObservedGeneration != st.Generation {
			return fmt.Errorf("plan %+v, want a ProposalReady plan for generation %d", p, st.Generation)
		}
		hash = st.Status.Plan.Hash
		return nil
	})
	f.update(func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.ApproveAnnotation: hash}
	})
	eventually(t, 60*time.Second, func() error {
		st := reconcileOnce(t, r, f.topo)
		if s := f.snapshot(); s.Active == nil || s.Active.Number < 2 || st.Status.ApprovedPlanHash != hash {
			return fmt.Errorf("active %+v, approvedPlanHash %q: want epoch 2 active under plan %s", s.Active, st.Status.ApprovedPlanHash, hash)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for i, p := range patches {
		if p.approved != hash {
			continue
		}
		if p.pending {
			t.Fatalf("status patch %d carried approvedPlanHash %s only after the pending epoch was written: a dropped final patch loses it", i, hash)
		}
		return
	}
	t.Fatalf("no status patch carried approvedPlanHash %s (%d patches)", hash, len(patches))
}

// settledShares is how many of the active epoch's units each placed
// member holds once the placement settled.
func settledShares(s poolctl.Snapshot) map[string]int32 {
	out := map[string]int32{}
	if s.Active == nil {
		return out
	}
	var slots []ownership.Slot
	for _, sl := range s.PlacementSlots() {
		slots = append(slots, ownership.Slot(sl))
	}
	pl := ownership.Place(ownership.Topology{Partitions: s.Active.Partitions, Shards: s.Active.Shards}.Units(), slots)
	for _, m := range s.Members {
		if m.Live && !m.Draining && m.Slot >= 0 {
			out[m.Name] = int32(len(pl.UnitsOf(ownership.Slot(m.Slot))))
		}
	}
	return out
}
