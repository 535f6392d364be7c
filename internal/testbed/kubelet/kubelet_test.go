package kubelet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// The test binary doubles as the pod's program: with KUBELET_TEST_POD set
// it serves /readyz and exits on SIGTERM, printing that it did.
func TestMain(m *testing.M) {
	if os.Getenv("KUBELET_TEST_POD") == "1" {
		servePod()
		return
	}
	os.Exit(m.Run())
}

func servePod() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	http.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	go func() { _ = http.ListenAndServe(os.Getenv("PROBE_ADDR"), nil) }()
	<-term
	fmt.Printf("pod %s got SIGTERM\n", os.Getenv("POD_NAME"))
}

// syncBuffer is an io.Writer safe for the process-output goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPodsRunBecomeReadyAndStopGracefully(t *testing.T) {
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	cm, err := env.StartControllerManager("statefulset-controller")
	if err != nil {
		t.Fatal(err)
	}
	defer cm.Stop(context.Background())
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	out := &syncBuffer{}
	self, _ := os.Executable()
	kl := &Kubelet{
		Client: cs, Namespace: "default", ProbeAddrEnv: "PROBE_ADDR",
		Images: map[string]string{"test-pod": self},
		Env:    func(*corev1.Pod) []string { return []string{"KUBELET_TEST_POD=1"} },
		Output: func(string) io.Writer { return out },
	}
	go func() { _ = kl.Run(ctx) }()

	labels := map[string]string{"app": "w"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To[int32](2),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: "test-pod"}}},
			},
		},
	}
	if _, err := cs.AppsV1().StatefulSets("default").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// OrderedReady: w-1 is only created once w-0 reports Ready.
	waitReadyReplicas(t, cs, 2)

	old, err := cs.CoreV1().Pods("default").Get(ctx, "w-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, "w-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, func() error {
		if !strings.Contains(out.String(), "pod w-1 got SIGTERM") {
			return fmt.Errorf("w-1 did not get SIGTERM; output: %q", out.String())
		}
		p, err := cs.CoreV1().Pods("default").Get(ctx, "w-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == old.UID {
			return fmt.Errorf("w-1 not replaced yet")
		}
		return nil
	})
	waitReadyReplicas(t, cs, 2)
}

func waitReadyReplicas(t *testing.T, cs kubernetes.Interface, n int32) {
	t.Helper()
	poll(t, 60*time.Second, func() error {
		s, err := cs.AppsV1().StatefulSets("default").Get(context.Background(), "w", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Status.ReadyReplicas != n {
			return fmt.Errorf("%d ready replicas, want %d", s.Status.ReadyReplicas, n)
		}
		return nil
	})
}

var poll = testbed.Eventually

func TestExpandFollowsKubernetesRules(t *testing.T) {
	defined := map[string]string{"NS": "ingest", "NAME": "w"}
	tests := []struct{ in, want string }{
		{"$(NS)/$(NAME)", "ingest/w"},
		{"$(UNDEFINED) stays", "$(UNDEFINED) stays"},
		{"$$(NS) is escaped", "$(NS) is escaped"},
		{"a lone $ and $(unclosed", "a lone $ and $(unclosed"},
		{"trailing $", "trailing $"},
	}
	for _, tt := range tests {
		if got := expand(tt.in, defined); got != tt.want {
			t.Errorf("expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
