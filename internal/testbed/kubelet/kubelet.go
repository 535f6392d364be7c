// Package kubelet is a small test kubelet: it runs one local process per
// pod of the envtest API server, reports the pod Running and Ready from the
// process's /readyz endpoint, restarts a process that dies, and on deletion
// sends SIGTERM, waits out the grace period, sends SIGKILL and removes the
// pod. It lets end-to-end tests run real worker processes under a real
// StatefulSet controller without a container runtime. Pods the caller
// picks (Kubelet.Container) run instead as Docker containers of the
// project's own images, on the host network, so a test can run the image a
// user deploys.
//
// It owns process lifecycles and pod status; what the processes do is the
// caller's business.
package kubelet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// NodeName is the node every pod is bound to. Binding matters: the API
// server deletes unbound pods at once, skipping the grace period the
// handover tests need.
const NodeName = "testbed-node"

// Kubelet runs the pods of one namespace.
type Kubelet struct {
	// Client reaches the API server.
	Client kubernetes.Interface
	// Namespace whose pods this kubelet runs.
	Namespace string
	// Images maps a container image to the local binary that runs it.
	Images map[string]string
	// ProbeAddrEnv names the environment variable through which a process
	// learns the address its /readyz endpoint must listen on.
	ProbeAddrEnv string
	// Env returns extra environment for a pod's process ("NAME=value"); it
	// comes after the container's own env, so it overrides it.
	Env func(pod *corev1.Pod) []string
	// Container, when set, picks the pods that run as Docker containers:
	// it returns the local image to run for the pod (ok false: run the
	// process from Images). The container runs the image's entrypoint with
	// the container's args, on the host network (so loopback addresses in
	// its environment and its probe address work as for a process), as the
	// image's user, with the environment a process would get.
	Container func(pod *corev1.Pod) (image string, ok bool)
	// Mounts are host paths bind-mounted at the same path into every
	// container, for files its environment names (a history directory).
	Mounts []string
	// Output, when set, returns the writer for a pod's process output. It
	// must be safe for concurrent use.
	Output func(pod string) io.Writer
	// BeforeStop, when set, is called with a deleted pod's name and its
	// process's probe address before the kubelet sends it SIGTERM: the
	// last moment a test can read what the process counted (its
	// /metrics), as a kubelet's preStop hook runs before the signal.
	BeforeStop func(pod, addr string)

	mu    sync.Mutex
	procs map[types.UID]*proc
	// started is every process started, restarts and replaced pods too.
	started []*proc
}

// Process is one process (or container) the kubelet started for a pod.
type Process struct {
	Pod string
	// PID is the process's id; 0 for a container, whose processes have
	// ids of their own namespace.
	PID int
	// Running says it had not exited when Started was called.
	Running bool
	// Signaled says it ended by a signal (a container: with a non-zero
	// status, which is how its client reports a kill).
	Signaled bool
}

// Started lists every process the kubelet started, in start order: each
// incarnation of each pod, so a test can require evidence from all of them.
func (k *Kubelet) Started() []Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Process, 0, len(k.started))
	for _, p := range k.started {
		sp := Process{Pod: p.pod, Running: true}
		if p.container == "" {
			sp.PID = p.cmd.Process.Pid
		}
		select {
		case <-p.exited:
			sp.Running = false
			if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
				sp.Signaled = ws.Signaled() || (p.container != "" && ws.ExitStatus() != 0)
			}
		default:
		}
		out = append(out, sp)
	}
	return out
}

type proc struct {
	pod  string
	uid  types.UID
	addr string
	// cmd is the process, or for a container the `docker run` client
	// attached to it.
	cmd *exec.Cmd
	// container is the Docker container's name; empty for a process.
	container string
	exited    chan struct{}
	restarts  int32
	stopping  bool
}

// Run reconciles pods with processes until ctx ends, then kills every
// process it started.
func (k *Kubelet) Run(ctx context.Context) error {
	k.procs = map[types.UID]*proc{}
	if err := k.ensureNode(ctx); err != nil {
		return err
	}
	defer k.killAll()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := k.syncOnce(ctx); err != nil && ctx.Err() == nil {
			// The API server may be briefly unavailable; keep going.
			_ = err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (k *Kubelet) ensureNode(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}
	_, err := k.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", NodeName, err)
	}
	return nil
}

func (k *Kubelet) syncOnce(ctx context.Context) error {
	pods, err := k.Client.CoreV1().Pods(k.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if err := k.syncPod(ctx, pod); err != nil && ctx.Err() == nil {
			return fmt.Errorf("sync pod %s: %w", pod.Name, err)
		}
	}
	return nil
}

// syncPod moves one pod one step: bind, start, report, stop.
func (k *Kubelet) syncPod(ctx context.Context, pod *corev1.Pod) error {
	switch {
	case pod.DeletionTimestamp != nil:
		return k.terminate(ctx, pod)
	case pod.Spec.NodeName == "":
		return k.bind(ctx, pod)
	}
	p := k.get(pod.UID)
	if p == nil {
		var err error
		if p, err = k.start(ctx, pod); err != nil {
			return err
		}
	}
	select {
	case <-p.exited:
		// Restart policy Always, as a StatefulSet's pods have.
		restarts := p.restarts + 1
		np, err := k.start(ctx, pod)
		if err != nil {
			return err
		}
		np.restarts = restarts
		p = np
	default:
	}
	return k.reportStatus(ctx, pod, p, ready(p.addr))
}

func (k *Kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: NodeName},
	}
	return k.Client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}

func (k *Kubelet) start(ctx context.Context, pod *corev1.Pod) (*proc, error) {
	if len(pod.Spec.Containers) != 1 {
		return nil, fmt.Errorf("pod %s has %d containers; the test kubelet runs exactly one", pod.Name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	image, inDocker := "", false
	if k.Container != nil {
		image, inDocker = k.Container(pod)
	}
	bin, ok := k.Images[c.Image]
	if !ok && !inDocker {
		return nil, fmt.Errorf("pod %s: no local binary for image %q", pod.Name, c.Image)
	}
	ownEnv, err := k.containerEnv(ctx, pod, &c)
	if err != nil {
		return nil, err
	}
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	env := append(ownEnv, "POD_NAME="+pod.Name, "POD_NAMESPACE="+pod.Namespace, k.ProbeAddrEnv+"="+addr)
	if k.Env != nil {
		env = append(env, k.Env(pod)...)
	}
	p := &proc{pod: pod.Name, uid: pod.UID, addr: addr, exited: make(chan struct{})}
	if inDocker {
		p.container = fmt.Sprintf("shardkeeper-kubelet-%s-%d", pod.Name, time.Now().UnixNano())
		p.cmd = dockerRun(p.container, image, &c, env, k.Mounts)
	} else {
		p.cmd = exec.Command(bin, append(append([]string{}, c.Command...), c.Args...)...)
		p.cmd.Env = env
	}
	if k.Output != nil {
		out := k.Output(pod.Name)
		p.cmd.Stdout, p.cmd.Stderr = out, out
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pod %s: %w", pod.Name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	k.mu.Lock()
	k.procs[pod.UID] = p
	k.started = append(k.started, p)
	k.mu.Unlock()
	return p, nil
}

// dockerRun is the `docker run` client of a pod's container. Environment
// values reach the container through the client's own environment (`-e
// NAME` copies NAME from it), so DSNs and passwords never appear in a
// command line.
func dockerRun(name, image string, c *corev1.Container, env, mounts []string) *exec.Cmd {
	args := []string{"run", "--rm", "--name", name, "--network", "host", "--label", "shardkeeper.dev/testbed=kubelet"}
	for _, m := range mounts {
		args = append(args, "--volume", m+":"+m)
	}
	seen := map[string]bool{}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if !seen[k] {
			seen[k] = true
			args = append(args, "--env", k)
		}
	}
	if len(c.Command) > 0 {
		args = append(args, "--entrypoint", c.Command[0])
	}
	args = append(args, image)
	if len(c.Command) > 1 {
		args = append(args, c.Command[1:]...)
	}
	args = append(args, c.Args...)
	cmd := exec.Command("docker", args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// containerEnv resolves the container's env as a kubelet does: literal
// values with $(VAR) references to variables defined before them, the pod's
// name and namespace from the downward API, and keys of Secrets and
// ConfigMaps, read from the API server.
func (k *Kubelet) containerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	var env []string
	defined := map[string]string{}
	for _, e := range c.Env {
		var v string
		switch f := e.ValueFrom; {
		case f == nil:
			v = expand(e.Value, defined)
		case f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.name":
			v = pod.Name
		case f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.namespace":
			v = pod.Namespace
		case f.SecretKeyRef != nil:
			s, err := k.Client.CoreV1().Secrets(pod.Namespace).Get(ctx, f.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("pod %s: env %s: Secret %s: %w", pod.Name, e.Name, f.SecretKeyRef.Name, err)
			}
			b, ok := s.Data[f.SecretKeyRef.Key]
			if !ok {
				return nil, fmt.Errorf("pod %s: env %s: Secret %s has no key %s", pod.Name, e.Name, f.SecretKeyRef.Name, f.SecretKeyRef.Key)
			}
			v = string(b)
		case f.ConfigMapKeyRef != nil:
			cm, err := k.Client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, f.ConfigMapKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("pod %s: env %s: ConfigMap %s: %w", pod.Name, e.Name, f.ConfigMapKeyRef.Name, err)
			}
			v = cm.Data[f.ConfigMapKeyRef.Key]
		default:
			return nil, fmt.Errorf("pod %s: env %s: this test kubelet resolves values, $(VAR), metadata.name, metadata.namespace, secretKeyRef and configMapKeyRef only", pod.Name, e.Name)
		}
		defined[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// expand replaces $(NAME) with NAME's value when NAME is defined and keeps
// the reference otherwise; $$ escapes a $, as in Kubernetes.
func expand(s string, defined map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
				name := s[i+2 : i+2+end]
				if v, ok := defined[name]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(s[i : i+3+end])
				}
				i += 2 + end
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func ready(addr string) bool {
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// reportStatus writes Running and the Ready condition when they changed.
func (k *Kubelet) reportStatus(ctx context.Context, pod *corev1.Pod, p *proc, isReady bool) error {
	status := corev1.ConditionFalse
	if isReady {
		status = corev1.ConditionTrue
	}
	cur := podCondition(pod, corev1.PodReady)
	if pod.Status.Phase == corev1.PodRunning && cur != nil && cur.Status == status &&
		len(pod.Status.ContainerStatuses) == 1 && pod.Status.ContainerStatuses[0].RestartCount == p.restarts {
		return nil
	}
	now := metav1.Now()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP, pod.Status.HostIP = "127.0.0.1", "127.0.0.1"
	if pod.Status.StartTime == nil {
		pod.Status.StartTime = &now
	}
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
	}
	c := pod.Spec.Containers[0]
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: c.Name, Image: c.Image, Ready: isReady, RestartCount: p.restarts, Started: ptr.To(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	_, err := k.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // next tick sees the fresh object
	}
	return err
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// terminate stops a deleted pod's process the way a kubelet does, then
// removes the pod object so its controller can replace it.
func (k *Kubelet) terminate(ctx context.Context, pod *corev1.Pod) error {
	if p := k.markStopping(pod.UID); p != nil {
		if k.BeforeStop != nil {
			k.BeforeStop(p.pod, p.addr)
		}
		grace := 30 * time.Second
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		go stopProcess(p, grace)
		return nil
	}
	if p := k.get(pod.UID); p != nil {
		select {
		case <-p.exited:
		default:
			return nil // still within its grace period
		}
		k.mu.Lock()
		delete(k.procs, pod.UID)
		k.mu.Unlock()
	}
	err := k.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func stopProcess(p *proc, grace time.Duration) {
	_ = p.signal(syscall.SIGCONT) // a paused process cannot handle SIGTERM
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.kill()
	}
}

// signal sends sig to the process, or to the container's main process.
// A container that is not created yet gets it through the client, which
// forwards signals once the container runs.
func (p *proc) signal(sig syscall.Signal) error {
	if p.container != "" {
		if err := exec.Command("docker", "kill", "--signal", fmt.Sprint(int(sig)), p.container).Run(); err == nil {
			return nil
		}
	}
	return p.cmd.Process.Signal(sig)
}

// kill ends the process or removes the container at once, and waits until
// it is gone.
func (p *proc) kill() {
	if p.container != "" {
		_ = exec.Command("docker", "rm", "--force", p.container).Run()
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// markStopping flags the pod's process as stopping and returns it, or nil
// when there is none or it was already flagged.
func (k *Kubelet) markStopping(uid types.UID) *proc {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.procs[uid]
	if p == nil || p.stopping {
		return nil
	}
	p.stopping = true
	return p
}

func (k *Kubelet) get(uid types.UID) *proc {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.procs[uid]
}

// Signal sends sig to the process of the named pod (SIGKILL, SIGSTOP and
// SIGCONT are the usual faults).
func (k *Kubelet) Signal(pod string, sig syscall.Signal) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.procs {
		if p.pod == pod && !p.stopping {
			return p.signal(sig)
		}
	}
	return fmt.Errorf("no running process for pod %s", pod)
}

// Addr is the probe address of the named pod's process: its /readyz and
// /metrics live there.
func (k *Kubelet) Addr(pod string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.procs {
		if p.pod == pod && !p.stopping {
			return p.addr, true
		}
	}
	return "", false
}

// Addrs maps every pod whose process is running, terminating ones
// included (they may still hold units while they hand over), to its probe
// address. Two processes of one pod name (old and replacement) get the
// old one suffixed with its UID.
func (k *Kubelet) Addrs() map[string]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]string{}
	for _, p := range k.procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		name := p.pod
		if p.stopping {
			name += "@" + string(p.uid)
		}
		out[name] = p.addr
	}
	return out
}

func (k *Kubelet) killAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.procs {
		p.kill()
	}
}
