package controllers

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// notAStatusEcho passes every ShardTopology event but an update that
// changed nothing a reconcile reads besides status: the echo of the
// operator's own status patch. Each echo woke a reconcile that read the
// registry, NATS and the pods again only to find nothing to do, a third
// of all reconciles in bench row e (issue 23). What a pass must come back
// for is requeued by the pass itself (a poll or the next census slot),
// never left to its own echo.
//
// Everything else still wakes: the spec (generation), annotations (the
// approve annotation), labels, finalizers and the deletion timestamp.
// Status written by someone else is not read back until the next pass,
// which overwrites it anyway.
var notAStatusEcho = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	if o == nil || n == nil {
		return true
	}
	return o.GetGeneration() != n.GetGeneration() ||
		!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
		!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
		!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
}}
