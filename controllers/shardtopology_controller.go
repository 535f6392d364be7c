package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// ControllerName names the reconciler in logs, metrics and as the reporting
// controller of its Events.
const ControllerName = "shardtopology"

// Field indexes that map a Secret or StatefulSet back to the ShardTopologies
// that reference it, so a missing one appearing triggers a reconcile at once.
const (
	indexSecretRefs  = "spec.secretRefs"
	indexStatefulSet = "spec.workload.statefulSetName"
)

// ShardTopologyReconciler reconciles ShardTopology objects.
type ShardTopologyReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Now is the clock for condition transition times; nil means time.Now.
	Now func() time.Time
}

// +kubebuilder:rbac:groups=topology.shardkeeper.dev,resources=shardtopologies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=topology.shardkeeper.dev,resources=shardtopologies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=topology.shardkeeper.dev,resources=shardtopologies/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile loads one ShardTopology, runs the steps in order and patches its
// status once, at the end, whatever happened.
func (r *ShardTopologyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	logger := log.FromContext(ctx)

	topo := &topologyv1.ShardTopology{}
	if err := r.Client.Get(ctx, req.NamespacedName, topo); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !topo.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	s := newScope(topo, r.now())
	if s.firstSight() {
		// Write Ready=Unknown and Reconciling=True before doing anything, so
		// a GitOps tool never reads a new object as healthy. The status
		// patch wakes the next reconcile.
		return ctrl.Result{}, r.patchStatus(ctx, s, firstSightStatus(topo, s.now))
	}

	defer func() {
		status := computeStatus(topo, s.observation(retErr), s.now)
		if err := r.patchStatus(ctx, s, status); err != nil {
			retErr = err
		}
	}()

	result, err := runSteps(ctx, r, s, reconcileSteps)
	if err != nil {
		logger.Error(err, "Reconcile step failed", "step", s.failedStep)
		return ctrl.Result{}, err
	}
	return result, nil
}

func (r *ShardTopologyReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// patchStatus writes status when it differs from what was read, with
// optimistic locking so a concurrent writer makes us retry instead of
// clobbering it, and records an Event for every condition that changed.
func (r *ShardTopologyReconciler) patchStatus(ctx context.Context, s *scope, status topologyv1.ShardTopologyStatus) error {
	before := s.topo
	if statusEqual(before.Status, status) {
		return nil
	}
	after := before.DeepCopy()
	after.Status = status
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := r.Client.Status().Patch(ctx, after, patch); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// Someone else wrote first (or the object is gone); the watch
			// brings us back with fresh data.
			log.FromContext(ctx).V(1).Info("Status patch skipped", "reason", err.Error())
			return nil
		}
		return fmt.Errorf("patch status of %s/%s: %w", after.Namespace, after.Name, err)
	}
	for _, t := range conditionTransitions(before.Status.Conditions, status.Conditions) {
		r.Recorder.Eventf(after, nil, t.eventType, t.reason, t.action, "%s", t.note)
	}
	return nil
}

// SetupWithManager registers the reconciler and its watches: ShardTopology
// itself, and the Secrets and StatefulSets it references.
func (r *ShardTopologyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &topologyv1.ShardTopology{}, indexSecretRefs, func(o client.Object) []string {
		return referencedSecrets(&o.(*topologyv1.ShardTopology).Spec)
	}); err != nil {
		return fmt.Errorf("index %s: %w", indexSecretRefs, err)
	}
	if err := idx.IndexField(ctx, &topologyv1.ShardTopology{}, indexStatefulSet, func(o client.Object) []string {
		return []string{o.(*topologyv1.ShardTopology).Spec.Workload.StatefulSetName}
	}); err != nil {
		return fmt.Errorf("index %s: %w", indexStatefulSet, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&topologyv1.ShardTopology{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.referencing(indexSecretRefs))).
		Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(r.referencing(indexStatefulSet))).
		Complete(r)
}

// referencing maps an object to the ShardTopologies in its namespace whose
// index holds its name.
func (r *ShardTopologyReconciler) referencing(index string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var list topologyv1.ShardTopologyList
		if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{index: o.GetName()}); err != nil {
			log.FromContext(ctx).Error(err, "List referencing ShardTopologies failed", "index", index)
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, t := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: t.Namespace, Name: t.Name}})
		}
		return reqs
	}
}
