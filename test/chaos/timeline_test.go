package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// The test's own clients log nothing; the operator process logs to its
// own file.
func init() { ctrllog.SetLogger(logr.Discard()) }

// sighting is one version of the ShardTopology as the watch saw it, with
// when the test received it.
type sighting struct {
	at  time.Time
	obj *topologyv1.ShardTopology
}

// step is the topology change step status reports, "" when none.
func (g sighting) step() string {
	if r := g.obj.Status.Rollout; r != nil && r.Kind == topologyv1.RolloutKindTopology {
		return r.Step
	}
	return ""
}

// podStep is the roll step status reports for pod, "" when none.
func (g sighting) podStep(pod string) string {
	if r := g.obj.Status.Rollout; r != nil {
		for _, p := range r.Pods {
			if p.Name == pod {
				return p.Step
			}
		}
	}
	return ""
}

// condition is the status of condition typ, "" when absent.
func (g sighting) condition(typ string) (metav1.ConditionStatus, string) {
	c := meta.FindStatusCondition(g.obj.Status.Conditions, typ)
	if c == nil {
		return "", ""
	}
	return c.Status, c.Reason
}

// readyAt reports whether the sighting is Ready at its own generation with
// the active epoch at topo.
func (g sighting) readyAt(topo ownership.Topology) bool {
	st := g.obj.Status
	ready, _ := g.condition(topologyv1.ConditionReady)
	a := st.ActiveEpoch
	return st.ObservedGeneration == g.obj.Generation && ready == metav1.ConditionTrue &&
		a != nil && int(a.Partitions) == topo.Partitions && int(a.ShardsPerPartition) == topo.Shards
}

func (g sighting) String() string {
	st := g.obj.Status
	ready, reason := g.condition(topologyv1.ConditionReady)
	return fmt.Sprintf("gen %d/%d phase=%s step=%q ready=%s/%s progress=%q", st.ObservedGeneration, g.obj.Generation,
		st.Phase, g.step(), ready, reason, st.Progress)
}

// timeline watches one namespace's ShardTopology and keeps every version
// it sees, so a scenario can inject a fault the moment a step shows, and
// judge afterwards what status said when.
type timeline struct {
	t      testing.TB
	mu     sync.Mutex
	seen   []sighting
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// watchTopology starts watching ns's ShardTopology "ingest" until t ends.
func watchTopology(t testing.TB, cfg *rest.Config, ns string) *timeline {
	t.Helper()
	scheme, err := operator.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tl := &timeline{t: t, wake: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go tl.run(ctx, c, ns)
	t.Cleanup(func() { cancel(); <-tl.done })
	return tl
}

// run lists and watches until ctx ends, starting a new watch whenever the
// API server ends one.
func (tl *timeline) run(ctx context.Context, c client.WithWatch, ns string) {
	defer close(tl.done)
	for ctx.Err() == nil {
		var list topologyv1.ShardTopologyList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		for i := range list.Items {
			tl.add(&list.Items[i])
		}
		w, err := c.Watch(ctx, &topologyv1.ShardTopologyList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(*topologyv1.ShardTopology); ok && ev.Type != watch.Deleted {
				tl.add(o)
			}
		}
		w.Stop()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// add keeps o unless it is the version last seen.
func (tl *timeline) add(o *topologyv1.ShardTopology) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if n := len(tl.seen); n > 0 && tl.seen[n-1].obj.ResourceVersion == o.ResourceVersion {
		return
	}
	tl.seen = append(tl.seen, sighting{at: time.Now(), obj: o.DeepCopy()})
	close(tl.wake)
	tl.wake = make(chan struct{})
}

// latest is the last version seen, if any.
func (tl *timeline) latest() (sighting, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.seen) == 0 {
		return sighting{}, false
	}
	return tl.seen[len(tl.seen)-1], true
}

// at is the version in force at instant t: the last seen at or before it.
func (tl *timeline) at(t time.Time) (sighting, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for i := len(tl.seen) - 1; i >= 0; i-- {
		if !tl.seen[i].at.After(t) {
			return tl.seen[i], true
		}
	}
	return sighting{}, false
}

// since lists the versions seen at or after from.
func (tl *timeline) since(from time.Time) []sighting {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var out []sighting
	for _, g := range tl.seen {
		if !g.at.Before(from) {
			out = append(out, g)
		}
	}
	return out
}

// await returns the first version seen at or after from that satisfies
// ok, waiting up to timeout for it; false when none came.
func (tl *timeline) await(from time.Time, timeout time.Duration, ok func(sighting) bool) (sighting, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		tl.mu.Lock()
		wake := tl.wake
		for _, g := range tl.seen {
			if !g.at.Before(from) && ok(g) {
				tl.mu.Unlock()
				return g, true
			}
		}
		// The latest version counts even when it arrived before from:
		// it is still what status says.
		if n := len(tl.seen); n > 0 && tl.seen[n-1].at.Before(from) && ok(tl.seen[n-1]) {
			g := tl.seen[n-1]
			tl.mu.Unlock()
			return g, true
		}
		tl.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			return sighting{}, false
		}
	}
}
