package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// hangingRegistry answers nothing: every call waits for its context, as a
// statement behind a partition or a held lock does.
type hangingRegistry struct {
	poolctl.Registry
	pruned []time.Time
}

func (h *hangingRegistry) Snapshot(ctx context.Context, _ string) (poolctl.Snapshot, error) {
	<-ctx.Done()
	return poolctl.Snapshot{}, ctx.Err()
}

func (h *hangingRegistry) Activate(ctx context.Context, _ string, _ int64) error {
	<-ctx.Done()
	return ctx.Err()
}

func (h *hangingRegistry) PruneHistory(_ context.Context, _ string, before time.Time) error {
	h.pruned = append(h.pruned, before)
	return nil
}

func TestBoundedRegistryTurnsASilentRegistryIntoATimeoutError(t *testing.T) {
	reg := boundRegistry(&hangingRegistry{}, 50*time.Millisecond)
	start := time.Now()
	err := reg.Activate(context.Background(), "ns/t", 2)
	var timeout *RegistryTimeoutError
	if !errors.As(err, &timeout) || timeout.Op != "Activate" || time.Since(start) > 5*time.Second {
		t.Fatalf("Activate of a silent registry: %v after %s, want a *RegistryTimeoutError within the bound", err, time.Since(start))
	}
	if msg := err.Error(); msg == "" || errorReason(err) != "RegistryUnavailable" {
		t.Fatalf("error %q has reason %s", msg, errorReason(err))
	}
	// The caller's own cancellation is not the registry's silence.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := reg.Snapshot(ctx, "ns/t"); errors.As(err, &timeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Snapshot with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestHistoryIsPrunedAtMostHourlyKeepingADay(t *testing.T) {
	inner := &hangingRegistry{}
	r := &ShardTopologyReconciler{}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := &scope{key: types.NamespacedName{Namespace: "ns", Name: "t"}, reg: boundRegistry(inner, time.Second),
		snap: &poolctl.Snapshot{Now: now.Add(3 * time.Second)}}
	s.topo = &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}}
	for _, at := range []time.Duration{0, time.Minute, 59 * time.Minute, 61 * time.Minute} {
		s.now = now.Add(at)
		if _, err := pruneHistory(context.Background(), r, s); err != nil {
			t.Fatal(err)
		}
	}
	if len(inner.pruned) != 2 {
		t.Fatalf("pruned %d times in 61 minutes, want 2 (at most once an hour)", len(inner.pruned))
	}
	if want := now.Add(3 * time.Second).Add(-24 * time.Hour); !inner.pruned[0].Equal(want) {
		t.Fatalf("pruned before %s, want %s (24h before the registry's clock)", inner.pruned[0], want)
	}
}
