package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// handMadePod creates pod name of the workload by hand (the test plays
// the StatefulSet controller and the kubelet): owned by sts, at revision,
// and Ready.
func handMadePod(t *testing.T, sts *appsv1.StatefulSet, name, revision string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sts.Namespace,
			Labels: map[string]string{"app": "ingest", appsv1.ControllerRevisionHashLabelKey: revision},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID,
				Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "w"}}},
	}
	if err := k.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if err := k.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// setUpdateRevision plays the StatefulSet controller: it has seen the
// current spec, and its update revision is rev.
func setUpdateRevision(t *testing.T, sts *appsv1.StatefulSet, rev string) {
	t.Helper()
	ctx := context.Background()
	cur := &appsv1.StatefulSet{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(sts), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.ObservedGeneration = cur.Generation
	cur.Status.UpdateRevision, cur.Status.CurrentRevision = rev, rev
	cur.Status.Replicas = *cur.Spec.Replicas
	if err := k.Status().Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
}

// A pod roll deletes a pod only if its member holds nothing at the moment
// of the delete. The worker of the pod being rolled joins and claims a
// unit just before the operator's Delete reaches the API server (the
// window between the registry reading and the delete): whether it never
// joined before or had left, the operator's drain request is already in
// the registry, so the claim is refused (poolctl.ErrDraining) and the pod
// goes holding nothing, as the PodDeleted Event says. Before the fix the
// roll asked for a drain only for a member that existed and had not left,
// judged "holds nothing" from the reconcile's first snapshot, and deleted
// a pod whose worker had just claimed a unit.
// checks P1, checks P3, checks P7
func TestPodRollDeletesAPodOnlyIfItsMemberHoldsNothingAtTheDelete(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before is what the pod's worker did before the roll started.
		before string
	}{
		{"a worker that had not joined yet", "absent"},
		{"a worker that had left", "left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, fleetInput{partitions: 1, shards: 2})
			sts := f.withStatefulSet(1, "w")
			if err := k.Get(context.Background(), client.ObjectKeyFromObject(sts), sts); err != nil {
				t.Fatal(err)
			}
			handMadePod(t, sts, "ingest-0", "rev-1")
			setUpdateRevision(t, sts, "rev-1")
			f.create()

			// The worker of ingest-0 joins (with its own registry handle)
			// just before the operator's Delete of its pod goes out, and
			// claims a unit if the registry lets it.
			var (
				mu        sync.Mutex
				deletes   int
				claimErr  error
				heldAtDel int
			)
			hook := interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				if _, ok := obj.(*corev1.Pod); ok && obj.GetName() == "ingest-0" {
					l, err := f.reg.Join(ctx, f.key(), "ingest-0")
					if err != nil {
						return fmt.Errorf("test worker join: %w", err)
					}
					_, cerr := f.reg.Claim(ctx, l.MemberRef, 1, "0.0")
					held := 0
					if m := f.snapshot().Member("ingest-0"); m != nil {
						held = m.Holds
					}
					mu.Lock()
					deletes++
					claimErr, heldAtDel = cerr, held
					mu.Unlock()
				}
				return c.Delete(ctx, obj, opts...)
			}}
			wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k.Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			ic := interceptor.NewClient(wc, hook)
			rec := events.NewFakeRecorder(10000)
			r := &controllers.ShardTopologyReconciler{Client: ic, Recorder: rec}
			reconcile := func() {
				_, _ = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.topo)})
			}

			// The first epoch is active before the roll.
			eventually(t, 60*time.Second, func() error {
				reconcile()
				s, err := f.reg.Snapshot(context.Background(), f.key())
				if err != nil {
					return err
				}
				if s.Active == nil {
					return errors.New("no active epoch yet")
				}
				return nil
			})
			if tc.before == "left" {
				l, err := f.reg.Join(context.Background(), f.key(), "ingest-0")
				if err != nil {
					t.Fatal(err)
				}
				if err := f.reg.Leave(context.Background(), l.MemberRef); err != nil {
					t.Fatal(err)
				}
			}

			// A new template revision: ingest-0 is outdated.
			setUpdateRevision(t, sts, "rev-2")
			eventually(t, 60*time.Second, func() error {
				reconcile()
				mu.Lock()
				defer mu.Unlock()
				if deletes == 0 {
					return errors.New("the roll has not deleted ingest-0 yet")
				}
				return nil
			})
			// The fault took effect: the worker did join and ask for a
			// unit right before the Delete.
			m := f.snapshot().Member("ingest-0")
			if m == nil || !m.Live {
				t.Fatalf("member %+v: the test's worker did not join before the delete", m)
			}
			mu.Lock()
			defer mu.Unlock()
			if heldAtDel != 0 || claimErr == nil {
				t.Fatalf("pod ingest-0 deleted while its member held %d units (its claim returned %v)", heldAtDel, claimErr)
			}
			if !errors.Is(claimErr, poolctl.ErrDraining) {
				t.Fatalf("the worker's claim was refused with %v, want poolctl.ErrDraining", claimErr)
			}
			if !m.Draining {
				t.Fatalf("member %+v not draining after its pod was deleted", m)
			}
			if err := k.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "ingest-0"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
				t.Fatalf("pod ingest-0 still there (%v)", err)
			}
			var notes []string
			for len(rec.Events) > 0 {
				notes = append(notes, <-rec.Events)
			}
			found := false
			for _, n := range notes {
				if strings.Contains(n, "PodDeleted") && strings.Contains(n, "holding no units under a drain request") {
					found = true
				}
			}
			if !found {
				t.Fatalf("no PodDeleted Event saying the registry showed no units under a drain request: %q", notes)
			}
		})
	}
}

// A pod roll is not held for ever behind an activated change whose units
// nobody claims. The worker here reads N and V only at start: it
// acknowledges the freeze but never claims the units the change added, so
// the change stays in Claim; the template changed with it (a restart is
// the fix). Status names the pod roll waiting behind the change, and once
// claims can no longer be expected (the handover bound since the change
// started) the roll goes on: the pod is asked to hand over. Before the
// fix the roll waited in Claim for ever, and status did not name it.
// checks P7
func TestPodRollGoesOnBehindAChangeWhoseUnitsNobodyClaims(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	sts := f.withStatefulSet(1, "w")
	if err := k.Get(context.Background(), client.ObjectKeyFromObject(sts), sts); err != nil {
		t.Fatal(err)
	}
	handMadePod(t, sts, "ingest-0", "rev-1")
	setUpdateRevision(t, sts, "rev-1")
	f.create()
	rec := events.NewFakeRecorder(10000)
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: rec}
	eventually(t, 60*time.Second, func() error {
		st := reconcileOnce(t, r, f.topo)
		if st.Status.ActiveEpoch == nil {
			return errors.New("no active epoch yet")
		}
		return nil
	})
	m := joinReporting(t, f, "ingest-0")
	t0, t1 := m.claim(t, 1, "0.0"), m.claim(t, 1, "0.1")
	m.set(flowing("0.0", t0.Epoch, true), flowing("0.1", t1.Epoch, true))
	eventually(t, 30*time.Second, func() error {
		if st := reconcileOnce(t, r, f.topo); st.Status.Phase != topologyv1.PhaseReady {
			return fmt.Errorf("phase %s, want Ready", st.Status.Phase)
		}
		return nil
	})

	// V 2 -> 4 and a new template at once.
	f.update(func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 4 })
	setUpdateRevision(t, sts, "rev-2")
	ackAndReconcile := func() *topologyv1.ShardTopology {
		if p := f.snapshot().Pending; p != nil {
			if err := f.reg.AckFreeze(context.Background(), m.lease.MemberRef, p.Number); err != nil {
				t.Fatal(err)
			}
		}
		return reconcileOnce(t, r, f.topo)
	}
	named := false
	eventually(t, 60*time.Second, func() error {
		st := ackAndReconcile()
		if ro := st.Status.Rollout; ro != nil && strings.Contains(ro.Message, "pod roll: pod ingest-0 waits for the topology change to settle") {
			named = true
		}
		if mm := f.snapshot().Member("ingest-0"); mm == nil || !mm.Draining {
			return fmt.Errorf("ingest-0 not asked to hand over (rollout %+v)", st.Status.Rollout)
		}
		return nil
	})
	s := f.snapshot()
	if s.Active == nil || s.Active.Shards != 4 {
		t.Fatalf("active %+v: want the change activated before the roll went on", s.Active)
	}
	total, owned := 4, 0
	for _, c := range mustClaims(t, f) {
		if c.State != poolctl.StateFree && c.Owner != "" {
			owned++
		}
	}
	if owned == total {
		t.Fatal("every unit was owned: the change was not waiting in Claim, so this does not show the deadlock")
	}
	if !named {
		t.Fatal("status never named the pod roll waiting behind the change")
	}
}

func mustClaims(t *testing.T, f *fleet) []poolctl.ClaimInfo {
	t.Helper()
	cs, err := f.reg.Claims(context.Background(), f.key())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// maxPodsAtOnce holds even when status lost the entry of a pod in flight
// (an operator crash between the delete and the status write, or a
// status write that did not land): the roll judges which pods are down
// from the pods themselves. With ingest-1 gone (deleted, not recreated
// yet) or terminating, and nothing in flight in status, ingest-0 is not
// asked to hand over, let alone deleted; status says what it waits for.
// Before the fix only a pod at the update revision that was not Ready
// held the roll, so ingest-0 went down beside ingest-1.
// checks P7
func TestPodRollTakesNoSecondPodDownWhenStatusLostTheFirst(t *testing.T) {
	for _, tc := range []struct {
		name, state, want string
	}{
		{"the other pod is gone", "missing", "waits for pod ingest-1 to be created"},
		{"the other pod is terminating", "terminating", "waits for pod ingest-1 to terminate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, fleetInput{partitions: 1, shards: 2})
			sts := f.withStatefulSet(2, "w")
			ctx := context.Background()
			if err := k.Get(ctx, client.ObjectKeyFromObject(sts), sts); err != nil {
				t.Fatal(err)
			}
			handMadePod(t, sts, "ingest-0", "rev-1")
			if tc.state == "terminating" {
				p := handMadePod(t, sts, "ingest-1", "rev-1")
				p.Finalizers = []string{"test.shardkeeper.dev/hold"}
				if err := k.Update(ctx, p); err != nil {
					t.Fatal(err)
				}
				if err := k.Delete(ctx, p); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					cur := &corev1.Pod{}
					if k.Get(ctx, client.ObjectKeyFromObject(p), cur) == nil {
						cur.Finalizers = nil
						_ = k.Update(ctx, cur)
					}
				})
			}
			setUpdateRevision(t, sts, "rev-2")
			f.create()
			r := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(10000)}
			eventually(t, 60*time.Second, func() error {
				st := reconcileOnce(t, r, f.topo)
				if st.Status.ActiveEpoch == nil {
					return errors.New("no active epoch yet")
				}
				return nil
			})
			var msg string
			consistently(t, 3*time.Second, func() error {
				st := reconcileOnce(t, r, f.topo)
				if ro := st.Status.Rollout; ro != nil {
					msg = ro.Message
				}
				if err := k.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "ingest-0"}, &corev1.Pod{}); err != nil {
					return fmt.Errorf("ingest-0 deleted while ingest-1 is %s: %v", tc.state, err)
				}
				if m := f.snapshot().Member("ingest-0"); m != nil && m.Draining {
					return fmt.Errorf("ingest-0 asked to hand over while ingest-1 is %s", tc.state)
				}
				return nil
			})
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("rollout message %q does not say %q", msg, tc.want)
			}
		})
	}
}
