package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// Deleting a ShardTopology waits while live workers hold units, then
// retires the drained consumers, keeps the ones holding rows and every
// stream, keeps the registry rows, and lets the object go.
// checks P3
func TestFinalizerRetiresDrainedConsumersKeepsRowsAndWaitsForWorkers(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	w := startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)
	f.publish(0, 1, 2)

	if err := k.Delete(context.Background(), f.get()); err != nil {
		t.Fatal(err)
	}
	st := f.waitStatus(20*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhaseDeleting || !strings.Contains(o.Status.Progress, "live workers (a) hold 2 units") {
			return errors.New("want phase Deleting waiting for worker a")
		}
		return nil
	})
	wantConditionOf(t, st, topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonDeleting)
	if got := f.consumers(1); len(got) != 2 {
		t.Fatalf("consumers %v retired under a live worker", got)
	}

	w.stop() // releases and leaves, as a worker does on SIGTERM
	eventually(t, 30*time.Second, func() error {
		err := k.Get(context.Background(), client.ObjectKeyFromObject(f.topo), &topologyv1.ShardTopology{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("ShardTopology still there (%v)", err)
		}
		return nil
	})
	if got := f.consumers(1); !slices.Equal(got, []string{"ingest_0_1"}) {
		t.Fatalf("consumers %v, want only ingest_0_1, which holds rows", got)
	}
	if n := f.streamRows(0); n != 2 {
		t.Fatalf("stream holds %d rows, want the 2 published", n)
	}
	// Events reach the API server after the reconcile that recorded them
	// (the recorder sends them from its own goroutine): wait for each.
	for _, want := range []string{"ConsumersKept", "StreamsKept", "RegistryRowsKept", "UnitsRetired"} {
		waitEvent(t, f.ns, want, "")
	}
	if s := f.snapshot(); s.Active == nil || s.Reset.Allowed {
		t.Fatalf("registry rows gone or RESET still allowed: active %+v reset %+v", s.Active, s.Reset)
	}
}

// When the registry cannot be reached the finalizer stays and status says
// why; the Orphan deletion policy lets the object go, keeping everything.
func TestDeletionWithUnreachableRegistryKeepsTheFinalizerUntilOrphaned(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	createStatefulSet(t, ns, "ingest")
	if err := k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns},
		StringData: map[string]string{"dsn": "postgres://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=1"}}); err != nil {
		t.Fatal(err)
	}
	createSecret(t, ns, "nats", "sys.creds")
	startOperator(t, ns)
	o := sampleTopology(ns)
	if err := k.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(got, topologyv1.Finalizer) {
			return errors.New("no finalizer yet")
		}
		return nil
	})
	if err := k.Delete(ctx, o); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			return err
		}
		c := findCondition(got, topologyv1.ConditionReady)
		if got.Status.Phase != topologyv1.PhaseDeleting || c == nil || c.Reason != topologyv1.ReasonReconcileError || !strings.Contains(c.Message, "registry") {
			return fmt.Errorf("phase %s Ready %+v, want Deleting with the registry error", got.Status.Phase, c)
		}
		return nil
	})

	err := retryUpdate(ctx, o, func(t *topologyv1.ShardTopology) {
		t.Annotations = map[string]string{topologyv1.DeletionPolicyAnnotation: topologyv1.DeletionPolicyOrphan}
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		if err := k.Get(ctx, client.ObjectKeyFromObject(o), &topologyv1.ShardTopology{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	waitEvent(t, ns, "Orphaned", "")
}

func findCondition(o *topologyv1.ShardTopology, typ string) *metav1.Condition {
	for i := range o.Status.Conditions {
		if o.Status.Conditions[i].Type == typ {
			return &o.Status.Conditions[i]
		}
	}
	return nil
}

func retryUpdate(ctx context.Context, o *topologyv1.ShardTopology, mutate func(*topologyv1.ShardTopology)) error {
	for i := 0; ; i++ {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			return err
		}
		mutate(got)
		err := k.Update(ctx, got)
		if !apierrors.IsConflict(err) || i == 10 {
			return err
		}
	}
}
