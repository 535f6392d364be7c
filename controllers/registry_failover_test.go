package controllers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

func TestComputeStatusSaysWhetherTheRegistryIsDurable(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		d      *poolctl.Durability
		status metav1.ConditionStatus
		reason string
	}{
		{"asynchronous standby", &poolctl.Durability{Reason: poolctl.DurableAsynchronous, Message: "async"}, metav1.ConditionFalse, poolctl.DurableAsynchronous},
		{"synchronous standby", &poolctl.Durability{Durable: true, Reason: poolctl.DurableSynchronous, Message: "sync"}, metav1.ConditionTrue, poolctl.DurableSynchronous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
			st := computeStatus(topo, observation{durability: tt.d, registry: registryWith(1, 1, 1, 1, nil)}, now)
			c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionRegistryDurable)
			if c == nil || c.Status != tt.status || c.Reason != tt.reason || c.Message != tt.d.Message {
				t.Fatalf("RegistryDurable %+v, want %s/%s", c, tt.status, tt.reason)
			}
		})
	}
	t.Run("not read keeps the last value", func(t *testing.T) {
		topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
		topo.Status.Conditions = []metav1.Condition{{Type: topologyv1.ConditionRegistryDurable, Status: metav1.ConditionTrue,
			Reason: poolctl.DurableSynchronous, LastTransitionTime: metav1.NewTime(now)}}
		st := computeStatus(topo, observation{registry: registryWith(1, 1, 1, 1, nil)}, now)
		if c := meta.FindStatusCondition(st.Conditions, topologyv1.ConditionRegistryDurable); c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("RegistryDurable %+v after a reconcile that did not read it; want the last value kept", c)
		}
	})
}

// seqOnly is a registry with the sequence calls alone.
type seqOnly struct {
	poolctl.Registry
	checked int
}

func (r *seqOnly) CheckSeq(context.Context, string) (int64, error) { r.checked++; return 7, nil }
func (r *seqOnly) Recover(ctx context.Context, _ string, _ poolctl.RecoverFloor, _ int64) (poolctl.Recovered, error) {
	<-ctx.Done()
	return poolctl.Recovered{}, ctx.Err()
}

// TestTheSequenceChecksSeeThroughTheDeadlineWrapper: every reconcile's
// registry is bounded (boundRegistry); the failover checks must still find
// the PostgreSQL registry's CheckSeq and Recover beneath
// it (they did not: the operator never recovered a registry that went
// back in time), under the wrapper's deadline, and find nothing under a
// registry without them.
func TestTheSequenceChecksSeeThroughTheDeadlineWrapper(t *testing.T) {
	inner := &seqOnly{}
	reg := boundRegistry(inner, 50*time.Millisecond)
	sr, ok := seqRegistryOf(reg)
	if !ok {
		t.Fatal("no sequence calls found beneath the deadline wrapper")
	}
	if seq, err := sr.CheckSeq(context.Background(), "t"); err != nil || seq != 7 || inner.checked != 1 {
		t.Fatalf("CheckSeq through the wrapper: %d, %v (inner called %d times)", seq, err, inner.checked)
	}
	var te *RegistryTimeoutError
	if _, err := sr.Recover(context.Background(), "t", poolctl.RecoverFloor{}, 0); !errors.As(err, &te) {
		t.Fatalf("Recover of a registry that does not answer: %v, want the wrapper's timeout", err)
	}
	if _, ok := seqRegistryOf(boundRegistry(&hangingRegistry{}, time.Second)); ok {
		t.Fatal("a registry without a sequence was taken for one")
	}
}

// behindRegistry is a registry found behind by every sequence check
// until it is recovered.
type behindRegistry struct {
	poolctl.Registry
	recovered int
}

func (r *behindRegistry) CheckSeq(_ context.Context, topology string) (int64, error) {
	if r.recovered > 0 {
		return 2000, nil
	}
	return 49, &poolctl.RegistryBehindError{Topology: topology, Seq: 49, Seen: 68, Reason: "a client has seen a later sequence"}
}

// Snapshot refuses, as PG's does from a registry behind its client (a
// worker acts on snapshots): the operator reads the parameters it waits by
// with Observe (chaos 14a: with Snapshot it never recovered).
func (r *behindRegistry) Snapshot(_ context.Context, topology string) (poolctl.Snapshot, error) {
	return poolctl.Snapshot{}, &poolctl.RegistryBehindError{Topology: topology, Seq: 49, Seen: 68, Reason: "a client has seen a later sequence"}
}

func (r *behindRegistry) Observe(context.Context, string) (poolctl.Observation, error) {
	return poolctl.Observation{Snapshot: poolctl.Snapshot{Params: poolctl.Params{RenewInterval: 600 * time.Millisecond, QueryBound: 400 * time.Millisecond}}}, nil
}

func (r *behindRegistry) Recover(context.Context, string, poolctl.RecoverFloor, int64) (poolctl.Recovered, error) {
	r.recovered++
	return poolctl.Recovered{Lost: 19, Seq: 2000}, nil
}

// TestARegistryFoundBehindIsRecoveredAtItsTimeNotAfterABackoff: workers
// stay fenced after a failover until the operator runs Recover, one renew
// interval plus the query bound after it first saw the registry behind.
// The waiting passes used to fail with a plain error, so the rate
// limiter's backoff (grown through the outage before, up to a minute)
// decided when Recover ran: chaos 14d saw a restarted worker wait 58s to
// rejoin. A waiting pass now asks for its requeue at the wait's end, and
// a registry that fails asks again within registryRetry.
func TestARegistryFoundBehindIsRecoveredAtItsTimeNotAfterABackoff(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reg := &behindRegistry{}
	r := &ShardTopologyReconciler{Recorder: events.NewFakeRecorder(10), Now: func() time.Time { return now }}
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ingest"}}
	pass := func() error {
		s := newScope(topo, now)
		s.reg = reg
		return recoverBehindRegistry(context.Background(), r, s)
	}

	err := pass()
	after, ok := requeueOf(err)
	if !ok || after != time.Second || !errors.Is(err, poolctl.ErrRegistryBehind) && !isBehind(err) {
		t.Fatalf("first sight of a behind registry: %v (requeue %v, %t), want a refusal asking again after renew interval + query bound (1s)", err, after, ok)
	}
	now = now.Add(700 * time.Millisecond)
	if after, ok := requeueOf(pass()); !ok || after != 300*time.Millisecond || reg.recovered != 0 {
		t.Fatalf("0.7s later: requeue %v (%t), recovered %d times; want the rest of the wait (300ms) and no Recover yet", after, ok, reg.recovered)
	}
	now = now.Add(300 * time.Millisecond)
	if err := pass(); err != nil || reg.recovered != 1 {
		t.Fatalf("at the wait's end: %v, recovered %d times; want one Recover and the pass to go on", err, reg.recovered)
	}
	if err := pass(); err != nil || reg.recovered != 1 {
		t.Fatalf("after recovery: %v, recovered %d times; want no second Recover", err, reg.recovered)
	}
	if after, ok := requeueOf(retryAfter(errors.New("read registry: connection refused"), registryRetry)); !ok || after > 5*time.Second {
		t.Fatalf("a failing registry asks again after %v (%t); want within seconds", after, ok)
	}
}

func isBehind(err error) bool { _, ok := poolctl.RegistryBehind(err); return ok }

// Issue 21: a token above the registry's latest is a take the registry
// lost in a failover; its holder is the newest leader and must not stop
// (the reconcile retries and Recover binds the token again). A token below
// the latest is a newer leader's take: that holder stops.
func TestALostTokenTakeIsNotTakenForANewerLeader(t *testing.T) {
	topo := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ingest"}}
	for _, tc := range []struct {
		name       string
		refusal    *poolctl.OperatorFencedError
		superseded bool
	}{
		{"a take the registry lost", &poolctl.OperatorFencedError{Topology: "ns/ingest", Presented: 2, Current: 1, Holder: "operator-0"}, false},
		{"a take the registry never had at all", &poolctl.OperatorFencedError{Topology: "ns/ingest", Presented: 1}, false},
		{"a newer leader's take", &poolctl.OperatorFencedError{Topology: "ns/ingest", Presented: 1, Current: 2, Holder: "operator-1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stopped := 0
			r := &ShardTopologyReconciler{Recorder: events.NewFakeRecorder(10), OnSuperseded: func(error) { stopped++ }}
			s := newScope(topo, time.Now())
			err := fmt.Errorf("set draining: %w", tc.refusal)
			if got := r.superseded(context.Background(), s, err); got != tc.superseded || (stopped == 1) != tc.superseded {
				t.Fatalf("superseded(%v) = %t, OnSuperseded called %d times; want %t", err, got, stopped, tc.superseded)
			}
			if !tc.superseded && !errors.Is(err, poolctl.ErrRegistryBehind) {
				t.Fatalf("%v: want it to read as the registry behind", err)
			}
		})
	}
}
