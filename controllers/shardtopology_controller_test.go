package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/operator"
)

func sampleTopology(ns string) *topologyv1.ShardTopology {
	return &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions:         4,
			ShardsPerPartition: 8,
			NATS: topologyv1.NATSSpec{
				URLs:                       []string{"nats://nats:4222"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "nats", Key: "sys.creds"},
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
		},
	}
}

func createSecret(t *testing.T, ns, name string, keys ...string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{}}
	for _, key := range keys {
		s.Data[key] = []byte("value-of-" + key)
	}
	if err := k.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func createStatefulSet(t *testing.T, ns, name string) {
	t.Helper()
	labels := map[string]string{"app": name}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "shardkeeper-worker"}}},
			},
		},
	}
	if err := k.Create(context.Background(), sts); err != nil {
		t.Fatal(err)
	}
}

// reconcileOnce runs one reconcile of the reconciler against the real API
// server and returns the object as stored afterwards.
func reconcileOnce(t *testing.T, r *controllers.ShardTopologyReconciler, o *topologyv1.ShardTopology) *topologyv1.ShardTopology {
	t.Helper()
	ctx := context.Background()
	_, _ = r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(o)})
	got := &topologyv1.ShardTopology{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func condition(t *testing.T, o *topologyv1.ShardTopology, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(o.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, o.Status.Conditions)
	}
	return *c
}

func wantCondition(t *testing.T, o *topologyv1.ShardTopology, typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	c := condition(t, o, typ)
	if c.Status != status || c.Reason != reason {
		t.Fatalf("%s = %s/%s (%s), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return c
}

// checks P7: a new object never reads as healthy, and a bad spec is
// reported as Stalled with the field named.
func TestReconcileReportsFirstSightThenStallsOnMissingSecret(t *testing.T) {
	ns := newNamespace(t)
	createStatefulSet(t, ns, "ingest")
	o := sampleTopology(ns)
	if err := k.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(20)
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: rec}

	got := reconcileOnce(t, r, o)
	wantCondition(t, got, topologyv1.ConditionReady, metav1.ConditionUnknown, topologyv1.ReasonFirstSeen)
	wantCondition(t, got, topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonFirstSeen)
	if got.Status.Phase != topologyv1.PhasePending {
		t.Fatalf("phase %q on first sight, want Pending", got.Status.Phase)
	}

	got = reconcileOnce(t, r, o)
	c := wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound)
	if !strings.Contains(c.Message, "spec.registry.dsnSecretRef") || !strings.Contains(c.Message, `"registry"`) {
		t.Fatalf("Stalled message %q does not name the field and the Secret", c.Message)
	}
	wantCondition(t, got, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonSecretNotFound)
	wantCondition(t, got, topologyv1.ConditionReconciling, metav1.ConditionFalse, topologyv1.ReasonSecretNotFound)
	if got.Status.Phase != topologyv1.PhaseStalled || got.Status.ObservedGeneration != got.Generation {
		t.Fatalf("phase %q observedGeneration %d (generation %d), want Stalled at the current generation",
			got.Status.Phase, got.Status.ObservedGeneration, got.Generation)
	}
	wantEvent(t, rec, "Warning SecretNotFound")

	// The registry Secret appears but the NATS one lacks its key.
	createSecret(t, ns, "registry", "dsn")
	createSecret(t, ns, "nats", "app.creds")
	got = reconcileOnce(t, r, o)
	c = wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretKeyMissing)
	if !strings.Contains(c.Message, "spec.nats.systemCredentialsSecretRef") || !strings.Contains(c.Message, `"sys.creds"`) {
		t.Fatalf("Stalled message %q does not name the field and the key", c.Message)
	}
}

// checks P7: every error that stops progress appears in status, and the
// registry's DSN never does.
func TestUnreachableRegistryIsReportedInStatus(t *testing.T) {
	ns := newNamespace(t)
	createStatefulSet(t, ns, "ingest")
	ctx := context.Background()
	dsn := "postgres://shardkeeper:hunter2-secret@127.0.0.1:1/registry?sslmode=disable&connect_timeout=1"
	if err := k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns}, StringData: map[string]string{"dsn": dsn}}); err != nil {
		t.Fatal(err)
	}
	createSecret(t, ns, "nats", "sys.creds")
	o := sampleTopology(ns)
	if err := k.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(50)}
	reconcileOnce(t, r, o)
	got := reconcileOnce(t, r, o)

	c := wantCondition(t, got, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonReconcileError)
	wantCondition(t, got, topologyv1.ConditionReconciling, metav1.ConditionTrue, topologyv1.ReasonReconcileError)
	wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonReconcileError)
	if !strings.Contains(c.Message, "registry") || strings.Contains(c.Message, "hunter2") || strings.Contains(c.Message, dsn) {
		t.Fatalf("Ready message %q: want the registry named and no DSN or password", c.Message)
	}
	if got.Status.ObservedGeneration == got.Generation {
		t.Fatalf("observedGeneration %d moved although a step failed", got.Status.ObservedGeneration)
	}
	if !controllerutil.ContainsFinalizer(got, topologyv1.Finalizer) {
		t.Fatalf("no finalizer on %v", got.Finalizers)
	}
}

// A StatefulSet that rolls its own pods would defeat the hand-over before
// each restart: the operator refuses it and says what to change.
func TestStallsWhenWorkloadIsNotOnDelete(t *testing.T) {
	ns := newNamespace(t)
	labels := map[string]string{"app": "ingest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "w"}}},
			},
		},
	}
	if err := k.Create(context.Background(), sts); err != nil {
		t.Fatal(err)
	}
	createSecret(t, ns, "registry", "dsn")
	createSecret(t, ns, "nats", "sys.creds")
	o := sampleTopology(ns)
	if err := k.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(20)}
	reconcileOnce(t, r, o)
	got := reconcileOnce(t, r, o)
	c := wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonWorkloadUpdateStrategy)
	if !strings.Contains(c.Message, "spec.workload.statefulSetName") || !strings.Contains(c.Message, "OnDelete") {
		t.Fatalf("Stalled message %q does not name the field and what is required", c.Message)
	}
}

// The manager's watches bring a stalled topology back as soon as the
// missing Secret appears, and every transition is a real Event.
func TestManagerRecoversWhenSecretAppears(t *testing.T) {
	ns := newNamespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := operator.New(ctx, cfg, operator.Options{
		MetricsAddr: "0", ProbeAddr: "0",
		Cache:                        cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		SkipControllerNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	createStatefulSet(t, ns, "ingest")
	createSecret(t, ns, "nats", "sys.creds")
	o := sampleTopology(ns)
	if err := k.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, o, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound)

	// The registry Secret appears (with a DSN that reaches nothing): the
	// stall ends and the connection error takes its place in status.
	createSecret(t, ns, "registry", "dsn")
	waitCondition(t, o, topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonReconcileError)

	eventually(t, 20*time.Second, func() error {
		var list eventsv1.EventList
		if err := k.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		reasons := map[string]bool{}
		for _, e := range list.Items {
			reasons[e.Type+" "+e.Reason] = true
		}
		for _, want := range []string{"Warning SecretNotFound", "Warning ReconcileError"} {
			if !reasons[want] {
				return fmt.Errorf("no %q Event among %v", want, reasons)
			}
		}
		return nil
	})
}

func waitCondition(t *testing.T, o *topologyv1.ShardTopology, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		got := &topologyv1.ShardTopology{}
		if err := k.Get(context.Background(), client.ObjectKeyFromObject(o), got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s is %+v, want %s/%s", typ, c, status, reason)
		}
		return nil
	})
}

func wantEvent(t *testing.T, rec *events.FakeRecorder, prefix string) {
	t.Helper()
	for {
		select {
		case e := <-rec.Events:
			if strings.HasPrefix(e, prefix) {
				return
			}
		default:
			t.Fatalf("no event starting with %q", prefix)
		}
	}
}
