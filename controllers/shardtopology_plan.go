package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// A change of N or V is planned before anything is frozen: the plan
// (ownership.PlanChange over the live members and their claims) goes to
// status.plan with a hash of everything that decides it. Under
// spec.rollout.approval: Manual the change waits in state Proposed (rows
// of changeRules) until the approve annotation carries that hash, after
// Strimzi's KafkaRebalance: ProposalReady accepts approve, and a plan
// that changed since a person read it (a member joined or left, a claim
// moved, the spec moved again) has another hash, so an approval of what
// they read is refused rather than applied to something else.

// planHashLen is how many hex digits of the SHA-256 a plan hash keeps:
// short enough to type, long enough that two plans never share one.
const planHashLen = 16

// changeInput is what ownership.PlanChange decides the change from: the
// active shape, the target, the live members with a slot and the claims
// they hold in the active shape.
func changeInput(w *changeWorld, claims map[string]poolctl.ClaimInfo) ownership.ChangeInput {
	in := ownership.ChangeInput{Epoch: w.active.Number, From: epochTopology(w.active), To: w.target, Claims: ownership.Claims{}}
	live := map[string]bool{}
	for _, m := range w.live {
		if m.Slot >= 0 {
			in.Members = append(in.Members, ownership.Member{Name: m.Name, Ordinal: podOrdinal(m.Name), Slot: ownership.Slot(m.Slot)})
			live[m.Name] = true
		}
	}
	for name, c := range claims {
		u, err := ownership.ParseUnit(name)
		if err == nil && c.State != poolctl.StateFree && live[c.Owner] && in.From.Contains(u) {
			in.Claims[u] = c.Owner
		}
	}
	return in
}

// changePlan plans the change from the active epoch to the target over
// the live members with a slot and the claims they hold. Without a live
// member there is nothing to move: the plan only adds and removes units.
func changePlan(w *changeWorld, claims map[string]poolctl.ClaimInfo) ownership.Plan {
	plan := planOver(w, claims)
	if w.nextEpoch > 0 && plan.ToEpoch != w.nextEpoch {
		// The registry numbers the next epoch after every epoch it ever
		// wrote, an abandoned pending one included: the plan (and its
		// hash) names that number, so an approval given before an abort
		// or a change and revert never approves the next change.
		old := plan.ToEpoch
		plan.ToEpoch = w.nextEpoch
		for i := range plan.Steps {
			if plan.Steps[i].Epoch == old {
				plan.Steps[i].Epoch = w.nextEpoch
			}
		}
	}
	return plan
}

// planOver is ownership's plan of the change, to the epoch after the
// active one.
func planOver(w *changeWorld, claims map[string]poolctl.ClaimInfo) ownership.Plan {
	in := changeInput(w, claims)
	plan, err := ownership.PlanChange(in)
	if err != nil {
		// No live member (or none with a slot yet): units are only
		// added and removed; whoever joins claims them.
		d := ownership.Diff(in.From, w.target)
		plan = ownership.Plan{Kind: ownership.KindTopologyChange, FromEpoch: w.active.Number, ToEpoch: w.active.Number + 1, From: in.From, To: w.target}
		var claim, retire []ownership.Move
		for _, u := range d.Added {
			claim = append(claim, ownership.Move{Unit: u})
		}
		for _, u := range d.Removed {
			retire = append(retire, ownership.Move{Unit: u})
		}
		plan.Steps = []ownership.Step{{Name: ownership.StepClaim, Epoch: plan.ToEpoch, Moves: claim}, {Name: ownership.StepRetire, Epoch: plan.ToEpoch, Moves: retire}}
	}
	return plan
}

// planStatus condenses a plan for status: counts, one row per pod, the
// estimated duration and the hash.
func planStatus(p ownership.Plan, active *poolctl.Epoch, spec *topologyv1.RolloutSpec) *topologyv1.PlanStatus {
	d := ownership.Diff(p.From, p.To)
	moved := 0
	for _, st := range p.Steps {
		if st.Name == ownership.StepHandOver {
			moved = len(st.Moves)
		}
	}
	ps := &topologyv1.PlanStatus{
		Hash:         planHash(p),
		From:         epochStatus(active),
		To:           topologyv1.TopologyShape{Partitions: int32(p.To.Partitions), ShardsPerPartition: int32(p.To.Shards)},
		UnitsAdded:   int32(len(d.Added)),
		UnitsRemoved: int32(len(d.Removed)),
		UnitsMoved:   int32(moved),
		UnitsKept:    int32(len(d.Kept) - moved),
	}
	for _, m := range p.Members {
		ps.Pods = append(ps.Pods, topologyv1.PodPlan{Name: m.Member, Before: int32(m.Before), After: int32(m.After),
			MovedIn: int32(m.MovedIn), MovedOut: int32(m.MovedOut), Added: int32(m.Added), Removed: int32(m.Retired)})
	}
	ps.EstimatedDuration = &metav1.Duration{Duration: estimateDuration(moved > 0, spec)}
	return ps
}

// estimateDuration is how long a change should take up to Retire: the
// members acknowledge the freeze at their next registry read (a renew
// interval at worst, since a member that cannot read the registry within
// it fences itself), moved units wait for their old owner's drain (at most
// drainTimeout, all owners in parallel), and the new owners claim at their
// next read. Retire waits for rows to drain, which no setting bounds.
func estimateDuration(moves bool, spec *topologyv1.RolloutSpec) time.Duration {
	d := 2*spec.RenewIntervalOrDefault() + pollFast
	if moves {
		d += spec.DrainTimeoutOrDefault()
	}
	return d
}

// planHash hashes what decides a plan: the epochs, both shapes and every
// move of every step, in the plan's canonical order.
func planHash(p ownership.Plan) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d %s -> %d %s\n", p.FromEpoch, p.From, p.ToEpoch, p.To)
	for _, st := range p.Steps {
		fmt.Fprintf(h, "%s:", st.Name)
		for _, mv := range st.Moves {
			fmt.Fprintf(h, " %s %s>%s", mv.Unit, mv.From, mv.To)
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil))[:planHashLen]
}

// approval is what the approve annotation says about the current plan.
type approval int

const (
	// approvalNone: no annotation, or it names a plan already started
	// (status.approvedPlanHash, status.lastRollout.planHash), which
	// approves nothing new.
	approvalNone approval = iota
	// approvalStale: it names another plan.
	approvalStale
	// approvalGranted: it names the current plan.
	approvalGranted
)

// approvalOf compares the approve annotation with the plan's hash.
func approvalOf(t *topologyv1.ShardTopology, hash string) approval {
	v := strings.TrimSpace(t.Annotations[topologyv1.ApproveAnnotation])
	switch {
	case v == "":
		return approvalNone
	case v == hash:
		return approvalGranted
	case t.Status.LastRollout != nil && v == t.Status.LastRollout.PlanHash:
		return approvalNone
	case v == t.Status.ApprovedPlanHash:
		// The approval of a change that already started (and finished,
		// or was aborted): it stays on the object until someone removes
		// it, and the next change must not read it as a stale approval.
		return approvalNone
	}
	return approvalStale
}

var actPropose = changeAction{name: "Propose", step: topologyv1.StepApprove, run: propose}

// propose publishes the plan and waits for a person: nothing is frozen
// or provisioned. The plan is computed again at every reconcile, so
// status always shows what approving would roll out now.
func propose(_ context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	p := s.plan
	p.Message = fmt.Sprintf("%s waits for approval: kubectl shardkeeper approve %s (sets annotation %s=%s)",
		describeChange(w), s.topo.Name, topologyv1.ApproveAnnotation, p.Hash)
	s.change.awaiting = true
	s.change.message = p.Message
	if prev := s.topo.Status.Plan; prev == nil || prev.Hash != p.Hash {
		r.event(s, eventNormal, "PlanProposed", "Propose", "plan %s: %s; %d units move, %d added, %d removed; approve with annotation %s=%s",
			p.Hash, describeChange(w), p.UnitsMoved, p.UnitsAdded, p.UnitsRemoved, topologyv1.ApproveAnnotation, p.Hash)
	}
	return ctrl.Result{RequeueAfter: pollSlow}, nil
}

var actRefuseApproval = changeAction{name: "RefuseApproval", step: topologyv1.StepApprove, run: refuseApproval}

// refuseApproval keeps waiting when the annotation approves a plan other
// than the current one, and says why: Ready's reason ApprovalRefused and
// a Warning Event, once per (annotation, plan) pair.
func refuseApproval(ctx context.Context, r *ShardTopologyReconciler, s *scope, w *changeWorld) (ctrl.Result, error) {
	res, err := propose(ctx, r, s, w)
	got := s.topo.Annotations[topologyv1.ApproveAnnotation]
	want := s.plan.Hash
	s.change.refused = true
	s.change.message = fmt.Sprintf("annotation %s=%s does not approve the current plan %s (the plan changed since it was read, or the hash is wrong); read status.plan again and approve %s",
		topologyv1.ApproveAnnotation, got, want, want)
	s.plan.Message = s.change.message
	if prev := s.topo.Status.Plan; prev == nil || prev.Hash != want || !strings.Contains(prev.Message, "="+got+" ") {
		r.event(s, eventWarning, "ApprovalRefused", "Approve", "%s", s.change.message)
	}
	return res, err
}

// publishPlan puts the world's plan in s.plan for status: ProposalReady
// while it waits for approval, Approved otherwise. ProposedAt stays while
// the hash does.
func (s *scope) publishPlan(w *changeWorld) {
	if w.plan == nil {
		return
	}
	p := planStatus(*w.plan, w.active, &s.topo.Spec.Rollout)
	p.State = topologyv1.PlanApproved
	if w.manualUnapproved() {
		p.State = topologyv1.PlanProposalReady
	}
	p.ProposedAt = ptrTime(s.now)
	if prev := s.topo.Status.Plan; prev != nil && prev.Hash == p.Hash && prev.ProposedAt != nil {
		p.ProposedAt = prev.ProposedAt
	}
	s.plan = p
}

// manualUnapproved reports whether a wanted change waits for approval:
// approval is Manual and the annotation does not carry the plan's hash.
func (w *changeWorld) manualUnapproved() bool {
	return w.manual && w.approval != approvalGranted
}
