package controllers_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
)

func unitConsumers(n, v int) []string {
	var out []string
	for p := range n {
		for s := range v {
			out = append(out, fmt.Sprintf("ingest_%d_%d", p, s))
		}
	}
	slices.Sort(out)
	return out
}

// The first reconcile of a valid spec provisions N x V consumers and
// activates epoch 1; the topology is Ready once workers own every unit,
// and status, metrics and the published RESET verdict say so.
// checks P4, checks P7
func TestFirstReconcileProvisionsAndActivatesEpochOne(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 2, shards: 4, servers: 3, replicas: 3})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()

	st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		if a := o.Status.ActiveEpoch; a == nil || a.Number != 1 || a.Partitions != 2 || a.ShardsPerPartition != 4 {
			return fmt.Errorf("active epoch %+v, want 1 (2x4)", a)
		}
		return nil
	})
	if got, want := f.consumers(2), unitConsumers(2, 4); !slices.Equal(got, want) {
		t.Fatalf("consumers %v, want %v", got, want)
	}
	snap := f.snapshot()
	if snap.Active == nil || snap.Active.Number != 1 || snap.Pending != nil {
		t.Fatalf("registry epochs active %+v pending %+v", snap.Active, snap.Pending)
	}
	if !controllerutil.ContainsFinalizer(st, topologyv1.Finalizer) {
		t.Fatalf("finalizers %v", st.Finalizers)
	}
	// No worker yet: not Ready, and the status says why.
	st = f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhasePending || !strings.Contains(o.Status.Progress, "units 0/8 owned") {
			return errors.New("want phase Pending with 0/8 units owned")
		}
		return nil
	})
	wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonWaitingForWorkers)

	// The census ran after activation too, and its verdict covers the
	// consumers: RESET allowed on an all-2.15 cluster.
	eventually(t, 20*time.Second, func() error {
		r := f.snapshot().Reset
		if !r.Published || !r.Allowed {
			return fmt.Errorf("RESET permission %+v, want published and allowed", r)
		}
		return nil
	})

	startSimWorker(t, f.reg, f.key(), "w-0", false)
	startSimWorker(t, f.reg, f.key(), "w-1", false)
	st = f.waitReady(30 * time.Second)
	if st.Status.Phase != topologyv1.PhaseReady || st.Status.Progress != "epoch 1 (2x4): units 8/8 owned" {
		t.Fatalf("phase %s progress %q", st.Status.Phase, st.Status.Progress)
	}
	if u := st.Status.Units; u == nil || u.Total != 8 || u.Owned != 8 || u.Unowned != 0 || u.MultiplyOwned != 0 {
		t.Fatalf("units %+v", u)
	}
	wantConditionOf(t, st, topologyv1.ConditionVersionFloorMet, metav1.ConditionTrue, topologyv1.ReasonFloorMet)
	wantConditionOf(t, st, topologyv1.ConditionReconciling, metav1.ConditionFalse, topologyv1.ReasonReady)
	if c := st.Status.Census; c == nil || c.ServerCount != 3 || len(c.Servers) != 3 || c.MinVersion == "" || len(c.BelowFloor) != 0 || c.ObservedAt == nil {
		t.Fatalf("census %+v", c)
	}
	if st.Status.Rollout != nil {
		t.Fatalf("rollout %+v reported when nothing rolls", st.Status.Rollout)
	}
	waitEvent(t, f.ns, "EpochPending", "epoch 1 (2x4)")
	waitEvent(t, f.ns, "EpochActivated", "epoch 1 (2x4)")

	labels := map[string]string{"namespace": f.ns, "name": "ingest"}
	eventually(t, 10*time.Second, func() error {
		for state, want := range map[string]float64{"flowing": 8, "stalled": 0, "unowned": 0} {
			if got, ok := metricValue(t, "shardkeeper_units", map[string]string{"namespace": f.ns, "name": "ingest", "state": state}); !ok || got != want {
				return fmt.Errorf("shardkeeper_units{state=%q} = %v (present %t), want %v", state, got, ok, want)
			}
		}
		for name, want := range map[string]float64{
			"shardkeeper_units_multiply_owned":     0,
			"shardkeeper_reset_permission_allowed": 1,
			"shardkeeper_topology_epoch":           1,
		} {
			if got, ok := metricValue(t, name, labels); !ok || got != want {
				return fmt.Errorf("%s = %v (present %t), want %v", name, got, ok, want)
			}
		}
		if v, ok := metricValue(t, "shardkeeper_topology_phase", map[string]string{"namespace": f.ns, "name": "ingest", "phase": "Ready"}); !ok || v != 1 {
			return fmt.Errorf("rollout phase Ready = %v", v)
		}
		if _, ok := metricValue(t, "shardkeeper_census_min_version_info", map[string]string{"namespace": f.ns, "name": "ingest", "version": st.Status.Census.MinVersion}); !ok {
			return errors.New("no census min version series")
		}
		if v, ok := metricValue(t, "shardkeeper_census_timestamp_seconds", labels); !ok || int64(v) != st.Status.Census.ObservedAt.Unix() {
			return fmt.Errorf("census timestamp %v (present %t), want %d", v, ok, st.Status.Census.ObservedAt.Unix())
		}
		if v, ok := metricValue(t, "shardkeeper_topology_condition", map[string]string{"namespace": f.ns, "name": "ingest", "type": "Ready", "status": "true"}); !ok || v != 1 {
			return fmt.Errorf("condition Ready=true series %v (present %t)", v, ok)
		}
		return nil
	})
}

// A change of V goes pending, waits for every live member's freeze
// acknowledgement before activating, and retires the consumers of the
// units that left only once they hold no rows.
// checks P2, checks P3
func TestShardChangeWaitsForEveryAckThenRetiresOnlyDrainedUnits(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 2, shards: 4})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	b := startSimWorker(t, f.reg, f.key(), "b", false)
	f.waitReady(60 * time.Second)

	// Rows in unit 1.3, which the change removes; nobody pulls them.
	f.publish(1, 3, 3)
	b.holdAcks.Store(true)
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 2 })

	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if e := o.Status.TargetEpoch; e == nil || e.Number != 2 || o.Status.Rollout == nil || o.Status.Rollout.Step != topologyv1.StepFreeze {
			return fmt.Errorf("target %+v rollout %+v, want epoch 2 at Freeze", e, o.Status.Rollout)
		}
		if !strings.Contains(o.Status.Rollout.Message, "b") {
			return fmt.Errorf("rollout message %q does not name the member it waits for", o.Status.Rollout.Message)
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if p := f.snapshot().Pending; p == nil || !slices.Contains(p.Acked, "a") {
			return fmt.Errorf("pending %+v, want acknowledged by a", p)
		}
		return nil
	})
	// P2: with b's acknowledgement missing, epoch 2 never activates.
	consistently(t, 3*time.Second, func() error {
		s := f.snapshot()
		if s.Active == nil || s.Active.Number != 1 || s.Pending == nil || s.Pending.Number != 2 {
			return fmt.Errorf("activated without every ack: active %+v pending %+v", s.Active, s.Pending)
		}
		return nil
	})

	b.holdAcks.Store(false)
	eventually(t, 20*time.Second, func() error {
		if a := f.snapshot().Active; a == nil || a.Number != 2 || a.Shards != 2 {
			return fmt.Errorf("active %+v, want epoch 2 (2x2)", a)
		}
		return nil
	})
	// Drained removed units are retired; 1.3 holds rows and is kept.
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		got := f.consumers(2)
		want := append(unitConsumers(2, 2), "ingest_1_3")
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return fmt.Errorf("consumers %v, want %v", got, want)
		}
		if o.Status.Units == nil || o.Status.Units.Retiring != 1 || o.Status.Rollout == nil || o.Status.Rollout.Step != topologyv1.StepRetire {
			return fmt.Errorf("units %+v rollout %+v, want 1 retiring at step Retire", o.Status.Units, o.Status.Rollout)
		}
		return nil
	})
	if !strings.Contains(st.Status.Rollout.Message, "1.3 (3 pending") {
		t.Fatalf("rollout message %q does not name the unit holding rows", st.Status.Rollout.Message)
	}
	// The unit that left with rows is published as retiring, so a worker
	// drains it even if its holder is gone; the ones deleted are not.
	eventually(t, 10*time.Second, func() error {
		if r := f.snapshot().Retiring; !slices.Equal(r, []string{"1.3"}) {
			return fmt.Errorf("retiring set %v, want [1.3]", r)
		}
		return nil
	})
	waitEvent(t, f.ns, "RetiringPublished", "1.3")
	if meta := st.Status.Conditions; len(meta) == 0 || st.Status.Phase == topologyv1.PhaseReady {
		t.Fatalf("Ready while a unit that left still holds rows")
	}
	waitEvent(t, f.ns, "UnitsRetired", "0.2")

	// The unit's last rows are worked off; then its consumer goes.
	if n := f.drain(1, 3); n != 3 {
		t.Fatalf("drained %d rows of 1.3, want 3", n)
	}
	st = f.waitReady(30 * time.Second)
	if got, want := f.consumers(2), unitConsumers(2, 2); !slices.Equal(got, want) {
		t.Fatalf("consumers %v, want %v", got, want)
	}
	if p := st.Status.Provisioned; p == nil || p.Partitions != 2 || p.ShardsPerPartition != 2 {
		t.Fatalf("provisioned %+v, want 2x2", p)
	}
	if n := f.streamRows(1); n != 3 {
		t.Fatalf("stream 1 stores %d rows, want the 3 published (no row dropped)", n)
	}
	waitEvent(t, f.ns, "UnitsRetired", "1.3")
	if r := f.snapshot().Retiring; len(r) != 0 {
		t.Fatalf("retiring set %v after every unit that left was retired, want it empty", r)
	}
	waitEvent(t, f.ns, "RetiringCleared", "empty")
}

// Under a subject transform, a new shape's consumers are provisioned while
// the streams keep routing over the active V: no row reaches a unit nobody
// may claim before activation. A change reverted while it freezes leaves
// its new consumers empty, and they are retired.
// checks P3
func TestTransformMovesOnlyAtActivationSoARevertedChangeLeavesNoRows(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 8, assignment: topologyv1.ShardAssignmentSubjectTransform})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	// b renews but never acknowledges a freeze: the change stays Freezing.
	b := startSimWorker(t, f.reg, f.key(), "b", false)
	f.waitReady(60 * time.Second)
	b.holdAcks.Store(true)

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 16 })
	eventually(t, 30*time.Second, func() error {
		if p := f.snapshot().Pending; p == nil || p.Shards != 16 {
			return fmt.Errorf("pending %+v, want 1x16", p)
		}
		if got, want := f.consumers(1), unitConsumers(1, 16); !slices.Equal(got, want) {
			return fmt.Errorf("consumers %v, want %v", got, want)
		}
		return nil
	})

	const rows = 200
	f.publishKeys(0, rows)
	pending := make([]uint64, 16)
	eventually(t, 10*time.Second, func() error {
		total := uint64(0)
		for s := range 16 {
			pending[s] = f.pending(0, s)
			total += pending[s]
		}
		if total != rows {
			return fmt.Errorf("%d of %d rows counted by the unit consumers: %v", total, rows, pending)
		}
		return nil
	})
	for s := 8; s < 16; s++ {
		if pending[s] != 0 {
			t.Fatalf("pending per shard %v: rows reached shard %d, which no one may claim while epoch 2 is pending", pending, s)
		}
	}
	if a := f.snapshot().Active; a == nil || a.Shards != 8 {
		t.Fatalf("active %+v, want 1x8 still", a)
	}

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 8 })
	st := f.waitReady(60 * time.Second)
	if got, want := f.consumers(1), unitConsumers(1, 8); !slices.Equal(got, want) {
		t.Fatalf("consumers %v after the revert, want %v", got, want)
	}
	if a := st.Status.ActiveEpoch; a == nil || a.Number != 1 || a.ShardsPerPartition != 8 {
		t.Fatalf("active %+v, want epoch 1 (1x8) kept", a)
	}
	if n := f.streamRows(0); n != rows {
		t.Fatalf("stream stores %d rows, want %d", n, rows)
	}
	waitEvent(t, f.ns, "UnitsRetired", "0.15")

	// The same change, acknowledged this time: once epoch 3 is active the
	// transform routes over 16 shards.
	b.holdAcks.Store(false)
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 16 })
	st = f.waitReady(60 * time.Second)
	if a := st.Status.ActiveEpoch; a == nil || a.ShardsPerPartition != 16 {
		t.Fatalf("active %+v, want 1x16", a)
	}
	waitEvent(t, f.ns, "TransformMoved", "16 shards")
	before := make([]uint64, 16)
	for s := range 16 {
		before[s] = f.pending(0, s)
	}
	f.publishKeys(0, rows)
	eventually(t, 10*time.Second, func() error {
		moved := uint64(0)
		for s := 8; s < 16; s++ {
			moved += f.pending(0, s) - before[s]
		}
		if moved == 0 {
			return errors.New("no new row reached shards 8..15 after epoch 3 was activated")
		}
		return nil
	})
}

// Pause holds the next step (starting a change) and resume goes on from
// where it stopped; a freeze under way is finished, not held.
func TestPauseHoldsTheNextStepAndResumeContinues(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	w := startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)

	// Paused by annotation: the change does not start.
	f.update(func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.PausedAnnotation: "true"}
		o.Spec.ShardsPerPartition = 4
	})
	st := f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhasePaused || o.Status.ObservedGeneration != o.Generation {
			return errors.New("want phase Paused at the current generation")
		}
		return nil
	})
	wantConditionOf(t, st, topologyv1.ConditionRolloutPaused, metav1.ConditionTrue, topologyv1.ReasonPaused)
	consistently(t, 2*time.Second, func() error {
		if p := f.snapshot().Pending; p != nil {
			return fmt.Errorf("epoch %d written as pending while paused", p.Number)
		}
		return nil
	})
	waitEvent(t, f.ns, "RolloutPaused", "Provision")

	// Resumed: the change goes pending; the worker holds its ack.
	w.holdAcks.Store(true)
	f.update(func(o *topologyv1.ShardTopology) { delete(o.Annotations, topologyv1.PausedAnnotation) })
	eventually(t, 20*time.Second, func() error {
		if p := f.snapshot().Pending; p == nil || p.Shards != 4 {
			return fmt.Errorf("pending %+v, want 1x4", p)
		}
		return nil
	})
	// Paused by spec between Freeze and Activate: pause does not hold a
	// freeze (every member's claims stop while it lasts, so a worker that
	// died meanwhile would never be replaced): once the ack arrives the
	// epoch is activated, paused or not.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = true })
	f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := findCondition(o, topologyv1.ConditionRolloutPaused); c == nil || c.Status != metav1.ConditionTrue || o.Status.ObservedGeneration != o.Generation {
			return errors.New("want RolloutPaused=True at the current generation")
		}
		return nil
	})
	if p := f.snapshot().Pending; p == nil || slices.Contains(p.Acked, "a") {
		t.Fatalf("pending %+v: want it unacknowledged when the pause came", p)
	}
	w.holdAcks.Store(false)
	eventually(t, 20*time.Second, func() error {
		if s := f.snapshot(); s.Pending != nil || s.Active == nil || s.Active.Shards != 4 {
			return fmt.Errorf("active %+v pending %+v: want 1x4 activated while paused", s.Active, s.Pending)
		}
		return nil
	})
	// The next change is held by the pause again, before its freeze.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 8 })
	f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhasePaused || o.Status.ObservedGeneration != o.Generation {
			return errors.New("want phase Paused at the current generation")
		}
		return nil
	})
	consistently(t, 2*time.Second, func() error {
		if p := f.snapshot().Pending; p != nil {
			return fmt.Errorf("epoch %d written as pending while paused", p.Number)
		}
		return nil
	})

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Paused = false })
	st = f.waitReady(30 * time.Second)
	if a := st.Status.ActiveEpoch; a == nil || a.ShardsPerPartition != 8 {
		t.Fatalf("active %+v, want 1x8", a)
	}
	wantConditionOf(t, st, topologyv1.ConditionRolloutPaused, metav1.ConditionFalse, topologyv1.ReasonNotPaused)
}

// Abort retires the pending epoch and keeps the active one, by annotation
// or by setting the spec back.
func TestAbortRetiresThePendingEpochAndKeepsTheActiveOne(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	w := startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	w.holdAcks.Store(true)

	pendingShards := func(want int) {
		t.Helper()
		eventually(t, 20*time.Second, func() error {
			if p := f.snapshot().Pending; p == nil || p.Shards != want {
				return fmt.Errorf("pending %+v, want shards %d", p, want)
			}
			return nil
		})
	}
	noPending := func() {
		t.Helper()
		eventually(t, 20*time.Second, func() error {
			s := f.snapshot()
			if s.Pending != nil || s.Active == nil || s.Active.Shards != 2 {
				return fmt.Errorf("active %+v pending %+v, want 1x2 and nothing pending", s.Active, s.Pending)
			}
			return nil
		})
	}

	// By annotation: the pending epoch goes, the active stays, and the
	// topology is stalled until a person reverts the spec or removes it.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	pendingShards(4)
	f.update(func(o *topologyv1.ShardTopology) {
		o.Annotations = map[string]string{topologyv1.AbortAnnotation: "true"}
	})
	noPending()
	st := f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhaseStalled {
			return errors.New("want phase Stalled")
		}
		return nil
	})
	c := wantConditionOf(t, st, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonRolloutAborted)
	if !strings.Contains(c.Message, "shardsPerPartition=2") {
		t.Fatalf("Stalled message %q does not say how to go on", c.Message)
	}
	waitEvent(t, f.ns, "RolloutAborted", "annotation")
	consistently(t, time.Second, func() error {
		if p := f.snapshot().Pending; p != nil {
			return fmt.Errorf("epoch %d pending again while aborted", p.Number)
		}
		return nil
	})
	f.update(func(o *topologyv1.ShardTopology) {
		o.Spec.ShardsPerPartition = 2
		delete(o.Annotations, topologyv1.AbortAnnotation)
	})
	f.waitReady(20 * time.Second)

	// By reverting the spec while pending.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	pendingShards(4)
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 2 })
	noPending()
	waitEvent(t, f.ns, "RolloutAborted", "no longer asks")
	st = f.waitReady(20 * time.Second)
	if a := st.Status.ActiveEpoch; a.Number != 1 {
		t.Fatalf("active epoch %d, want 1 kept", a.Number)
	}
}

// An operator restart in the middle of a rollout resumes it from the
// registry and status, not from memory.
func TestOperatorRestartMidRolloutResumes(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	op := startOperator(t, f.ns)
	f.create()
	w := startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	w.holdAcks.Store(true)

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Rollout == nil || o.Status.Rollout.Step != topologyv1.StepFreeze {
			return errors.New("want the rollout at Freeze")
		}
		return nil
	})
	op.stop()

	w.holdAcks.Store(false)
	eventually(t, 10*time.Second, func() error {
		if p := f.snapshot().Pending; p == nil || !slices.Contains(p.Acked, "a") {
			return fmt.Errorf("pending %+v not acknowledged", p)
		}
		return nil
	})
	if a := f.snapshot().Active; a.Shards != 2 {
		t.Fatalf("activated %+v with no operator running", a)
	}

	startOperator(t, f.ns)
	st := f.waitReady(30 * time.Second)
	if a := st.Status.ActiveEpoch; a == nil || a.Number != 2 || a.ShardsPerPartition != 4 || st.Status.Units.Owned != 4 {
		t.Fatalf("active %+v units %+v, want epoch 2 (1x4) fully owned", a, st.Status.Units)
	}
	// The recorder sends Events from its own goroutine: wait for the
	// second, then count.
	eventually(t, 20*time.Second, func() error {
		if n := len(listEvents(t, f.ns, "EpochActivated")); n < 2 {
			return fmt.Errorf("%d EpochActivated events", n)
		}
		return nil
	})
	if n := len(listEvents(t, f.ns, "EpochActivated")); n != 2 {
		t.Fatalf("%d EpochActivated events, want 2 (epochs 1 and 2)", n)
	}
}

// A change of N provisions the new partition's stream and consumers before
// the epoch goes pending; going back down retires the consumers of the
// partition that left once drained and keeps its stream (and rows).
// checks P3
func TestPartitionChangeProvisionsAndRetiresAStreamsConsumers(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	startSimWorker(t, f.reg, f.key(), "b", false)
	f.waitReady(60 * time.Second)

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 2 })
	st := f.waitReady(30 * time.Second)
	if a := st.Status.ActiveEpoch; a.Number != 2 || a.Partitions != 2 || st.Status.Units.Owned != 4 {
		t.Fatalf("active %+v units %+v, want epoch 2 (2x2) fully owned", a, st.Status.Units)
	}
	if got, want := f.consumers(2), unitConsumers(2, 2); !slices.Equal(got, want) {
		t.Fatalf("consumers %v, want %v", got, want)
	}
	f.publish(1, 0, 1)
	if n := f.drain(1, 0); n != 1 {
		t.Fatalf("drained %d rows", n)
	}

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 1 })
	st = f.waitReady(30 * time.Second)
	if p := st.Status.Provisioned; p == nil || p.Partitions != 1 {
		t.Fatalf("provisioned %+v, want 1x2", p)
	}
	if got, want := f.consumers(2), unitConsumers(1, 2); !slices.Equal(got, want) {
		t.Fatalf("consumers %v, want %v", got, want)
	}
	if n := f.streamRows(1); n != 1 {
		t.Fatalf("stream of partition 1 holds %d rows, want its 1 row kept", n)
	}
	waitEvent(t, f.ns, "StreamsKept", "SHARDKEEPER_INGEST_1")
}

// A change decided right after the first epoch became active (before any
// reconcile reported the first epoch's rollout done) is a rollout of its
// own from epoch 1: status.rollout.fromEpoch names it, the change waits
// in Claim for its units after activation (so the pod roll is held), and
// lastRollout records it from epoch 1, after recording the first epoch's.
// The reconciler is driven by hand so the spec moves in that window.
// checks P7
func TestAChangeRightAfterTheFirstEpochIsAChangeFromIt(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	f.create()
	rec := events.NewFakeRecorder(10000)
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: rec}
	var st *topologyv1.ShardTopology
	eventually(t, 60*time.Second, func() error {
		st = reconcileOnce(t, r, f.topo)
		if st.Status.ActiveEpoch == nil {
			return errors.New("no active epoch yet")
		}
		return nil
	})
	// The window: epoch 1 is active and its rollout still reported.
	if ro := st.Status.Rollout; ro == nil || ro.Kind != topologyv1.RolloutKindTopology || ro.FromEpoch != nil {
		t.Fatalf("rollout %+v: want the first epoch's rollout still reported after activation", ro)
	}
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	eventually(t, 60*time.Second, func() error {
		st = reconcileOnce(t, r, f.topo)
		if a := st.Status.ActiveEpoch; a == nil || a.ShardsPerPartition != 4 {
			return fmt.Errorf("active %+v, want 1x4", a)
		}
		return nil
	})
	// No worker owns the new units: the change waits in Claim, from 1.
	st = reconcileOnce(t, r, f.topo)
	ro := st.Status.Rollout
	if ro == nil || ro.Kind != topologyv1.RolloutKindTopology || ro.FromEpoch == nil || ro.FromEpoch.Number != 1 || ro.Step != topologyv1.StepClaim {
		t.Fatalf("rollout %+v: want the change from epoch 1 waiting in Claim", ro)
	}
	if l := st.Status.LastRollout; l == nil || l.From != "" || l.To != "epoch 1 (1x2)" {
		t.Fatalf("last rollout %+v: want the first epoch's, to epoch 1", l)
	}
	// A worker claims every unit: the change finishes, from epoch 1.
	startSimWorker(t, f.reg, f.key(), "a", false)
	eventually(t, 60*time.Second, func() error {
		st = reconcileOnce(t, r, f.topo)
		if st.Status.Rollout != nil {
			return fmt.Errorf("rollout %+v still reported", st.Status.Rollout)
		}
		return nil
	})
	if l := st.Status.LastRollout; l == nil || l.From != "epoch 1 (1x2)" || !strings.HasPrefix(l.To, "epoch 2 (1x4)") || l.Result != topologyv1.RolloutSucceeded {
		t.Fatalf("last rollout %+v: want the change from epoch 1 (1x2) to epoch 2 (1x4), succeeded", l)
	}
}
