package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// scope is what one reconcile knows: the object as read, the time it
// started, and what its steps found.
type scope struct {
	topo *topologyv1.ShardTopology
	now  time.Time

	// stall is set by a step that found something only a person can fix.
	stall *StallError
	// pending says what valid work this build has not done, if any.
	pending string
	// failedStep names the step that returned an error.
	failedStep string
}

func newScope(t *topologyv1.ShardTopology, now time.Time) *scope {
	return &scope{topo: t.DeepCopy(), now: now}
}

// firstSight reports whether no reconcile has written status yet.
func (s *scope) firstSight() bool { return len(s.topo.Status.Conditions) == 0 }

// observation condenses what the steps found for the pure status functions.
func (s *scope) observation(err error) observation {
	o := observation{stall: s.stall, pending: s.pending, paused: s.topo.IsPaused()}
	var stall *StallError
	if err != nil && !errors.As(err, &stall) {
		o.err = err
	}
	return o
}

// StallError says why the spec cannot be acted on and which field to fix.
// It becomes the Stalled condition; retrying will not help until the spec or
// the object it names changes (a watch brings the reconcile back then).
type StallError struct {
	// Reason is the CamelCase condition reason.
	Reason string
	// Field is the spec path at fault, e.g. spec.registry.dsnSecretRef.
	Field string
	// Detail says what is wrong and what is allowed.
	Detail string
}

func (e *StallError) Error() string { return e.Field + ": " + e.Detail }

// step is one named, idempotent piece of a reconcile.
type step struct {
	name string
	run  func(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error)
}

// reconcileSteps run in order; a step that stalls or fails ends the pass.
var reconcileSteps = []step{
	{"CheckSecrets", checkSecrets},
	{"CheckWorkload", checkWorkload},
	{"ReportPendingWork", reportPendingWork},
}

// runSteps runs steps in order and keeps the shortest requeue any asked for.
func runSteps(ctx context.Context, r *ShardTopologyReconciler, s *scope, steps []step) (ctrl.Result, error) {
	var result ctrl.Result
	for _, st := range steps {
		res, err := st.run(ctx, r, s)
		if err != nil {
			s.failedStep = st.name
			return ctrl.Result{}, err
		}
		if s.stall != nil {
			return ctrl.Result{}, ctrl.TerminalError(s.stall)
		}
		result.RequeueAfter = shortestRequeue(result.RequeueAfter, res.RequeueAfter)
	}
	return result, nil
}

func shortestRequeue(a, b time.Duration) time.Duration {
	switch {
	case a == 0:
		return b
	case b == 0 || a < b:
		return a
	default:
		return b
	}
}

// secretRef is one Secret key the spec needs, with the field that names it.
type secretRef struct {
	field string
	name  string
	key   string // empty: the Secret must exist, no key is checked
}

// secretRefs lists every Secret the spec references.
func secretRefs(spec *topologyv1.ShardTopologySpec) []secretRef {
	refs := []secretRef{{"spec.registry.dsnSecretRef", spec.Registry.DSNSecretRef.Name, spec.Registry.DSNSecretRef.Key}}
	if r := spec.NATS.CredentialsSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.credentialsSecretRef", r.Name, r.Key})
	}
	if r := spec.NATS.SystemCredentialsSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.systemCredentialsSecretRef", r.Name, r.Key})
	}
	if r := spec.NATS.TLSSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.tlsSecretRef", r.Name, ""})
	}
	return refs
}

// referencedSecrets is the index function behind the Secret watch.
func referencedSecrets(spec *topologyv1.ShardTopologySpec) []string {
	var names []string
	for _, r := range secretRefs(spec) {
		names = append(names, r.name)
	}
	return names
}

// checkSecrets stalls when a referenced Secret or key is missing. Secret
// values are never read into logs or status; only their presence is checked.
func checkSecrets(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	t := s.topo
	for _, ref := range secretRefs(&t.Spec) {
		var sec corev1.Secret
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: ref.name}, &sec)
		switch {
		case apierrors.IsNotFound(err):
			s.stall = &StallError{topologyv1.ReasonSecretNotFound, ref.field,
				fmt.Sprintf("Secret %q not found in namespace %q", ref.name, t.Namespace)}
			return ctrl.Result{}, nil
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("get Secret %s for %s: %w", ref.name, ref.field, err)
		}
		if _, ok := sec.Data[ref.key]; ref.key != "" && !ok {
			s.stall = &StallError{topologyv1.ReasonSecretKeyMissing, ref.field,
				fmt.Sprintf("Secret %q has no key %q", ref.name, ref.key)}
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{}, nil
}

// checkWorkload stalls when the worker StatefulSet does not exist.
func checkWorkload(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	t := s.topo
	name := t.Spec.Workload.StatefulSetName
	var sts appsv1.StatefulSet
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: name}, &sts)
	switch {
	case apierrors.IsNotFound(err):
		s.stall = &StallError{topologyv1.ReasonWorkloadNotFound, "spec.workload.statefulSetName",
			fmt.Sprintf("StatefulSet %q not found in namespace %q", name, t.Namespace)}
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("get StatefulSet %s: %w", name, err)
	}
	return ctrl.Result{}, nil
}

// reportPendingWork records honestly that provisioning and rollouts are not
// performed by this build yet, so status never claims Ready.
func reportPendingWork(_ context.Context, _ *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	s.pending = "spec is valid; provisioning NATS streams and consumers, the registry and rollouts are not implemented in this build"
	return ctrl.Result{}, nil
}
