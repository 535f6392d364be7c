package chaos

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// Scenario 13: two topologies on one NATS account and one registry, both
// with the default subject prefix. One changes V while the other is
// deleted; each fleet's verdict is clean, the deletion retires only the
// deleted topology's consumers, and the changed one ends with exactly its
// own.

// sharedAccountAndRegistry starts a second topology beside the scenario's
// (namespace chaos-13b, same NATS account, the scenario's registry
// database), checks that the two got streams of their own marked with
// their owners, ends the second fleet's traffic and judges it, then
// changes the first to `to` and deletes the second while the first's new
// epoch is pending. The registry database holds both topologies' claims
// and, beside them, the one sink table the reference workers write behind
// the claim guard; each scene judges only its own rows (its scene id
// starts their ids). The fault must take effect: the second still had
// consumers and claims when deleted, and the first's change was under way
// (its epoch pending or claiming, registry) then.
func sharedAccountAndRegistry(to ownership.Topology) func(*scene) {
	return func(s *scene) {
		other := newScene(s.t, s.in, specInput{ID: "13b", Name: "the deleted neighbour", From: shape(2, 4), Replicas: 2, Rate: 40,
			DefaultPrefix: true, SharesRegistry: true, RegistryDSN: s.fleet.DSN})
		for _, sc := range []*scene{s, other} {
			sc.expectOwnStreams()
		}
		if s.fleet.Layout.SubjectPrefix == other.fleet.Layout.SubjectPrefix {
			s.t.Fatalf("both topologies use subject prefix %q", s.fleet.Layout.SubjectPrefix)
		}

		// The neighbour ends first: its publisher stops, every row is
		// delivered and judged. Then the first topology's change starts,
		// and the neighbour is deleted while the new epoch is pending, so
		// the operator retires one topology's consumers while it freezes,
		// claims and retires for the other on the same account.
		published := other.stopTraffic()
		v, _, err := other.fleet.Verdict(published, 3*time.Minute, false)
		switch {
		case err != nil:
			s.t.Errorf("the deleted neighbour lost rows (P3): %v", err)
		case !v.Clean():
			s.t.Errorf("the deleted neighbour's verdict is not clean: %s\n%s", v.FirstViolation, v.Table())
		case v.Published == 0:
			s.t.Errorf("the neighbour published nothing: its verdict checked nothing")
		}
		s.note("neighbour verdict: %d published, %d lost, %d overlapping windows, %d stale acks, %d unexplained duplicates",
			v.Published, v.Lost, v.OverlappingWindows, v.StaleAcks, v.DupUnexplained)
		s.setShape(to)
		s.awaitRegistry("epoch "+to.String()+" pending", 2*time.Minute, pendingIs(to))
		claims, consumers := len(other.owners()), 0
		for p := range other.input.From.Partitions {
			consumers += len(other.consumerNames(p))
		}
		step := s.stepNow(to)
		deleted := time.Now()
		other.deleteTopology()
		other.awaitGone(3 * time.Minute)
		s.settle()
		s.waitReady(to, readyTimeout)
		e, _ := s.epochOf(to)
		switch {
		case claims == 0 || consumers == 0:
			s.t.Errorf("the neighbour had %d claims and %d consumers when deleted: its deletion retired nothing", claims, consumers)
		case step == "done" || e.ActivatedAt.IsZero():
			s.t.Errorf("the change to %s was at step %s when the neighbour was deleted (epoch activated %v): no change of ours met the deletion", to, step, e.ActivatedAt)
		}
		s.note("neighbour deleted holding %d claims over %d consumers while our change to %s was at step %s (registry); our epoch activated %s after the deletion began",
			claims, consumers, to, step, e.ActivatedAt.Sub(deleted).Round(time.Millisecond))
		s.expectNothingStranded(to)
		s.expectOwnStreams()
		for p := range other.input.From.Partitions {
			if names := other.consumerNames(p); len(names) != 0 {
				s.t.Errorf("the deleted topology's drained consumers %v on %s were kept", names, other.fleet.Layout.StreamName(p))
			}
		}
		s.note("neighbour deleted while V changed: its drained consumers retired, its streams kept, ours untouched")
	}
}

// expectOwnStreams checks that each of the scene's partition streams and
// unit consumers carries its topology's owner mark.
func (s *scene) expectOwnStreams() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topo := &topologyv1.ShardTopology{}
	if err := s.in.k.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "ingest"}, topo); err != nil {
		s.t.Fatal(err)
	}
	if topo.Status.SubjectPrefix != s.fleet.Layout.SubjectPrefix {
		s.t.Errorf("status.subjectPrefix %q, want %q", topo.Status.SubjectPrefix, s.fleet.Layout.SubjectPrefix)
	}
	owner := s.ns + "/ingest"
	for p := range s.spec().Partitions {
		st, err := s.jetstream().Stream(ctx, s.fleet.Layout.StreamName(p))
		if err != nil {
			s.t.Fatal(err)
		}
		if m := st.CachedInfo().Config.Metadata; m[natsops.OwnerKey] != owner || m[natsops.OwnerUIDKey] != string(topo.UID) {
			s.t.Errorf("stream %s metadata %v, want owner %s (%s)", s.fleet.Layout.StreamName(p), m, owner, topo.UID)
		}
		for _, name := range s.consumerNames(p) {
			c, err := s.jetstream().Consumer(ctx, s.fleet.Layout.StreamName(p), name)
			if err != nil {
				s.t.Fatal(err)
			}
			if m := c.CachedInfo().Config.Metadata; m[natsops.OwnerKey] != owner {
				s.t.Errorf("consumer %s/%s metadata %v, want owner %s", s.fleet.Layout.StreamName(p), name, m, owner)
			}
		}
	}
}

// deleteTopology deletes the scene's topology as README says: the workers
// scaled to 0 (they hand over and leave), the object deleted.
func (s *scene) deleteTopology() {
	s.t.Helper()
	ctx := context.Background()
	sts := &appsv1.StatefulSet{}
	if err := s.in.k.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "ingest"}, sts); err != nil {
		s.t.Fatal(err)
	}
	sts.Spec.Replicas = ptr.To[int32](0)
	if err := s.in.k.Update(ctx, sts); err != nil {
		s.t.Fatalf("scale the workers to 0: %v", err)
	}
	topo := &topologyv1.ShardTopology{}
	topo.Namespace, topo.Name = s.ns, "ingest"
	if err := s.in.k.Delete(ctx, topo); err != nil {
		s.t.Fatalf("delete the topology: %v", err)
	}
	s.t.Logf("topology %s/ingest deleted, workers scaled to 0", s.ns)
}

// awaitGone waits until the finalizer let the topology go.
func (s *scene) awaitGone(timeout time.Duration) {
	s.t.Helper()
	s.eventually(timeout, func() error {
		err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, &topologyv1.ShardTopology{})
		if !apierrors.IsNotFound(err) {
			g, _ := s.status.latest()
			msg := ""
			if g.obj != nil {
				msg = g.obj.Status.Progress
			}
			return fmt.Errorf("topology still there (%v): %s", err, msg)
		}
		return nil
	})
	s.note("topology %s/ingest gone", s.ns)
}
