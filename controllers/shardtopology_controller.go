package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

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

// maxRetryDelay caps the backoff after errors, so that a rollout waiting on
// a NATS outage resumes within a minute of its end. Registry errors do not
// back off (registryRetry): fenced workers may be waiting on this operator.
const maxRetryDelay = time.Minute

// ShardTopologyReconciler reconciles ShardTopology objects.
type ShardTopologyReconciler struct {
	Client client.Client
	// APIReader reads Secrets and the workload's pods straight from the
	// API server, so that no informer caches every Secret or pod of the
	// cluster; nil means Client.
	APIReader client.Reader
	// SecretReader reads the Secrets the spec names; nil means APIReader.
	// Only the --full-secret-cache comparison sets it (to the cached
	// client).
	SecretReader client.Reader
	// SecretMetadata reads Secrets' metadata from the manager's
	// metadata-only cache, so a Secret is read from the API server again
	// only when its resourceVersion moved (readSecret); nil means at every
	// reconcile.
	SecretMetadata client.Reader
	Recorder       events.EventRecorder
	// Conns caches registry and NATS connections per topology; nil means
	// a cache private to this reconciler.
	Conns *Connections
	// CensusInterval is how often the census runs at least; 0 means
	// DefaultCensusInterval.
	CensusInterval time.Duration
	// RegistryTimeout bounds every registry operation; 0 means
	// DefaultRegistryTimeout.
	RegistryTimeout time.Duration
	// Now is the clock for condition transition times; nil means time.Now.
	Now func() time.Time
	// OnSuperseded is called once when a newer operator leader took a
	// topology's registry token from this process (operator_fence.go);
	// the operator's main stops the process. nil: the process goes on
	// refusing itself every write to that topology.
	OnSuperseded func(error)

	once     sync.Once
	ownConns *Connections
	// censusDone carries the topologies whose census finished off the
	// reconcile path (census_runs.go); SetupWithManager makes it.
	censusDone chan event.TypedGenericEvent[types.NamespacedName]
}

// The operator's permissions, and nothing more (hack/verify checks that
// config/rbac/role.yaml grants exactly these; the e2e runs under that
// role). Objects are written only by patch (finalizer, status); Secrets are
// watched metadata-only and read by name; pods are listed and deleted
// during a roll.
// +kubebuilder:rbac:groups=topology.shardkeeper.dev,resources=shardtopologies,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=topology.shardkeeper.dev,resources=shardtopologies/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile loads one ShardTopology, ensures its finalizer, runs the steps
// in order and patches its status once, at the end, whatever happened.
func (r *ShardTopologyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	// topology is the key the workers log under too (the registry key,
	// namespace/name), so one query follows a topology through both.
	logger := log.FromContext(ctx).WithValues("topology", req.Namespace+"/"+req.Name)
	ctx = log.IntoContext(ctx, logger)

	topo := &topologyv1.ShardTopology{}
	if err := r.Client.Get(ctx, req.NamespacedName, topo); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone without our finalizer (or after it): drop what we hold.
			r.conns().Close(req.NamespacedName)
			forgetMetrics(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !topo.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, topo)
	}

	s := newScope(topo, r.now())
	if err := r.conns().supersededErr(s.key); err != nil {
		// A newer leader owns the topology, its registry rows and its
		// status: write nothing.
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	if s.firstSight() {
		// Write Ready=Unknown and Reconciling=True before doing anything, so
		// a GitOps tool never reads a new object as healthy.
		st := firstSightStatus(topo, s.now)
		return ctrl.Result{RequeueAfter: afterFirstSight},
			r.patchStatus(ctx, s, func(*topologyv1.ShardTopology) topologyv1.ShardTopologyStatus { return st })
	}
	if err := r.ensureFinalizer(ctx, s); err != nil {
		return ctrl.Result{}, err
	}

	// Runs after the status patch below (defers run last first).
	defer r.flushEvents(s)
	// statusErr is the error status reports: retErr, or the error of a
	// pass that failed but asked for a set requeue instead of a backoff.
	var statusErr error
	defer func() {
		if statusErr == nil {
			statusErr = retErr
		}
		if r.superseded(ctx, s, statusErr) {
			// The status this process would write is the stale leader's.
			retErr = reconcile.TerminalError(statusErr)
			return
		}
		obs := s.observation(statusErr)
		compute := func(t *topologyv1.ShardTopology) topologyv1.ShardTopologyStatus { return computeStatus(t, obs, s.now) }
		began := time.Now()
		err := r.patchStatus(ctx, s, compute)
		reconcileStepSeconds.WithLabelValues(stepPatchStatus).Observe(time.Since(began).Seconds())
		if err != nil {
			// A status that did not land is retried even after a
			// terminal error: the step's error was logged already, and
			// the stall it reports must reach status.
			retErr = err
		}
	}()

	result, err := runSteps(ctx, r, s, reconcileSteps)
	switch {
	case s.stall != nil:
		logger.Info("Stalled", "reason", s.stall.Reason, "field", s.stall.Field)
	case err != nil:
		logger.Error(err, "Reconcile step failed", "step", s.failedStep)
	}
	if after, ok := requeueOf(err); ok {
		// The pass failed and status says so (the deferred patch reads
		// statusErr), but the next pass comes at a set time: a growing
		// backoff would delay what workers wait on.
		statusErr = err
		return ctrl.Result{RequeueAfter: after}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return result, nil
}

// ensureFinalizer adds the finalizer before anything is provisioned.
func (r *ShardTopologyReconciler) ensureFinalizer(ctx context.Context, s *scope) error {
	if controllerutil.ContainsFinalizer(s.topo, topologyv1.Finalizer) {
		return nil
	}
	after := s.topo.DeepCopy()
	controllerutil.AddFinalizer(after, topologyv1.Finalizer)
	if err := r.Client.Patch(ctx, after, client.MergeFromWithOptions(s.topo, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("add finalizer: %w", err)
	}
	// The patch returned the new resourceVersion: the status patch's
	// optimistic lock must use it.
	s.topo = after
	return nil
}

func (r *ShardTopologyReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *ShardTopologyReconciler) conns() *Connections {
	if r.Conns != nil {
		return r.Conns
	}
	r.once.Do(func() { r.ownConns = &Connections{} })
	return r.ownConns
}

// readSecret reads a Secret the spec names. No informer holds Secrets'
// data, so it comes from the API server; but only when its resourceVersion
// in the metadata-only cache moved since this process last read it for the
// topology: a reconcile then needs no round trip for its Secrets (issue 23:
// CheckSecrets' p99 was 92-140 ms in bench row e). The metadata cache lags
// the API server as any informer does, and its watch event for a changed
// Secret brings a reconcile that reads the new data.
func (r *ShardTopologyReconciler) readSecret(ctx context.Context, topo, name types.NamespacedName) (*corev1.Secret, error) {
	if r.SecretReader != nil {
		sec := &corev1.Secret{}
		return sec, r.SecretReader.Get(ctx, name, sec)
	}
	if r.SecretMetadata != nil {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := r.SecretMetadata.Get(ctx, name, meta); err == nil {
			if sec := r.conns().cachedSecret(topo, name.Name, meta.ResourceVersion); sec != nil {
				return sec, nil
			}
		}
	}
	sec := &corev1.Secret{}
	if err := r.reader().Get(ctx, name, sec); err != nil {
		return nil, err
	}
	r.conns().keepSecret(topo, sec)
	return sec, nil
}

func (r *ShardTopologyReconciler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

func (r *ShardTopologyReconciler) registryTimeout() time.Duration {
	if r.RegistryTimeout > 0 {
		return r.RegistryTimeout
	}
	return DefaultRegistryTimeout
}

func (r *ShardTopologyReconciler) censusInterval() time.Duration {
	if r.CensusInterval > 0 {
		return r.CensusInterval
	}
	return DefaultCensusInterval
}

// event records a step Event about the topology, sent when the pass ends
// (flushEvents).
func (r *ShardTopologyReconciler) event(s *scope, eventType, reason, action, note string, args ...any) {
	s.events = append(s.events, stepEvent{eventType, reason, action, fmt.Sprintf(note, args...)})
}

// stepEvent is an Event a step recorded, waiting for the pass's end.
type stepEvent struct{ eventType, reason, action, note string }

// flushEvents sends the pass's step Events about the object as its status
// write left it. The events API folds an Event into an earlier one of the
// same type, reason and action about the same object version (a series:
// the later note is lost), so Events of two passes that both started from
// one version (the first wrote no status change) were folded: the second
// pass's UnitsRetired, naming the last unit retired, never showed. Sent
// after the status write, a pass that changed status names its own
// version.
func (r *ShardTopologyReconciler) flushEvents(s *scope) {
	for _, e := range s.events {
		r.Recorder.Eventf(s.topo, nil, e.eventType, e.reason, e.action, "%s", e.note)
	}
	s.events = nil
}

// statusPatchAttempts bounds patchStatus's conflict retries within one
// reconcile; past it the write is retried by a requeue, never dropped.
const statusPatchAttempts = 10

// patchStatus writes the status compute gives for the object, with
// optimistic locking: on a conflict it reads the object again and, if its
// generation did not move (the observation still describes this spec),
// computes the status anew on top of what the other writer wrote. A write
// that changes nothing is skipped. Every condition that changed becomes an
// Event, and the metrics follow the status written. A write that does not
// land (the generation moved, or conflicts went on) is an error, so the
// reconcile is retried: status records what a restart needs (the pods in
// flight of a roll), and losing it silently could take a second pod down.
// A written status becomes s.topo, so a later patch in the same pass
// starts from it.
func (r *ShardTopologyReconciler) patchStatus(ctx context.Context, s *scope, compute func(*topologyv1.ShardTopology) topologyv1.ShardTopologyStatus) error {
	before := s.topo
	for attempt := 1; ; attempt++ {
		status := compute(before)
		if statusEqual(before.Status, status) {
			recordStatusMetrics(s.key, &status)
			s.topo = before
			return nil
		}
		after := before.DeepCopy()
		after.Status = status
		patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		err := r.Client.Status().Patch(ctx, after, patch)
		switch {
		case err == nil:
			r.statusEvents(before, after)
			r.foreignMemberEvents(ctx, before, after)
			recordStatusMetrics(s.key, &after.Status)
			s.topo = after
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("patch status of %s: %w", s.key, err)
		}
		if attempt == statusPatchAttempts {
			return fmt.Errorf("patch status of %s: still conflicting after %d attempts: %w", s.key, attempt, err)
		}
		fresh := &topologyv1.ShardTopology{}
		if gerr := r.Client.Get(ctx, s.key, fresh); gerr != nil {
			return fmt.Errorf("patch status of %s: read it again after a conflict: %w", s.key, gerr)
		}
		if fresh.Generation != before.Generation {
			// The spec moved: this observation is stale. Retry the whole
			// reconcile against the new generation.
			return fmt.Errorf("patch status of %s: generation moved from %d to %d while reconciling: %w",
				s.key, before.Generation, fresh.Generation, err)
		}
		before = fresh
	}
}

// statusEvents records an Event for every condition that changed, and the
// RolloutPaused step event when pause starts holding a step.
func (r *ShardTopologyReconciler) statusEvents(before, after *topologyv1.ShardTopology) {
	for _, t := range conditionTransitions(before.Status.Conditions, after.Status.Conditions) {
		r.Recorder.Eventf(after, nil, t.eventType, t.reason, t.action, "%s", t.note)
	}
	if after.Status.Phase == topologyv1.PhasePaused && before.Status.Phase != topologyv1.PhasePaused {
		msg := ""
		if after.Status.Rollout != nil {
			msg = after.Status.Rollout.Message
		}
		r.Recorder.Eventf(after, nil, eventNormal, "RolloutPaused", "Pause", "rollout paused: %s", msg)
	}
}

// SetupOptions tune SetupWithManager.
type SetupOptions struct {
	// SkipNameValidation lets several managers in one process (tests)
	// register a controller of the same name.
	SkipNameValidation bool
	// FullSecretCache watches Secrets as full objects, as the operator
	// did before the metadata-only watch, for hack/bench's comparison
	// (operator.Options.FullSecretCache).
	FullSecretCache bool
}

// SetupWithManager registers the reconciler and its watches: ShardTopology
// itself, and the Secrets and StatefulSets it references. Pods and the
// registry are polled while a rollout needs them.
func (r *ShardTopologyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts ...SetupOptions) error {
	var o SetupOptions
	for _, x := range opts {
		o = x
	}
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
	skip := o.SkipNameValidation
	// Metadata only: the cache holds the names of the Secrets, never their
	// data; checkSecrets reads the few it needs uncached.
	secretWatch := []builder.WatchesOption{builder.OnlyMetadata}
	if o.FullSecretCache {
		secretWatch = nil
	}
	r.censusDone = make(chan event.TypedGenericEvent[types.NamespacedName], 64)
	censusDone := source.Channel(r.censusDone, handler.TypedEnqueueRequestsFromMapFunc(
		func(_ context.Context, key types.NamespacedName) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: key}}
		}))
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&topologyv1.ShardTopology{}, builder.WithPredicates(notAStatusEcho)).
		WatchesRawSource(censusDone).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.referencing(indexSecretRefs)), secretWatch...).
		Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(r.referencing(indexStatefulSet))).
		WithOptions(controller.Options{
			// Topologies are independent; one waiting on a slow NATS
			// request must not hold the others up.
			MaxConcurrentReconciles: 4,
			SkipNameValidation:      &skip,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxRetryDelay),
		}).
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
