package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// What scenarios do to the world: change the spec, roll the pods, signal
// processes, and wait for what the registry or status shows.

// updateTopology applies change to the ShardTopology, retrying on
// conflicts with the operator's writes.
func (s *scene) updateTopology(change func(*topologyv1.ShardTopology)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		st := &topologyv1.ShardTopology{}
		if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, st); err != nil {
			return err
		}
		change(st)
		return s.in.k.Update(context.Background(), st)
	})
}

// setShape changes the spec's N and V.
func (s *scene) setShape(to ownership.Topology) {
	s.t.Helper()
	s.disturb()
	if err := s.updateTopology(func(st *topologyv1.ShardTopology) {
		st.Spec.Partitions, st.Spec.ShardsPerPartition = int32(to.Partitions), int32(to.Shards)
	}); err != nil {
		s.t.Fatalf("set shape %s: %v", to, err)
	}
	s.shapes = append(s.shapes, to)
	s.t.Logf("spec set to %s", to)
}

// annotate sets (or, with value "", removes) an annotation.
func (s *scene) annotate(key, value string) {
	s.t.Helper()
	if err := s.updateTopology(func(st *topologyv1.ShardTopology) {
		if value == "" {
			delete(st.Annotations, key)
			return
		}
		if st.Annotations == nil {
			st.Annotations = map[string]string{}
		}
		st.Annotations[key] = value
	}); err != nil {
		s.t.Fatalf("annotate %s=%q: %v", key, value, err)
	}
}

// spec is the shape the spec asks for now.
func (s *scene) spec() ownership.Topology {
	s.t.Helper()
	st := &topologyv1.ShardTopology{}
	if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, st); err != nil {
		s.t.Fatal(err)
	}
	return ownership.Topology{Partitions: int(st.Spec.Partitions), Shards: int(st.Spec.ShardsPerPartition)}
}

// rollPods changes the worker StatefulSet's pod template, which the
// operator rolls pod by pod.
func (s *scene) rollPods() {
	s.t.Helper()
	s.disturb()
	s.rolls++
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sts := &appsv1.StatefulSet{}
		if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, sts); err != nil {
			return err
		}
		c := &sts.Spec.Template.Spec.Containers[0]
		c.Env = append(withoutEnv(c.Env, "ROLL"), corev1.EnvVar{Name: "ROLL", Value: strconv.Itoa(s.rolls)})
		return s.in.k.Update(context.Background(), sts)
	})
	if err != nil {
		s.t.Fatalf("change the pod template: %v", err)
	}
	s.t.Logf("pod template changed (roll %d)", s.rolls)
}

func withoutEnv(env []corev1.EnvVar, name string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if e.Name != name {
			out = append(out, e)
		}
	}
	return out
}

// waitReady waits until status says Ready at topo and the current
// generation, and returns when it was first seen so (no earlier than now:
// a Ready seen before the call counts from the call).
func (s *scene) waitReady(topo ownership.Topology, timeout time.Duration) time.Time {
	s.t.Helper()
	from := time.Now()
	if _, ok := s.status.await(from, timeout, func(g sighting) bool { return g.readyAt(topo) && s.generationIs(g) }); !ok {
		last, _ := s.status.latest()
		s.t.Fatalf("ShardTopology not Ready at %s within %s; last status: %s", topo, timeout, last)
	}
	g, _ := s.status.latest()
	return maxTime(from, firstReadySince(s.status.since(from), topo, g.at))
}

// firstReadySince is when the run of Ready versions that ends the list
// began, or def.
func firstReadySince(seen []sighting, topo ownership.Topology, def time.Time) time.Time {
	at := def
	for i := len(seen) - 1; i >= 0 && seen[i].readyAt(topo); i-- {
		at = seen[i].at
	}
	return at
}

// generationIs reports whether g is of the object's current generation
// (the watch may lag a spec change the test just made).
func (s *scene) generationIs(g sighting) bool {
	st := &topologyv1.ShardTopology{}
	if err := s.in.k.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "ingest"}, st); err != nil {
		return false
	}
	return st.Generation == g.obj.Generation
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// awaitStatus waits until status satisfies ok and returns that version.
func (s *scene) awaitStatus(what string, timeout time.Duration, ok func(sighting) bool) sighting {
	s.t.Helper()
	g, found := s.status.await(time.Now(), timeout, ok)
	if !found {
		last, _ := s.status.latest()
		s.t.Fatalf("status never showed %s within %s; last: %s", what, timeout, last)
	}
	return g
}

// snapshot reads the registry directly (not through the proxy).
func (s *scene) snapshot() (poolctl.Snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.fleet.Registry.Snapshot(ctx, s.fleet.Topology)
}

// claims reads every claim row directly.
func (s *scene) claims() map[string]poolctl.ClaimInfo {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := s.fleet.Registry.Claims(ctx, s.fleet.Topology)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]poolctl.ClaimInfo{}
	for _, c := range rows {
		out[c.Unit] = c
	}
	return out
}

// awaitRegistry polls the registry every 20ms until ok holds, and
// returns that snapshot: the short poll lets a fault land inside a step
// that lasts a second.
func (s *scene) awaitRegistry(what string, timeout time.Duration, ok func(poolctl.Snapshot) bool) poolctl.Snapshot {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		snap, err := s.snapshot()
		if err == nil && ok(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the registry never showed %s within %s (last error %v)", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pendingIs says a snapshot has the pending epoch of shape to.
func pendingIs(to ownership.Topology) func(poolctl.Snapshot) bool {
	return func(sn poolctl.Snapshot) bool {
		return sn.Pending != nil && sn.Pending.Partitions == to.Partitions && sn.Pending.Shards == to.Shards
	}
}

// activeIs says a snapshot has the active epoch of shape to.
func activeIs(to ownership.Topology) func(poolctl.Snapshot) bool {
	return func(sn poolctl.Snapshot) bool {
		return sn.Active != nil && sn.Active.Partitions == to.Partitions && sn.Active.Shards == to.Shards
	}
}

// signalPod sends sig to pod's worker process.
func (s *scene) signalPod(pod string, sig syscall.Signal) {
	s.t.Helper()
	if err := s.kubelet.Signal(pod, sig); err != nil {
		s.t.Fatalf("signal %s to %s: %v", unix.SignalName(sig), pod, err)
	}
	s.t.Logf("sent %s to %s", unix.SignalName(sig), pod)
}

// pause is one SIGSTOP of a worker process: its pid, when it was seen
// stopped (after that instant it records nothing until it runs again) and
// when the test sent SIGCONT.
type pause struct {
	pid               int
	stoppedAt, contAt time.Time
}

// pauseFor SIGSTOPs pod's worker for d (the fault's length), then
// SIGCONTs it, unless the kubelet already stopped it (it resumes a paused
// process before its SIGTERM). It returns once the worker was sent
// SIGCONT. A slow sink is taken off the pod at once: the process is
// paused, and a replacement must not be slow. held is called while the
// process is seen stopped, to read what it held at the fault.
func (s *scene) pauseFor(pod string, d time.Duration, held func()) pause {
	s.t.Helper()
	p := pause{pid: s.runningPID(pod)}
	s.signalPod(pod, syscall.SIGSTOP)
	s.eventually(10*time.Second, func() error {
		if st := procState(p.pid); st != "T" {
			return fmt.Errorf("%s (pid %d) is in state %q, not stopped yet", pod, p.pid, st)
		}
		return nil
	})
	p.stoppedAt = time.Now()
	s.slowSink(pod, 0)
	held()
	time.Sleep(d) // the fault's length
	p.contAt = time.Now()
	if err := s.kubelet.Signal(pod, syscall.SIGCONT); err != nil {
		s.note("%s was resumed by the kubelet on deletion before the test resumed it", pod)
	}
	return p
}

// runningPID is the pid of pod's running worker process.
func (s *scene) runningPID(pod string) int {
	s.t.Helper()
	pid := 0
	for _, p := range s.kubelet.Started() {
		if p.Pod == pod && p.Running {
			pid = p.PID
		}
	}
	if pid == 0 {
		s.t.Fatalf("no running process of %s", pod)
	}
	return pid
}

// procState is a process's state letter from /proc/<pid>/stat ("T":
// stopped), "" when it cannot be read.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, so cut at the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// holderOf is who holds unit in the registry now ("" when nobody).
func (s *scene) holderOf(unit string) string {
	c, ok := s.claims()[unit]
	if !ok || c.State == poolctl.StateFree {
		return ""
	}
	return c.Owner
}

// unitsOf lists the units member holds now.
func (s *scene) unitsOf(member string) []string {
	var out []string
	for u, c := range s.claims() {
		if c.State != poolctl.StateFree && c.Owner == member {
			out = append(out, u)
		}
	}
	return out
}

// follower moves the publisher to the active epoch's shape as soon as the
// registry activates it, as a publisher that reads the topology does: new
// units get rows from activation on, units that left get none after it.
// Under ordering PerKey it also acknowledges each active epoch
// (pkg/publish.Acknowledge), the first one included: a change of N's
// order barrier records its switches only once the publishers did.
type follower struct {
	stopc chan struct{}
	done  chan struct{}
}

func startFollower(s *scene, pub *fleettest.Publisher) *follower {
	f := &follower{stopc: make(chan struct{}), done: make(chan struct{})}
	cur := s.input.From
	acknowledges := s.input.Ordering == topologyv1.OrderingPerKey
	var acked int64
	go func() {
		defer close(f.done)
		for {
			select {
			case <-f.stopc:
				return
			case <-time.After(100 * time.Millisecond):
			}
			snap, err := s.snapshot()
			if err != nil || snap.Active == nil {
				continue
			}
			a := ownership.Topology{Partitions: snap.Active.Partitions, Shards: snap.Active.Shards}
			switch {
			case acknowledges && snap.Active.Number != acked:
				if err := pub.SwitchEpoch(a, snap.Active.Number); err == nil {
					cur, acked = a, snap.Active.Number
				}
			case !acknowledges && a != cur:
				cur = a
				pub.SetTopology(a)
			}
		}
	}()
	return f
}

func (f *follower) stop() { close(f.stopc); <-f.done }

// podsOf are the StatefulSet's pod names, highest ordinal first (the
// order the operator rolls them in).
func podsOf(replicas int32) []string {
	var out []string
	for i := replicas - 1; i >= 0; i-- {
		out = append(out, fmt.Sprintf("ingest-%d", i))
	}
	return out
}

// eventually is fleettest.Eventually for the scene's test.
func (s *scene) eventually(timeout time.Duration, cond func() error) {
	s.t.Helper()
	fleettest.Eventually(s.t, timeout, cond)
}
