package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// deleteCounter is a client that counts the pod Deletes it sends.
type deleteCounter struct {
	client.Client
	mu      sync.Mutex
	deletes []string
}

func newDeleteCounter(t *testing.T) *deleteCounter {
	t.Helper()
	d := &deleteCounter{}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	d.Client = interceptor.NewClient(wc, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		if _, ok := obj.(*corev1.Pod); ok {
			d.mu.Lock()
			d.deletes = append(d.deletes, obj.GetName())
			d.mu.Unlock()
		}
		return c.Delete(ctx, obj, opts...)
	}})
	return d
}

func (d *deleteCounter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.deletes)
}

// Issue 21: an operator leader paused in the middle of a pod roll, that
// resumes after another leader took over, must neither delete the pod
// from its old reading nor undo the new leader's decision about the drain
// request. The old leader asked ingest-0 to hand over and was about to
// delete it; a new leader then took the topology's operator token and
// lifted the drain request. The old leader's next reconcile is refused in
// the registry before any Delete goes out, writes no status, and asks to
// stop; the new leader's roll then deletes the pod. Before operator
// tokens, the old leader set the drain request again and deleted the pod.
// checks P1, checks P7
func TestAResumedOldLeaderNeitherDeletesAPodNorUndoesTheNewLeadersDrain(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	sts := f.withStatefulSet(1, "w")
	if err := k.Get(ctx, client.ObjectKeyFromObject(sts), sts); err != nil {
		t.Fatal(err)
	}
	pod := handMadePod(t, sts, "ingest-0", "rev-1")
	setUpdateRevision(t, sts, "rev-1")
	f.create()

	oldClient := newDeleteCounter(t)
	var supersededCalls []error
	old := &controllers.ShardTopologyReconciler{Client: oldClient, Recorder: events.NewFakeRecorder(10000),
		Conns:        &controllers.Connections{Identity: "operator-old"},
		OnSuperseded: func(err error) { supersededCalls = append(supersededCalls, err) }}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.topo)}
	eventually(t, 60*time.Second, func() error {
		_, _ = old.Reconcile(ctx, req)
		if s, err := f.reg.Snapshot(ctx, f.key()); err != nil || s.Active == nil {
			return fmt.Errorf("no active epoch yet (%v)", err)
		}
		return nil
	})
	tok, err := f.reg.OperatorToken(ctx, f.key())
	if err != nil {
		t.Fatal(err)
	}
	if tok.Holder != "operator-old" {
		t.Fatalf("operator token %+v, want one held by operator-old", tok)
	}

	// A new template: the old leader asks ingest-0 to hand over, and
	// pauses right there (the test stops calling it), before the
	// reconcile that would delete the pod.
	setUpdateRevision(t, sts, "rev-2")
	eventually(t, 30*time.Second, func() error {
		_, _ = old.Reconcile(ctx, req)
		if m := f.snapshot().Member("ingest-0"); m == nil || !m.Draining {
			return errors.New("ingest-0 not asked to hand over yet")
		}
		return nil
	})
	if n := oldClient.count(); n != 0 {
		t.Fatalf("the old leader deleted %d pods before pausing", n)
	}
	inFlight := f.get()
	if ro := inFlight.Status.Rollout; ro == nil || len(ro.Pods) == 0 {
		t.Fatalf("status shows no pod roll in flight: %+v", inFlight.Status.Rollout)
	}

	// A new leader takes over and decides otherwise about the drain.
	newTok, err := f.reg.TakeOperatorToken(ctx, f.key(), "operator-new")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.AsOperator(newTok).SetDraining(ctx, f.key(), "ingest-0", false); err != nil {
		t.Fatal(err)
	}

	// The old leader resumes.
	for i := range 2 {
		_, err := old.Reconcile(ctx, req)
		if !errors.Is(err, poolctl.ErrOperatorSuperseded) || !errors.Is(err, reconcile.TerminalError(nil)) {
			t.Fatalf("old leader's reconcile %d after the takeover returned %v, want a terminal operator token refusal", i+1, err)
		}
	}
	if n := oldClient.count(); n != 0 {
		t.Fatalf("the old leader sent %d pod deletes after it was superseded", n)
	}
	if len(supersededCalls) != 1 {
		t.Fatalf("OnSuperseded called %d times, want once", len(supersededCalls))
	}
	if m := f.snapshot().Member("ingest-0"); m == nil || m.Draining {
		t.Fatalf("member ingest-0 %+v: the old leader undid the new leader's drain decision", m)
	}
	got := &corev1.Pod{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil || got.UID != pod.UID || got.DeletionTimestamp != nil {
		t.Fatalf("pod ingest-0 after the old leader resumed: %v, deleting %v (want the same pod, not deleting)", err, got.DeletionTimestamp)
	}
	if after := f.get(); after.ResourceVersion != inFlight.ResourceVersion {
		t.Fatalf("the superseded leader wrote the object (resourceVersion %s -> %s)", inFlight.ResourceVersion, after.ResourceVersion)
	}

	// The leader that holds the token now goes on with the roll.
	newClient := newDeleteCounter(t)
	leader := &controllers.ShardTopologyReconciler{Client: newClient, Recorder: events.NewFakeRecorder(10000),
		Conns: &controllers.Connections{Identity: "operator-new"}}
	eventually(t, 60*time.Second, func() error {
		_, _ = leader.Reconcile(ctx, req)
		if newClient.count() == 0 {
			st := f.get().Status
			return fmt.Errorf("the current leader has not deleted ingest-0 yet (rollout %+v)", st.Rollout)
		}
		return nil
	})
	got = &corev1.Pod{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(pod), got); err == nil && got.UID == pod.UID && got.DeletionTimestamp == nil {
		t.Fatalf("pod ingest-0 still there after the current leader's delete")
	}
}

// Issue 21: a superseded leader that sees the topology being deleted
// writes nothing either: no deleting status, no registry rows removed, no
// finalizer lifted. The leader that holds the token finishes the deletion.
func TestASupersededLeaderLeavesADeletionToTheCurrentOne(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(1, "w")
	f.create()
	old := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(10000),
		Conns: &controllers.Connections{Identity: "operator-old"}, OnSuperseded: func(error) {}}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.topo)}
	eventually(t, 60*time.Second, func() error {
		_, rerr := old.Reconcile(ctx, req)
		if s, err := f.reg.Snapshot(ctx, f.key()); err != nil || s.Active == nil {
			return fmt.Errorf("no active epoch yet (%v; reconcile: %v; status %+v)", err, rerr, f.get().Status.Conditions)
		}
		return nil
	})
	if _, err := f.reg.TakeOperatorToken(ctx, f.key(), "operator-new"); err != nil {
		t.Fatal(err)
	}
	// The old leader learns it was superseded at its next registry write
	// (the RESET verdict of the census its activation asked for, once that
	// census finished).
	eventually(t, 30*time.Second, func() error {
		if _, err := old.Reconcile(ctx, req); !errors.Is(err, poolctl.ErrOperatorSuperseded) {
			return fmt.Errorf("old leader's reconcile after the takeover returned %v, want a refusal", err)
		}
		return nil
	})
	if err := k.Delete(ctx, f.get()); err != nil {
		t.Fatal(err)
	}
	deleting := f.get()
	if deleting.DeletionTimestamp.IsZero() {
		t.Fatal("setup: the topology is not being deleted")
	}

	_, err := old.Reconcile(ctx, req)
	if !errors.Is(err, poolctl.ErrOperatorSuperseded) || !errors.Is(err, reconcile.TerminalError(nil)) {
		t.Fatalf("old leader's reconcile of the deletion returned %v, want a terminal operator token refusal", err)
	}
	if after := f.get(); after.ResourceVersion != deleting.ResourceVersion {
		t.Fatalf("the superseded leader wrote the deleting object (resourceVersion %s -> %s, finalizers %v)",
			deleting.ResourceVersion, after.ResourceVersion, after.Finalizers)
	}
	if s, err := f.reg.Snapshot(ctx, f.key()); err != nil || s.Active == nil {
		t.Fatalf("registry after the superseded leader's pass: %v (active %v), want the topology still there", err, s.Active)
	}

	leader := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(10000),
		Conns: &controllers.Connections{Identity: "operator-new"}}
	eventually(t, 60*time.Second, func() error {
		_, _ = leader.Reconcile(ctx, req)
		got := &topologyv1.ShardTopology{}
		if err := k.Get(ctx, req.NamespacedName, got); !apierrors.IsNotFound(err) {
			return fmt.Errorf("topology still there (%v, finalizers %v)", err, got.Finalizers)
		}
		return nil
	})
}
