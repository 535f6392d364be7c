package kubetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The StatefulSet controller of the source-built kube-controller-manager
// creates pods against the envtest API server: the end-to-end tests rely
// on it.
func TestControllerManagerRunsStatefulSetController(t *testing.T) {
	env, err := Start()
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
	ctx := context.Background()
	labels := map[string]string{"app": "w"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](2),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: "w"}}},
			},
		},
	}
	if _, err := cs.AppsV1().StatefulSets("default").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=w"})
		if err == nil && len(pods.Items) == 2 {
			return
		}
		if time.Now().After(deadline) {
			n := -1
			if pods != nil {
				n = len(pods.Items)
			}
			t.Fatalf("%d pods after 60s (err %v); controller manager log:\n%s", n, err, cm.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A control plane that does not start in time says where its processes'
// output is and which setting gives it longer (make demo at load average
// 12 failed with only "timeout waiting for process kube-apiserver to
// start").
func TestAControlPlaneThatDoesNotStartSaysWhereToLook(t *testing.T) {
	t.Setenv(StartTimeoutEnv, "")
	_, err := StartWith(Options{StartTimeout: time.Millisecond})
	var se *StartError
	if !errors.As(err, &se) {
		t.Fatalf("StartWith with a 1ms start timeout: %v, want a *StartError", err)
	}
	t.Cleanup(func() { os.RemoveAll(se.LogDir) })
	for _, want := range []string{"timeout waiting for process", filepath.Join(se.LogDir, "apiserver.log"), filepath.Join(se.LogDir, "etcd.log"), StartTimeoutEnv + "="} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	for _, name := range []string{"apiserver.log", "etcd.log"} {
		if _, err := os.Stat(filepath.Join(se.LogDir, name)); err != nil {
			t.Errorf("the log the error names is not there: %v", err)
		}
	}
}
