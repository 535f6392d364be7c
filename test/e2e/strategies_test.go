package e2e

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// sequenced runs the fleet under the operator: N and V change through
// topology epochs without restarts, and the pod roll is the operator's.
type sequenced struct{}

func (*sequenced) Name() string { return "sequenced" }

func (*sequenced) Setup(w *world, topo ownership.Topology, replicas int32) {
	w.createSecrets()
	w.createStatefulSet(replicas, nil)
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := operator.New(ctx, w.env.Config, operator.Options{MetricsAddr: "0", ProbeAddr: "0",
		Cache:                        cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}},
		SkipControllerNameValidation: true})
	if err != nil {
		w.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	w.t.Cleanup(func() { cancel(); <-done })

	p := fleettest.FastParams()
	st := &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: w.ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions: int32(topo.Partitions), ShardsPerPartition: int32(topo.Shards),
			NATS: topologyv1.NATSSpec{
				URLs:                       w.natsURLs(),
				CredentialsSecretRef:       &topologyv1.SecretKeyRef{Name: "ingest-nats", Key: "app.creds"},
				SystemCredentialsSecretRef: &topologyv1.SecretKeyRef{Name: "ingest-nats", Key: "sys.creds"},
				Replicas:                   3,
				AckWait:                    &metav1.Duration{Duration: w.fleet.Opts.AckWait},
				PinnedTTL:                  &metav1.Duration{Duration: 30 * time.Second},
			},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "ingest-registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
			Rollout: topologyv1.RolloutSpec{
				DrainTimeout:  &metav1.Duration{Duration: w.fleet.Opts.DrainTimeout},
				LeaseTTL:      &metav1.Duration{Duration: p.LeaseTTL},
				RenewInterval: &metav1.Duration{Duration: p.RenewInterval},
			},
		},
	}
	if err := w.k.Create(ctx, st); err != nil {
		w.t.Fatal(err)
	}
	waitTopologyReady(w, topo)
	w.waitPodsReady(replicas, time.Minute)
}

func (*sequenced) Change(w *world, topo ownership.Topology) {
	ctx := context.Background()
	st := &topologyv1.ShardTopology{}
	if err := w.k.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "ingest"}, st); err != nil {
		w.t.Fatal(err)
	}
	st.Spec.Partitions, st.Spec.ShardsPerPartition = int32(topo.Partitions), int32(topo.Shards)
	if err := w.k.Update(ctx, st); err != nil {
		w.t.Fatal(err)
	}
	waitTopologyReady(w, topo)
}

func (*sequenced) RollPods(w *world) {
	w.updateTemplateEnv(map[string]string{"ROLL": "1"})
	st := &topologyv1.ShardTopology{}
	if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: "ingest"}, st); err != nil {
		w.t.Fatal(err)
	}
	// The operator sees the new revision and rolls; wait for it to
	// report a roll, then for Ready with every pod updated.
	w.waitPodsReady(*sts(w).Spec.Replicas, 5*time.Minute)
	waitTopologyReady(w, ownership.Topology{Partitions: int(st.Spec.Partitions), Shards: int(st.Spec.ShardsPerPartition)})
}

// waitTopologyReady waits for Ready=True at the current generation with
// the active epoch at topo, logging progress as the operator reports it.
func waitTopologyReady(w *world, topo ownership.Topology) {
	w.t.Helper()
	last := ""
	fleettest.Eventually(w.t, 5*time.Minute, func() error {
		st := &topologyv1.ShardTopology{}
		if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: "ingest"}, st); err != nil {
			return err
		}
		if line := fmt.Sprintf("phase=%s progress=%q", st.Status.Phase, st.Status.Progress); line != last {
			w.t.Logf("sequenced: %s", line)
			last = line
		}
		ready := meta.FindStatusCondition(st.Status.Conditions, topologyv1.ConditionReady)
		a := st.Status.ActiveEpoch
		switch {
		case st.Status.ObservedGeneration != st.Generation:
			return fmt.Errorf("observedGeneration %d of %d", st.Status.ObservedGeneration, st.Generation)
		case ready == nil || ready.Status != metav1.ConditionTrue:
			return fmt.Errorf("not Ready: %+v", ready)
		case a == nil || int(a.Partitions) != topo.Partitions || int(a.ShardsPerPartition) != topo.Shards:
			return fmt.Errorf("active epoch %+v, want %s", a, topo)
		}
		return nil
	})
}

// independent is the baseline: every worker places on its own with the N
// and V it was started with; a change is a pod-by-pod restart.
type independent struct {
	replicas int32
}

func (*independent) Name() string { return "independent" }

func (s *independent) Setup(w *world, topo ownership.Topology, replicas int32) {
	s.replicas = replicas
	s.provision(w, topo)
	w.createStatefulSet(replicas, map[string]string{
		"WORKER_STRATEGY": "independent", "REPLICAS": strconv.Itoa(int(replicas)),
		"PARTITIONS": strconv.Itoa(topo.Partitions), "SHARDS": strconv.Itoa(topo.Shards),
	})
	w.waitPodsReady(replicas, time.Minute)
}

func (s *independent) Change(w *world, topo ownership.Topology) {
	s.provision(w, topo)
	w.updateTemplateEnv(map[string]string{"PARTITIONS": strconv.Itoa(topo.Partitions), "SHARDS": strconv.Itoa(topo.Shards)})
	rollPodsByHand(w, s.replicas)
}

func (s *independent) RollPods(w *world) {
	w.updateTemplateEnv(map[string]string{"ROLL": "1"})
	rollPodsByHand(w, s.replicas)
}

// provision creates the consumers of topo (what a deploy pipeline does
// before rolling the workers; nothing is retired). They are plain pull
// consumers, without the pinned priority group the operator provisions:
// fleets that hash on their own run them so, and two pods pulling one
// consumer then both get rows.
func (s *independent) provision(w *world, topo ownership.Topology) {
	l := w.fleet.Layout
	l.Partitions, l.Shards, l.Unpinned = topo.Partitions, topo.Shards, true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := natsops.Provision(ctx, w.fleet.NATS.Connect(0), l); err != nil {
		w.t.Fatal(err)
	}
}
