package controllers

import (
	"context"
	"errors"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The registry keeps an append-only history of claims, leases and epochs
// (poolctl.HistoryReader): the evidence the history checker judges
// deliveries against. It grows with every claim change and every lease
// renewal, so the operator prunes what no check needs any more.

// historyKeep is how much registry history is kept: a day covers any
// investigation of a rollout or takeover while it is fresh (tests and the
// checker read minutes of it), and bounds the tables to a day of renewals.
const historyKeep = 24 * time.Hour

// pruneEvery is how often the operator prunes each topology's history;
// pruning is idempotent, so a restart that prunes again costs one
// statement.
const pruneEvery = time.Hour

// pruneHistory deletes registry history older than historyKeep, at most
// once per pruneEvery per topology. The cut-off is on the registry's clock,
// the one the history is written on. A failure does not stop the rollout:
// it is logged, reported as an Event, and tried again after pruneEvery.
func pruneHistory(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	b, ok := s.reg.(*boundedRegistry)
	if !ok || s.snap == nil || !r.conns().pruneDue(s.key, s.now, pruneEvery) {
		return ctrl.Result{}, nil
	}
	err := b.PruneHistory(ctx, s.registryKey(), s.snap.Now.Add(-historyKeep))
	switch {
	case errors.Is(err, errNoHistory):
	case err != nil:
		log.FromContext(ctx).Info("Pruning the registry history failed; retrying later", "error", err.Error(), "retryAfter", pruneEvery.String())
		r.event(s, eventWarning, "HistoryPruneFailed", "PruneHistory", "pruning registry history older than %s failed (retried in %s): %v", historyKeep, pruneEvery, err)
	default:
		log.FromContext(ctx).V(1).Info("Pruned the registry history", "keep", historyKeep.String())
	}
	return ctrl.Result{}, nil
}
