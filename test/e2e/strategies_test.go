package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// sequenced runs the fleet under the operator: N and V change through
// topology epochs without restarts, and the pod roll is the operator's.
// The operator runs as its own ServiceAccount, bound only by what config/rbac
// grants: a verb the role lacks fails the scenario.
type sequenced struct {
	// startOperator starts the operator against w; nil runs it in this
	// process (startOperatorInProcess).
	startOperator func(w *world)
}

func (*sequenced) Name() string { return "sequenced" }

func (s *sequenced) Setup(w *world, topo ownership.Topology, replicas int32) {
	w.createStatefulSet(replicas, nil)
	start := s.startOperator
	if start == nil {
		start = startOperatorInProcess
	}
	start(w)
	if err := w.k.Create(context.Background(), sampleTopology(w, topo)); err != nil {
		w.t.Fatal(err)
	}
	waitTopologyReady(w, topo)
	w.waitPodsReady(replicas, time.Minute)
}

// startOperatorInProcess runs the operator's manager in this process,
// watching the world's namespace (--watch-namespace), as the operator's
// ServiceAccount under config/rbac.
func startOperatorInProcess(w *world) {
	cfg := w.operatorConfig()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := operator.New(ctx, cfg, operator.Options{MetricsAddr: "0", ProbeAddr: "0",
		WatchNamespaces: []string{w.ns}, SkipControllerNameValidation: true})
	if err != nil {
		cancel()
		w.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	w.t.Cleanup(func() { cancel(); <-done })
}

// Where config/rbac puts the operator's identity.
const (
	operatorNamespace = "shardkeeper-system"
	operatorSA        = "shardkeeper"
)

// operatorConfig applies config/rbac, rendered as users install it, and
// returns a client config that authenticates with a token of the
// operator's ServiceAccount and nothing else.
func (w *world) operatorConfig() *rest.Config {
	w.t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		w.t.Fatal(err)
	}
	rbac, err := kubetest.Kustomize(filepath.Join(root, "config", "rbac"))
	if err != nil {
		w.t.Fatal(err)
	}
	w.ensureNamespace(operatorNamespace)
	if err := w.env.Apply(rbac); err != nil {
		w.t.Fatal(err)
	}
	return w.env.TokenConfig(w.token(operatorNamespace, operatorSA))
}

func (w *world) token(ns, sa string) string {
	w.t.Helper()
	tok, err := w.env.ServiceAccountToken(context.Background(), ns, sa, time.Hour)
	if err != nil {
		w.t.Fatal(err)
	}
	return tok
}

func (w *world) ensureNamespace(name string) {
	w.t.Helper()
	err := w.k.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatal(err)
	}
}

// sampleTopology is config/samples' ShardTopology, adapted to the test bed
// where it must be: the NATS URLs, the shape, and timings short enough for
// a test (the fleet's drain and lease parameters, ack wait, pinned TTL).
func sampleTopology(w *world, topo ownership.Topology) *topologyv1.ShardTopology {
	w.t.Helper()
	docs := sampleDocs(w.t, "topology_v1alpha1_shardtopology.yaml")
	st := &topologyv1.ShardTopology{}
	if len(docs) != 1 {
		w.t.Fatalf("topology_v1alpha1_shardtopology.yaml holds %d documents, want 1", len(docs))
	}
	if err := yaml.UnmarshalStrict(docs[0], st); err != nil {
		w.t.Fatalf("topology_v1alpha1_shardtopology.yaml: %v", err)
	}
	if st.Spec.Workload.StatefulSetName != "ingest" {
		w.t.Fatalf("the samples disagree: the ShardTopology's workload is %q, the StatefulSet is ingest", st.Spec.Workload.StatefulSetName)
	}
	p := fleettest.FastParams()
	st.Namespace = w.ns
	st.Spec.Partitions, st.Spec.ShardsPerPartition = int32(topo.Partitions), int32(topo.Shards)
	st.Spec.NATS.URLs = w.natsURLs()
	if a := w.fleet.Opts.Assignment; a != "" {
		st.Spec.NATS.ShardAssignment = topologyv1.ShardAssignment(a)
	}
	st.Spec.NATS.AckWait = &metav1.Duration{Duration: w.fleet.Opts.AckWait}
	st.Spec.NATS.PinnedTTL = &metav1.Duration{Duration: 30 * time.Second}
	st.Spec.Rollout.DrainTimeout = &metav1.Duration{Duration: w.fleet.Opts.DrainTimeout}
	st.Spec.Rollout.LeaseTTL = &metav1.Duration{Duration: p.LeaseTTL}
	st.Spec.Rollout.RenewInterval = &metav1.Duration{Duration: p.RenewInterval}
	return st
}

func (*sequenced) Change(w *world, topo ownership.Topology) {
	ctx := context.Background()
	// The operator's status writes move the resourceVersion meanwhile.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		st := &topologyv1.ShardTopology{}
		if err := w.k.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "ingest"}, st); err != nil {
			return err
		}
		st.Spec.Partitions, st.Spec.ShardsPerPartition = int32(topo.Partitions), int32(topo.Shards)
		return w.k.Update(ctx, st)
	})
	if err != nil {
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
	// The operator sees the new revision and rolls; wait for every pod
	// to be updated and Ready, then for the topology's Ready. A refusal
	// of the operator's ServiceAccount fails at once.
	replicas := *sts(w).Spec.Replicas
	fleettest.Eventually(w.t, 5*time.Minute, func() error {
		now := &topologyv1.ShardTopology{}
		if err := w.k.Get(context.Background(), client.ObjectKeyFromObject(st), now); err != nil {
			return err
		}
		failOnForbidden(w, now)
		failOnMultiplyOwned(w, now)
		return w.podsReady(replicas)
	})
	waitTopologyReady(w, ownership.Topology{Partitions: int(st.Spec.Partitions), Shards: int(st.Spec.ShardsPerPartition)})
}

// waitTopologyReady waits for Ready=True at the current generation with
// the active epoch at topo, logging progress as the operator reports it.
func waitTopologyReady(w *world, topo ownership.Topology) {
	w.t.Helper()
	last := ""
	var notReady readyLog
	fleettest.Eventually(w.t, 5*time.Minute, func() error {
		st := &topologyv1.ShardTopology{}
		if err := w.k.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: "ingest"}, st); err != nil {
			return err
		}
		if line := fmt.Sprintf("phase=%s progress=%q", st.Status.Phase, st.Status.Progress); line != last {
			w.t.Logf("sequenced: %s", line)
			last = line
		}
		failOnForbidden(w, st)
		failOnMultiplyOwned(w, st)
		ready := meta.FindStatusCondition(st.Status.Conditions, topologyv1.ConditionReady)
		notReady.log(w, ready)
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

// readyLog logs why a topology is not Ready while a test waits for it:
// each new reason at once, a changed message under the same reason at
// most every 15 s. A wait that times out then shows what the units said
// (stalled, and why) along the way, not only its last error.
type readyLog struct {
	reason, message string
	at              time.Time
}

func (r *readyLog) log(w *world, ready *metav1.Condition) {
	if ready == nil || ready.Status == metav1.ConditionTrue {
		return
	}
	if ready.Reason == r.reason && (ready.Message == r.message || time.Since(r.at) < 15*time.Second) {
		return
	}
	w.t.Logf("not Ready: %s: %s", ready.Reason, ready.Message)
	r.reason, r.message, r.at = ready.Reason, ready.Message, time.Now()
}

// failOnMultiplyOwned fails the test at once when status counts a unit
// as multiply owned while the operator changes the topology or rolls the
// pods: every unit moves by a handover, whose pull windows are sequential,
// so a count is either a false P1 signal (issue 21: the old rule read 11
// and 22 in a plain pod roll) or a real violation.
func failOnMultiplyOwned(w *world, st *topologyv1.ShardTopology) {
	if u := st.Status.Units; u != nil && u.MultiplyOwned > 0 {
		w.t.Fatalf("status counts %d units multiply owned (phase %s, progress %q)", u.MultiplyOwned, st.Status.Phase, st.Status.Progress)
	}
}

// failOnForbidden fails the test at once when the topology's status says
// the API server refused the operator: its ServiceAccount's role lacks a
// permission, and waiting longer cannot help.
func failOnForbidden(w *world, st *topologyv1.ShardTopology) {
	for _, c := range st.Status.Conditions {
		if strings.Contains(c.Message, "forbidden") {
			w.t.Fatalf("the operator's ServiceAccount was refused (config/rbac lacks a permission the operator uses): %s=%s %s: %s",
				c.Type, c.Status, c.Reason, c.Message)
		}
	}
}

// independent is the baseline: every worker places on its own with the N
// and V it was started with; a change is a pod-by-pod restart, highest
// ordinal first, as a StatefulSet rolls.
type independent struct {
	replicas int32
	topo     ownership.Topology
	// extra are the rows driveOverlap published; moved counts the units
	// it found pulled by an old and a replaced pod at once; overlaps are
	// the overlapping windows it saw on them (it stops driving at the
	// first change of a run that shows some); drives numbers its drives.
	extra    map[string]ownership.Unit
	moved    int
	overlaps int64
	drives   int
}

func (*independent) Name() string { return "independent" }

func (s *independent) Setup(w *world, topo ownership.Topology, replicas int32) {
	s.replicas, s.topo, s.extra = replicas, topo, map[string]ownership.Unit{}
	s.provision(w, topo)
	w.createStatefulSet(replicas, map[string]string{
		"WORKER_STRATEGY": "independent", "REPLICAS": strconv.Itoa(int(replicas)),
		"PARTITIONS": strconv.Itoa(topo.Partitions), "SHARDS": strconv.Itoa(topo.Shards),
		// Without a registry nobody tells these workers the prefix the
		// fleet's streams use (the sample's topology derives one per
		// namespace); a fleet hashing on its own configures it.
		"SUBJECT_PREFIX": w.fleet.Layout.SubjectPrefix, "CONSUMER_NAME": w.fleet.Layout.ConsumerName,
	})
	w.waitPodsReady(replicas, time.Minute)
}

func (s *independent) Change(w *world, topo ownership.Topology) {
	s.provision(w, topo)
	w.updateTemplateEnv(map[string]string{"PARTITIONS": strconv.Itoa(topo.Partitions), "SHARDS": strconv.Itoa(topo.Shards)})
	from := s.topo
	rollPodsByHand(w, s.replicas, func(replaced int) {
		if s.overlaps > 0 {
			return
		}
		moved := movedUnits(from, topo, s.replicas, replaced)
		s.moved += len(moved)
		rows, n := s.driveOverlap(w, moved)
		maps.Copy(s.extra, rows)
		s.overlaps += n
	})
	s.topo = topo
}

// Extra implements extraRows.
func (s *independent) Extra() map[string]ownership.Unit { return s.extra }

func (s *independent) RollPods(w *world) {
	w.updateTemplateEnv(map[string]string{"ROLL": "1"})
	rollPodsByHand(w, s.replicas, nil)
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
	if _, err := w.fleet.Provision(ctx, l); err != nil {
		w.t.Fatal(err)
	}
}
