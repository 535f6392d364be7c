package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Deletion never drops rows. When a ShardTopology is deleted, its
// finalizer:
//
//   - waits while a live worker holds claims: the fleet is still consuming,
//     and deleting consumers under it would break it. Status says so
//     (phase Deleting) and names what to do;
//   - refuses RESET in the registry, for any worker still around;
//   - deletes the unit consumers that are drained (nothing pending, nothing
//     unacknowledged): those of the provisioned envelope, the epochs and
//     the spec, and every unit consumer NATS holds under this topology's
//     names and owner mark (natsops.Inventory), so a consumer no record
//     names is not left behind. Consumers another topology owns are never
//     deleted; a Warning Event names them and their owner. A consumer that still holds rows is KEPT, with its
//     ack floor, so that a ShardTopology of the same name picks it up where
//     it stopped; an Event names the consumers kept;
//   - KEEPS every stream: a stream holds the rows themselves, and deleting
//     it would drop them. Delete streams by hand once their rows are no
//     longer needed;
//   - KEEPS the registry rows of the topology: fencing epochs and
//     incarnations must never go back if a ShardTopology of the same name
//     comes back (P1, P6), and a member that still holds a claim keeps its
//     row. The registry has no operation that deletes a topology; an Event
//     says the rows are kept;
//   - closes the cached connections and removes the finalizer.
//
// When the registry or NATS cannot be reached, the finalizer stays and
// status says why (phase Deleting), retrying with backoff. The annotation
// topology.shardkeeper.dev/deletion-policy: Orphan lets the object go at
// once and keeps everything.

// finalizeResult is what one pass of the finalizer found.
type finalizeResult struct {
	// done: the finalizer may be removed.
	done bool
	// waiting says what the finalizer waits for, when it is not done.
	waiting string
}

// finalize runs the clean-up described above.
func (r *ShardTopologyReconciler) finalize(ctx context.Context, s *scope) (finalizeResult, ctrl.Result, error) {
	t := s.topo
	if t.OrphansOnDeletion() {
		r.event(s, eventNormal, "Orphaned", "Delete",
			"annotation %s=%s: streams, unit consumers and registry rows of %s are kept as they are",
			topologyv1.DeletionPolicyAnnotation, topologyv1.DeletionPolicyOrphan, s.registryKey())
		return finalizeResult{done: true}, ctrl.Result{}, nil
	}
	reg, nc, why, err := r.finalizerConnections(ctx, s)
	if err != nil {
		return finalizeResult{waiting: err.Error()}, ctrl.Result{}, err
	}
	if reg == nil || nc == nil {
		if t.Status.Provisioned == nil && t.Status.ActiveEpoch == nil {
			// Status records nothing provisioned and nothing can be
			// reached: nothing of this object is known to exist.
			r.event(s, eventNormal, "NothingToRetire", "Delete", "no epoch or consumer was ever recorded for %s (%s)", s.registryKey(), why)
			return finalizeResult{done: true}, ctrl.Result{}, nil
		}
		return finalizeResult{waiting: fmt.Sprintf("cannot clean up: %s; restore it, or set annotation %s=%s to keep everything",
			why, topologyv1.DeletionPolicyAnnotation, topologyv1.DeletionPolicyOrphan)}, ctrl.Result{RequeueAfter: pollIdle}, nil
	}
	s.reg, s.nc = reg, nc

	snap, err := reg.Snapshot(ctx, s.registryKey())
	switch {
	case err == nil:
		s.snap = &snap
	case isUnknownTopology(err):
		// The registry never saw this topology.
	default:
		return finalizeResult{waiting: fmt.Sprintf("read registry: %v", err)}, ctrl.Result{}, fmt.Errorf("read registry: %w", err)
	}
	if s.snap != nil {
		var holders []string
		units := 0
		for _, m := range s.snap.LiveMembers() {
			if m.Holds > 0 {
				holders = append(holders, m.Name)
				units += m.Holds
			}
		}
		if len(holders) > 0 {
			return finalizeResult{waiting: fmt.Sprintf("%d live workers (%s) hold %d units; stop them (scale StatefulSet %s to 0) so their consumers can be retired, or set annotation %s=%s to keep everything",
				len(holders), firstN(holders, 4), units, t.Spec.Workload.StatefulSetName, topologyv1.DeletionPolicyAnnotation, topologyv1.DeletionPolicyOrphan)}, ctrl.Result{RequeueAfter: pollSlow}, nil
		}
		perm := poolctl.ResetPermission{Allowed: false, Reason: "ShardTopology deleted"}
		if err := reg.PublishResetPermission(ctx, s.registryKey(), perm); err != nil {
			return finalizeResult{waiting: err.Error()}, ctrl.Result{}, fmt.Errorf("refuse RESET: %w", err)
		}
	}

	// What status and the registry remember, and what NATS holds of this
	// topology's naming and ownership: a change abandoned after it
	// provisioned may have left consumers no record names.
	found, err := s.inventoryUnits(ctx)
	if err != nil {
		return finalizeResult{waiting: err.Error()}, ctrl.Result{}, err
	}
	units := unionUnits(s.finalizerUnits(), found)
	retired, holding, err := s.retireConsumers(ctx, units)
	var owned *natsops.OwnedElsewhereError
	if errors.As(err, &owned) {
		// Not this topology's to delete: leave them, say whose they are.
		r.event(s, eventWarning, topologyv1.ReasonNATSObjectsOwnedElsewhere, "Delete", "%v", owned)
		err = nil
	}
	if err != nil {
		return finalizeResult{waiting: err.Error()}, ctrl.Result{}, err
	}
	if len(retired) > 0 {
		r.event(s, eventNormal, "UnitsRetired", "Delete", "deleted %d drained unit consumers", len(retired))
	}
	if len(holding) > 0 {
		var names []string
		for _, h := range holding {
			names = append(names, fmt.Sprintf("%s (%d pending, %d unacknowledged)", h.Unit, h.Pending, h.AckPending))
		}
		r.event(s, eventWarning, "ConsumersKept", "Delete",
			"%d unit consumers still hold rows and are kept with their ack floors (never drop rows): %s", len(holding), firstN(names, 6))
	}
	r.event(s, eventNormal, "StreamsKept", "Delete",
		"streams %s_INGEST_* are kept: they hold the rows, and deleting a stream drops them; delete them by hand when the rows are no longer needed",
		strings.ToUpper(t.SubjectPrefix()))
	if s.snap != nil {
		r.event(s, eventNormal, "RegistryRowsKept", "Delete",
			"registry rows of topology %s are kept: fencing epochs and incarnations must never go back if a ShardTopology of this name returns", s.registryKey())
	}
	log.FromContext(ctx).Info("Finalized", "retired", len(retired), "kept", len(holding))
	return finalizeResult{done: true}, ctrl.Result{}, nil
}

// finalizerConnections reaches the registry and NATS from the Secrets, or
// from the cache when a Secret is already gone (a namespace being deleted
// often removes the Secrets first). why says what is missing when a
// connection is nil and err is nil.
func (r *ShardTopologyReconciler) finalizerConnections(ctx context.Context, s *scope) (poolctl.Registry, *nats.Conn, string, error) {
	spec := &s.topo.Spec
	var missing []string
	if _, err := checkSecrets(ctx, r, s); err != nil {
		return nil, nil, "", err
	}
	secretsOK := s.stall == nil
	if !secretsOK {
		missing = append(missing, s.stall.Error())
		s.stall = nil
	}
	var reg poolctl.Registry
	var nc *nats.Conn
	if secretsOK {
		bounded, err := r.openRegistry(ctx, s, string(s.secretValue(&spec.Registry.DSNSecretRef)))
		if err != nil {
			return nil, nil, "", fmt.Errorf("open registry: %w", err)
		}
		reg = bounded
		c, err := r.conns().NATS(s.key, s.natsConfig(spec.NATS.CredentialsSecretRef, "streams"))
		if err != nil {
			return nil, nil, "", fmt.Errorf("connect to NATS: %w", err)
		}
		nc = c
	} else {
		if pg := r.conns().CachedRegistry(s.key); pg != nil {
			reg = boundRegistry(pg, r.registryTimeout())
		}
		nc = r.conns().CachedNATS(s.key)
	}
	if reg == nil || nc == nil {
		return nil, nil, firstN(missing, 2), nil
	}
	return reg, nc, "", nil
}

// finalizerUnits are every unit whose consumer this object may have
// created: the provisioned envelope, the active and pending epochs, and
// the spec. RetireConsumers counts a consumer that does not exist as
// retired, so listing too many costs only a lookup each.
func (s *scope) finalizerUnits() []ownership.Unit {
	env := s.target()
	widen := func(n, v int) {
		env.Partitions, env.Shards = max(env.Partitions, n), max(env.Shards, v)
	}
	if p := s.topo.Status.Provisioned; p != nil {
		widen(int(p.Partitions), int(p.ShardsPerPartition))
	}
	if s.snap != nil {
		for _, e := range []*poolctl.Epoch{s.snap.Active, s.snap.Pending} {
			if e != nil {
				widen(e.Partitions, e.Shards)
			}
		}
	}
	return env.Units()
}

// reconcileDelete runs the finalizer and reports progress as status until
// it may let the object go.
func (r *ShardTopologyReconciler) reconcileDelete(ctx context.Context, t *topologyv1.ShardTopology) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(t, topologyv1.Finalizer) {
		r.conns().Close(client.ObjectKeyFromObject(t))
		forgetMetrics(client.ObjectKeyFromObject(t))
		return ctrl.Result{}, nil
	}
	s := newScope(t, r.now())
	defer r.flushEvents(s)
	if err := r.conns().supersededErr(s.key); err != nil {
		// A newer leader owns the topology and finishes its deletion.
		return ctrl.Result{}, ctrl.TerminalError(err)
	}
	res, result, err := r.finalize(ctx, s)
	if err != nil && r.superseded(ctx, s, err) {
		return ctrl.Result{}, ctrl.TerminalError(err)
	}
	if !res.done {
		st := deletingStatus(s.topo, res.waiting, err, s.now)
		if perr := r.patchStatus(ctx, s, func(*topologyv1.ShardTopology) topologyv1.ShardTopologyStatus { return st }); perr != nil && err == nil {
			err = perr
		}
		recordStatusMetrics(s.key, &st)
		if err != nil {
			return ctrl.Result{}, err
		}
		return result, nil
	}
	r.conns().Close(s.key)
	forgetMetrics(s.key)
	after := s.topo.DeepCopy()
	controllerutil.RemoveFinalizer(after, topologyv1.Finalizer)
	if err := r.Client.Patch(ctx, after, client.MergeFrom(s.topo)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	return ctrl.Result{}, nil
}

// unionUnits is a and b without repeats, sorted.
func unionUnits(a, b []ownership.Unit) []ownership.Unit {
	out := slices.Concat(a, b)
	slices.SortFunc(out, ownership.CompareUnits)
	return slices.Compact(out)
}

func isUnknownTopology(err error) bool {
	return errors.Is(err, poolctl.ErrUnknownTopology)
}
