package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

func TestConnectionKeyChangesWithTheSecretNotItsLogging(t *testing.T) {
	a := NATSConfig{URLs: []string{"nats://x:4222"}, Credentials: []byte("app:one")}
	b := a
	b.Credentials = []byte("app:two")
	if a.key() == b.key() {
		t.Fatalf("same key for different credentials")
	}
	if strings.Contains(a.key(), "one") {
		t.Fatalf("key %q carries the secret", a.key())
	}
}

func TestLeaseParamsMeetP5(t *testing.T) {
	d := func(s string) *topologyv1.RolloutSpec {
		ttl, _ := time.ParseDuration(s)
		r := &topologyv1.RolloutSpec{}
		r.LeaseTTL = durationPtr(ttl)
		r.RenewInterval = durationPtr(ttl / 3)
		return r
	}
	for _, ttl := range []string{"1s", "4s", "15s", "10m"} {
		p := leaseParams(d(ttl))
		if err := p.Validate(); err != nil {
			t.Errorf("lease %s: %v", ttl, err)
		}
		if p.Grace < p.RenewInterval+p.QueryBound || p.QueryBound > 2*time.Second {
			t.Errorf("lease %s: %+v", ttl, p)
		}
	}
	// A spec that slipped past the CRD's rules is caught with the field named.
	bad := &topologyv1.RolloutSpec{LeaseTTL: durationPtr(2 * time.Second), RenewInterval: durationPtr(2 * time.Second)}
	s := &scope{topo: &topologyv1.ShardTopology{Spec: topologyv1.ShardTopologySpec{Rollout: *bad}}}
	if _, err := checkLeaseParams(nil, nil, s); err != nil || s.stall == nil || !strings.Contains(s.stall.Field, "spec.rollout.") {
		t.Fatalf("stall %+v, err %v", s.stall, err)
	}
}

func durationPtr(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
