package controllers

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

func applyOption(t *testing.T, o nats.Option) nats.Options {
	t.Helper()
	var opts nats.Options
	if o != nil {
		if err := o(&opts); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

func TestCredentialFormsBecomeConnectOptions(t *testing.T) {
	account, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	claims := jwt.NewUserClaims(upub)
	token, err := claims.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a .creds file gives a user JWT and seed", func(t *testing.T) {
		o, err := credentialOption(creds)
		if err != nil {
			t.Fatal(err)
		}
		opts := applyOption(t, o)
		if opts.UserJWT == nil || opts.SignatureCB == nil {
			t.Fatalf("no JWT callbacks set")
		}
		got, err := opts.UserJWT()
		if err != nil || got != token {
			t.Fatalf("JWT %q, %v", got, err)
		}
	})
	t.Run("user:password splits at the first colon", func(t *testing.T) {
		opts := applyOption(t, mustOption(t, []byte("app:pa:ss\n")))
		if opts.User != "app" || opts.Password != "pa:ss" {
			t.Fatalf("user %q password %q", opts.User, opts.Password)
		}
	})
	t.Run("anything else is a token", func(t *testing.T) {
		opts := applyOption(t, mustOption(t, []byte("s3cr3t")))
		if opts.Token != "s3cr3t" {
			t.Fatalf("token %q", opts.Token)
		}
	})
	t.Run("empty means no authentication", func(t *testing.T) {
		if o := mustOption(t, nil); o != nil {
			t.Fatalf("option for empty credentials")
		}
	})
	t.Run("a broken .creds file is refused without echoing it", func(t *testing.T) {
		bad := []byte("-----BEGIN NATS USER JWT-----\nnot-a-jwt-SECRETPART\n------END NATS USER JWT------\n")
		_, err := credentialOption(bad)
		if !errors.Is(err, ErrBadCredentials) || strings.Contains(err.Error(), "SECRETPART") {
			t.Fatalf("error %v", err)
		}
	})
}

func mustOption(t *testing.T, b []byte) nats.Option {
	t.Helper()
	o, err := credentialOption(b)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

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
