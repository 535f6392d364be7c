package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The topology's NATS objects: who owns them, what was ever provisioned,
// and what is refused.
//
// Every stream and unit consumer carries its topology's namespace/name and
// UID in its metadata (natsops.Layout.Owner). A stream or consumer another
// topology owns is never adopted, changed or deleted: Provision and the
// retire steps stop with Stalled (reason NATSObjectsOwnedElsewhere) naming
// the owner, and the finalizer leaves those objects alone. A stream whose
// limits can drop unconsumed rows, or a unit consumer that delivers
// outside its unit's claim, stops the topology the same way (reason
// UnsafeNATSConfig), naming the field and what is allowed.
//
// The provisioned envelope (status.provisioned) is written to the API
// server before Provision creates anything beyond it, so neither an
// operator crash nor a final status patch skipped (the generation moved)
// can lose track of consumers; Provision's orphans (shards beyond V, and
// every consumer of a partition stream beyond N) widen it too, so what an
// envelope lost is found again in NATS.

// natsRefusal turns Provision's or RetireConsumers' refusals into a stall
// that names them; other errors come back as they are. A refusal polls:
// a person fixing the stream or deleting the other topology ends it.
func (s *scope) natsRefusal(err error) error {
	var owned *natsops.OwnedElsewhereError
	var unsafe *natsops.UnsafeConfigError
	switch {
	case errors.As(err, &owned):
		s.stall = &StallError{Reason: topologyv1.ReasonNATSObjectsOwnedElsewhere, Field: "spec.nats.subjectPrefix",
			Detail: fmt.Sprintf("%v. Streams and consumers are marked with their topology (metadata %s); give this topology a subject prefix of its own (delete and create it again: the prefix is immutable), or delete the topology that owns them",
				owned, natsops.OwnerKey),
			Poll: pollIdle}
	case errors.Is(err, natsops.ErrSwitchNeedsSystem):
		s.stall = &StallError{Reason: topologyv1.ReasonInvalidSpec, Field: "spec.nats.systemCredentialsSecretRef",
			Detail: err.Error() + ": under shardAssignment SubjectTransform with nats.replicas above 1, a change of shardsPerPartition pauses each stream's input while every replica takes the new transform, and only the system account can see each replica",
			Poll:   pollIdle}
	case errors.As(err, &unsafe):
		s.stall = &StallError{Reason: topologyv1.ReasonUnsafeNATSConfig, Field: "NATS objects of spec.nats",
			Detail: unsafe.Error() + ". Fix the objects by hand (these fields cannot be changed safely by the operator); the operator looks again every " + pollIdle.String(),
			Poll:   pollIdle}
	default:
		return err
	}
	return s.stall
}

// persistEnvelope writes s.provisioned to status.provisioned when it
// covers more than what status holds, before anything beyond is
// provisioned. Only the envelope is patched; the reconcile's final status
// patch starts from the object this returns.
func (s *scope) persistEnvelope(ctx context.Context, r *ShardTopologyReconciler) error {
	if covers(s.topo.Status.Provisioned, s.provisioned) {
		return nil
	}
	patched := s.topo.DeepCopy()
	p := *s.provisioned
	patched.Status.Provisioned = &p
	if err := r.Client.Status().Patch(ctx, patched, client.MergeFrom(s.topo)); err != nil {
		return fmt.Errorf("record the provisioned envelope %dx%d in status before provisioning it: %w", p.Partitions, p.ShardsPerPartition, err)
	}
	// Keep the spec and generation this reconcile acts on (a spec that
	// moved meanwhile is the next reconcile's, and the final status must
	// not claim to have observed it); take the new resourceVersion, so
	// the final patch does not conflict with this one.
	next := s.topo.DeepCopy()
	next.ResourceVersion = patched.ResourceVersion
	next.Status.Provisioned = &p
	s.topo = next
	return nil
}

// persistApproval writes hash to status.approvedPlanHash before the change
// it approves starts, when status does not hold it yet. The final status
// patch of a reconcile is dropped when the spec moved meanwhile; if the
// approval were recorded only there, a change started in such a reconcile
// would go on (its epoch is in the registry) with no record of what
// approved it, and the approve annotation left on the object would be
// refused aloud as stale once the change finished. Only the hash is
// patched; the reconcile's final status patch starts from the object this
// returns.
func (s *scope) persistApproval(ctx context.Context, r *ShardTopologyReconciler, hash string) error {
	if s.topo.Status.ApprovedPlanHash == hash {
		return nil
	}
	patched := s.topo.DeepCopy()
	patched.Status.ApprovedPlanHash = hash
	if err := r.Client.Status().Patch(ctx, patched, client.MergeFrom(s.topo)); err != nil {
		return fmt.Errorf("record approved plan %s in status before starting it: %w", hash, err)
	}
	next := s.topo.DeepCopy()
	next.ResourceVersion = patched.ResourceVersion
	next.Status.ApprovedPlanHash = hash
	s.topo = next
	return nil
}

// covers says whether the recorded envelope holds every unit of want.
func covers(recorded, want *topologyv1.TopologyShape) bool {
	if want == nil {
		return true
	}
	return recorded != nil && recorded.Partitions >= want.Partitions && recorded.ShardsPerPartition >= want.ShardsPerPartition
}

// widenOver widens the envelope over units (consumers found in NATS).
func (s *scope) widenOver(units []natsops.Unit) {
	for _, u := range units {
		s.widen(ownership.Topology{Partitions: u.Partition + 1, Shards: u.Shard + 1})
	}
}

// inventoryUnits is every unit consumer of this topology's naming that
// NATS holds and no other topology owns, whatever N and V are now.
func (s *scope) inventoryUnits(ctx context.Context) ([]ownership.Unit, error) {
	ictx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	units, err := natsops.Inventory(ictx, s.nc, layoutFor(s.topo, s.target()))
	if err != nil {
		return nil, fmt.Errorf("list the unit consumers in NATS: %w", err)
	}
	out := make([]ownership.Unit, len(units))
	for i, u := range units {
		out[i] = ownership.Unit{Partition: u.Partition, Shard: u.Shard}
	}
	return out, nil
}

// maxStrandedPlaces bounds status.strandedRows.where.
const maxStrandedPlaces = 5

// countStranded counts the rows the topology's streams hold where no unit
// consumer will deliver them, for status and the metric, and says so in a
// Warning Event when the count changed. A count that fails leaves the last
// one in status (its checkedAt says how old it is) and is logged: it
// informs, it decides nothing.
func (s *scope) countStranded(ctx context.Context, r *ShardTopologyReconciler, active ownership.Topology) {
	if natsUnreachable(s.nc) != "" {
		// It cannot succeed, and waiting natsOpTimeout to learn that held
		// every reconcile (and the status saying NATS is down) 10 s; the
		// first reconcile that reaches NATS again counts (report forgets
		// the provisioning, which makes the count due).
		return
	}
	cctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	st, err := natsops.StrandedRows(cctx, s.nc, layoutFor(s.topo, active))
	if err != nil {
		log.FromContext(ctx).Info("Counting stranded rows failed", "error", err.Error())
		return
	}
	where := st.Where[:min(len(st.Where), maxStrandedPlaces)]
	if st.Unchecked > 0 {
		where = append(where, fmt.Sprintf("%d retired units not checked (at most 256 per check)", st.Unchecked))
	}
	s.stranded = &topologyv1.StrandedRowsStatus{Rows: int64(st.Rows), Where: where, CheckedAt: metav1.NewTime(s.now)}
	if prev := s.topo.Status.StrandedRows; st.Rows > 0 && (prev == nil || prev.Rows != int64(st.Rows)) {
		r.event(s, eventWarning, "RowsStranded", "Provision",
			"%d rows are stored where no unit consumer will deliver them (publish to <prefix>.ingest.<p>.<s>.<key> of the active epoch; README, Publishing rows): %s",
			st.Rows, firstN(st.Where, 3))
	}
}

// publishersBehind lists the publishers (pkg/publish.Acknowledge) whose
// latest acknowledgement names an epoch older than active, when one of
// them could still send rows to a unit of retiring: until they move,
// retiring those units' consumers would strand the rows (the retire step
// waits). Under shardAssignment Publisher that is every unit that left.
// Under SubjectTransform the publisher picks only the partition and the
// stream's transform, moved at activation, the shard: only units of
// partitions the active epoch no longer has.
func (s *scope) publishersBehind(ctx context.Context, active *poolctl.Epoch, retiring []ownership.Unit) ([]string, error) {
	if s.topo.Spec.NATS.ShardAssignment == topologyv1.ShardAssignmentSubjectTransform &&
		!slices.ContainsFunc(retiring, func(u ownership.Unit) bool { return u.Partition >= active.Partitions }) {
		return nil, nil
	}
	pctx, cancel := context.WithTimeout(ctx, natsOpTimeout)
	defer cancel()
	return s.publishersBefore(pctx, active.Number)
}

// publishersBefore lists, sorted, the publishers whose latest
// acknowledgement (within publish.PublisherTTL) names an epoch older than
// epoch, each with that epoch.
func (s *scope) publishersBefore(ctx context.Context, epoch int64) ([]string, error) {
	epochs, err := natsops.PublisherEpochs(ctx, s.nc, natsops.Layout{SubjectPrefix: s.topo.SubjectPrefix()})
	if err != nil {
		return nil, fmt.Errorf("read the publishers' acknowledged epochs: %w", err)
	}
	var behind []string
	for name, e := range epochs {
		if e < epoch {
			behind = append(behind, fmt.Sprintf("%s (epoch %d)", name, e))
		}
	}
	slices.Sort(behind)
	return behind, nil
}
