package controllers

import (
	"context"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Members that are not pods of the workload. The registry admits anyone
// with its DSN: a worker run by hand with POD_NAME=laptop-debug joined,
// took 16 of 64 units, and status said 64/64 owned with nothing logged
// (issue 21). The operator cannot refuse such a member (the registry
// protocol has no admission), but it must say so: status.members (which
// kubectl shardkeeper status prints), a Warning Event per new name and
// shardkeeper_members{state="foreign"}. The progress line is left alone:
// tests and scripts read it, and test fleets run members that are not
// pods.

// maxForeignNames bounds status.members.foreignNames.
const maxForeignNames = 16

// workloadPods says which member names are pods of the workload
// StatefulSet: <name>-<ordinal>, ordinal in [start, start+replicas),
// replicas the larger of spec and status (pods of a scale-down still
// running count).
type workloadPods struct {
	name            string
	start, replicas int
}

// workloadOf reads the StatefulSet's pod naming; nil without one.
func workloadOf(sts *appsv1.StatefulSet) *workloadPods {
	if sts == nil {
		return nil
	}
	w := &workloadPods{name: sts.Name, replicas: 1}
	if sts.Spec.Replicas != nil {
		w.replicas = int(*sts.Spec.Replicas)
	}
	w.replicas = max(w.replicas, int(sts.Status.Replicas))
	if o := sts.Spec.Ordinals; o != nil {
		w.start = int(o.Start)
	}
	return w
}

// isPod reports whether member is one of the workload's pods.
func (w *workloadPods) isPod(member string) bool {
	rest, ok := strings.CutPrefix(member, w.name+"-")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || strconv.Itoa(n) != rest {
		return false
	}
	return n >= w.start && n < w.start+w.replicas
}

// memberStatus counts the live members and the foreign ones, with the
// active epoch's units the foreign ones hold.
func memberStatus(snap *poolctl.Snapshot, claims map[string]poolctl.ClaimInfo, w *workloadPods) *topologyv1.MemberStatus {
	live := snap.LiveMembers()
	ms := &topologyv1.MemberStatus{Live: int32(len(live))}
	foreign := map[string]bool{}
	for _, m := range live {
		if !w.isPod(m.Name) {
			foreign[m.Name] = true
			ms.ForeignNames = append(ms.ForeignNames, m.Name)
		}
	}
	ms.Foreign = int32(len(ms.ForeignNames))
	slices.Sort(ms.ForeignNames)
	ms.ForeignNames = ms.ForeignNames[:min(len(ms.ForeignNames), maxForeignNames)]
	if len(foreign) > 0 && snap.Active != nil {
		owners := ownedBy(snap, claims)
		for _, u := range epochTopology(snap.Active).Units() {
			if foreign[owners[u.String()]] {
				ms.ForeignUnits++
			}
		}
	}
	return ms
}

// newForeignMembers are the foreign names after has that before had not.
func newForeignMembers(before, after *topologyv1.MemberStatus) []string {
	if after == nil {
		return nil
	}
	var out []string
	for _, n := range after.ForeignNames {
		if before == nil || !slices.Contains(before.ForeignNames, n) {
			out = append(out, n)
		}
	}
	return out
}

// foreignMemberEvents records a Warning Event, and logs, each foreign
// member status names for the first time.
func (r *ShardTopologyReconciler) foreignMemberEvents(ctx context.Context, before, after *topologyv1.ShardTopology) {
	names := newForeignMembers(before.Status.Members, after.Status.Members)
	if len(names) == 0 {
		return
	}
	m := after.Status.Members
	log.FromContext(ctx).Info("Members that are not pods of the workload joined the registry", "members", names,
		"StatefulSet", after.Spec.Workload.StatefulSetName, "foreignMembers", m.Foreign, "foreignUnits", m.ForeignUnits)
	r.Recorder.Eventf(after, nil, eventWarning, topologyv1.ReasonForeignMember, "ObserveRegistry",
		"%s joined the registry but %s not a pod of StatefulSet %s; %d foreign members hold %d units. Anyone with the registry DSN can join: stop the process, or rotate the DSN's password",
		strings.Join(names, ", "), isOrAre(len(names)), after.Spec.Workload.StatefulSetName, m.Foreign, m.ForeignUnits)
}

func isOrAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
