package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubelet"
)

// lockedBuffer collects the pods' output; the kubelet writes from several
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A template change rolls the worker pods one at a time, highest ordinal
// first: each pod is asked to hand over, deleted only once the registry
// shows it holds nothing, and the next one waits until the replacement is
// Ready, joined and holds its placement. An operator restart in the middle
// resumes the roll. The pods are real processes under the real StatefulSet
// controller, each a worker against the registry.
// checks P1, checks P7
func TestPodRollHandsOverBeforeDeletingEachPod(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 6})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cm, err := testEnv.StartControllerManager("statefulset-controller")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cm.Stop(context.Background()) }()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	kl := &kubelet.Kubelet{
		Client:       kubernetes.NewForConfigOrDie(cfg),
		Namespace:    f.ns,
		ProbeAddrEnv: simProbeEnv,
		Images:       map[string]string{"sim-worker": self},
		Env: func(*corev1.Pod) []string {
			return []string{simWorkerEnv + "=1", simDSNEnv + "=" + f.dsn, simTopologyEnv + "=" + f.key()}
		},
		Output: func(string) io.Writer { return out },
	}
	kubeletDone := make(chan struct{})
	go func() { defer close(kubeletDone); _ = kl.Run(ctx) }()
	defer func() { cancel(); <-kubeletDone }()

	defer func() {
		if t.Failed() {
			for _, e := range listEvents(t, f.ns, "") {
				t.Logf("event %s %s %s", e.EventTime.Format("15:04:05.000"), e.Reason, e.Note)
			}
			t.Logf("pods' output:\n%s", out.String())
		}
	}()
	f.withStatefulSet(3, "sim-worker")
	op := startOperator(t, f.ns)
	f.create()
	st := f.waitStatus(120*time.Second, func(o *topologyv1.ShardTopology) error {
		if o.Status.Phase != topologyv1.PhaseReady || o.Status.Units == nil || o.Status.Units.Owned != 6 {
			return errors.New("want Ready with 6 units owned")
		}
		if n := len(f.snapshot().LiveMembers()); n != 3 {
			return fmt.Errorf("%d live members, want 3", n)
		}
		return nil
	})
	if st.Status.Rollout != nil {
		t.Fatalf("rollout %+v before any template change", st.Status.Rollout)
	}
	oldUIDs := podUIDs(t, f.ns)

	// Change the template: every pod is now outdated.
	sts := &appsv1.StatefulSet{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "ingest"}, sts); err != nil {
		t.Fatal(err)
	}
	patched := sts.DeepCopy()
	patched.Spec.Template.Annotations = map[string]string{"shardkeeper.dev/test-revision": "2"}
	if err := k.Patch(ctx, patched, client.MergeFrom(sts)); err != nil {
		t.Fatal(err)
	}

	// Watch the roll's progress as kubectl get shows it, and restart the
	// operator once the first pod was deleted.
	var progress []string
	seen := func(o *topologyv1.ShardTopology) {
		if !slices.Contains(progress, o.Status.Progress) {
			progress = append(progress, o.Status.Progress)
		}
	}
	waitEvent(t, f.ns, "PodDeleted", "ingest-2")
	op.stop()
	startOperator(t, f.ns)

	f.waitStatus(180*time.Second, func(o *topologyv1.ShardTopology) error {
		seen(o)
		if o.Status.Phase != topologyv1.PhaseReady || o.Status.Rollout != nil || o.Status.ObservedGeneration != o.Generation {
			return errors.New("want Ready with no rollout")
		}
		cur := &appsv1.StatefulSet{}
		if err := k.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "ingest"}, cur); err != nil {
			return err
		}
		var pods corev1.PodList
		if err := k.List(ctx, &pods, client.InNamespace(f.ns)); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != cur.Status.UpdateRevision {
				return fmt.Errorf("pod %s at revision %s, want %s", p.Name, p.Labels[appsv1.ControllerRevisionHashLabelKey], cur.Status.UpdateRevision)
			}
		}
		return nil
	})

	// Highest ordinal first, each deleted after its hand-over was verified.
	var deleted []string
	for _, e := range listEvents(t, f.ns, "PodDeleted") {
		deleted = append(deleted, podInNote(e.Note))
	}
	if want := []string{"ingest-2", "ingest-1", "ingest-0"}; !slices.Equal(deleted, want) {
		t.Fatalf("pods deleted in order %v, want %v", deleted, want)
	}
	for _, pod := range deleted {
		verified := eventTime(t, f.ns, "PodHandoverVerified", pod)
		del := eventTime(t, f.ns, "PodDeleted", pod)
		if verified.IsZero() || del.Before(verified) {
			t.Errorf("pod %s deleted at %s, hand-over verified at %s", pod, del, verified)
		}
		if eventTime(t, f.ns, "PodRejoined", pod).IsZero() {
			t.Errorf("no PodRejoined event for %s", pod)
		}
	}
	// P1's operator half: every pod it deleted held nothing by then.
	re := regexp.MustCompile(`sim-worker (\S+) incarnation \d+ held (\d+) units at SIGTERM`)
	terminated := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
		terminated[m[1]] = true
		if m[2] != "0" {
			t.Errorf("pod %s held %s units when it was terminated", m[1], m[2])
		}
	}
	if len(terminated) != 3 {
		t.Fatalf("terminated pods %v, want all three; output:\n%s", terminated, out.String())
	}
	newUIDs := podUIDs(t, f.ns)
	for name, uid := range oldUIDs {
		if newUIDs[name] == uid {
			t.Errorf("pod %s was not replaced", name)
		}
	}
	for _, m := range f.snapshot().Members {
		if m.Draining {
			t.Errorf("member %s still draining after the roll", m.Name)
		}
	}
	if !slices.ContainsFunc(progress, func(p string) bool { return strings.Contains(p, "pods 2/3") }) {
		t.Errorf("progress never showed the pods done out of the total: %q", progress)
	}
}

func podUIDs(t *testing.T, ns string) map[string]types.UID {
	t.Helper()
	var pods corev1.PodList
	if err := k.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		out[p.Name] = p.UID
	}
	return out
}

var podNameRE = regexp.MustCompile(`pod (ingest-\d+)`)

func podInNote(note string) string {
	if m := podNameRE.FindStringSubmatch(note); m != nil {
		return m[1]
	}
	return ""
}

// eventTime is when the first Event with reason about pod happened.
func eventTime(t *testing.T, ns, reason, pod string) time.Time {
	t.Helper()
	for _, e := range listEvents(t, ns, reason) {
		if podInNote(e.Note) == pod {
			return e.EventTime.Time
		}
	}
	return time.Time{}
}
