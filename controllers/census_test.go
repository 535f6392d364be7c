package controllers_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/operator"
)

// A census below the floor turns RESET off for the workers (the verdict in
// the registry says why) and says so in VersionFloorMet, without stalling
// the topology; at the floor RESET is allowed again; without system
// credentials the census fails closed.
// checks P4, checks P7
func TestCensusVerdictIsPublishedAndFailsClosed(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2, servers: 3, replicas: 3, floor: "2.99.0"})
	f.withStatefulSet(0, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)

	st := f.waitStatus(60*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionVersionFloorMet)
		if c == nil || c.Status != metav1.ConditionFalse || o.Status.Phase != topologyv1.PhaseReady {
			return errors.New("want VersionFloorMet=False on a Ready topology")
		}
		return nil
	})
	c := wantConditionOf(t, st, topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonBelowFloor)
	wantConditionOf(t, st, topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonSpecValid)
	if !strings.Contains(c.Message, "-n1 (") || !strings.Contains(c.Message, "ack_wait") {
		t.Fatalf("VersionFloorMet message %q does not name the servers and the consequence", c.Message)
	}
	if cs := st.Status.Census; cs == nil || len(cs.BelowFloor) != 3 {
		t.Fatalf("census %+v, want 3 servers below the floor", cs)
	}
	r := f.snapshot().Reset
	if !r.Published || r.Allowed || !strings.Contains(r.Reason, "below floor 2.99.0") {
		t.Fatalf("RESET permission %+v, want refused below the floor", r)
	}
	waitEvent(t, f.ns, "CensusBelowFloor", "2.99.0")
	labels := map[string]string{"namespace": f.ns, "name": "ingest", "reason": "below_floor"}
	if v, ok := metricValue(t, "shardkeeper_takeover_reset_blocked", labels); !ok || v != 1 {
		t.Fatalf("shardkeeper_takeover_reset_blocked{below_floor} = %v", v)
	}
	if v, ok := metricValue(t, "shardkeeper_reset_permission_denials_total", labels); !ok || v < 1 {
		t.Fatalf("shardkeeper_reset_permission_denials_total{below_floor} = %v", v)
	}

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.NATS.VersionFloor = "2.14.0" })
	f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := findCondition(o, topologyv1.ConditionVersionFloorMet); c == nil || c.Status != metav1.ConditionTrue {
			return errors.New("want VersionFloorMet=True")
		}
		return nil
	})
	// The verdict carries what a worker's GuardedReset checks a
	// consumer's current hosts against: the floor and every server's
	// version.
	eventually(t, 10*time.Second, func() error {
		r := f.snapshot().Reset
		if !r.Allowed || r.CensusAge > time.Minute || r.Floor != "2.14.0" || len(r.Servers) != 3 {
			return fmt.Errorf("RESET permission %+v, want allowed by a fresh census, floor 2.14.0, 3 servers", r)
		}
		for name, v := range r.Servers {
			if !strings.HasPrefix(name, f.nats.Name) || v != server.VERSION {
				return fmt.Errorf("server %s at %q in the verdict, want a cluster member at %s", name, v, server.VERSION)
			}
		}
		return nil
	})

	f.update(func(o *topologyv1.ShardTopology) { o.Spec.NATS.SystemCredentialsSecretRef = nil })
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		if c := findCondition(o, topologyv1.ConditionVersionFloorMet); c == nil || c.Reason != topologyv1.ReasonNoSystemCredentials {
			return errors.New("want VersionFloorMet NoSystemCredentials")
		}
		return nil
	})
	wantConditionOf(t, st, topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonNoSystemCredentials)
	eventually(t, 10*time.Second, func() error {
		if r := f.snapshot().Reset; r.Allowed || r.Reason != "no system credentials" {
			return fmt.Errorf("RESET permission %+v, want refused for lack of system credentials", r)
		}
		return nil
	})
}

// Every NATS server down: the workers still renew their leases and report
// (a worker that cannot pull keeps its claims), so reports alone would
// keep Ready=True. The operator's own connection is the evidence: Ready
// goes False with reason NATSUnavailable, the progress line says NATS is
// unreachable, and the census says the servers are unreachable instead of
// blaming the system credentials. Ready comes back with the servers.
// checks P7
func TestEveryNATSServerDownIsNotReady(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 1, shards: 2})
	f.withStatefulSet(0, "w")
	startOperatorWith(t, f.ns, operator.Options{CensusInterval: time.Second})
	f.create()
	startSimWorker(t, f.reg, f.key(), "a", false)
	f.waitReady(60 * time.Second)

	f.nats.Shutdown()
	// The fault took effect: the servers are gone.
	eventually(t, 10*time.Second, func() error {
		if f.nc.IsConnected() {
			return errors.New("the test's own NATS connection is still connected after shutdown")
		}
		return nil
	})
	down := time.Now()
	st := f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionReady)
		if c == nil || c.Reason != topologyv1.ReasonNATSUnavailable {
			return errors.New("want Ready=False/NATSUnavailable")
		}
		return nil
	})
	t.Logf("Ready=False %s after the servers stopped", time.Since(down).Round(time.Millisecond))
	c := wantConditionOf(t, st, topologyv1.ConditionReady, metav1.ConditionFalse, topologyv1.ReasonNATSUnavailable)
	if st.Status.Phase == topologyv1.PhaseReady || !strings.Contains(st.Status.Progress, "NATS unreachable") || !strings.Contains(c.Message, "NATS") {
		t.Fatalf("phase %s, progress %q, Ready message %q: want NATS named as unreachable", st.Status.Phase, st.Status.Progress, c.Message)
	}
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		c := findCondition(o, topologyv1.ConditionVersionFloorMet)
		if c == nil || c.Reason != topologyv1.ReasonCensusFailed {
			return errors.New("want VersionFloorMet=False/CensusFailed")
		}
		return nil
	})
	v := wantConditionOf(t, st, topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonCensusFailed)
	if !strings.Contains(v.Message, "NATS servers unreachable") || strings.Contains(v.Message, "must name a system-account user") {
		t.Fatalf("census message %q: want the servers named unreachable, not the credentials blamed", v.Message)
	}

	f.nats.Restart(0)
	f.waitReady(60 * time.Second)
}
