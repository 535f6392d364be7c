package controllers_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// Configuration errors a retry cannot fix stall at once, naming the
// field, where they were retried as ReconcileError with Stalled=False
// "retrying" forever: a DSN that does not parse, a role PostgreSQL does
// not know, and NATS credentials the server refuses. No part of the DSN
// reaches status.
//
// checks P7
func TestPermanentConfigurationErrorsStallNamingTheField(t *testing.T) {
	good := postgres(t).NewTestDatabase(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("nosuchrole", "hunter2-secret")
	noRole := u.String()
	nc := natstest.StartCluster(t, 1)

	tests := []struct {
		name      string
		dsn       string
		natsCreds string
		sysCreds  string // "" means the right ones
		reason    string // "" means no stall
		field     string
	}{
		{"a DSN that does not parse", "postgres://shardkeeper:hunter2-secret@127.0.0.1:notaport/registry", natstest.AppUser + ":" + natstest.AppPassword, "",
			topologyv1.ReasonInvalidRegistryDSN, "spec.registry.dsnSecretRef"},
		{"a role that does not exist", noRole, natstest.AppUser + ":" + natstest.AppPassword, "",
			topologyv1.ReasonRegistryRefused, "spec.registry.dsnSecretRef"},
		{"NATS credentials the server refuses", good, natstest.AppUser + ":hunter2-wrong", "",
			topologyv1.ReasonNATSAuthorizationFailed, "spec.nats.credentialsSecretRef"},
		// Wrong system credentials do not stall the topology: rollouts go
		// on; the census fails closed and says which field to fix.
		{"system credentials the server refuses", good, natstest.AppUser + ":" + natstest.AppPassword, natstest.SysUser + ":hunter2-wrong",
			"", "spec.nats.systemCredentialsSecretRef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := newNamespace(t)
			createStatefulSet(t, ns, "ingest")
			ctx := context.Background()
			for name, data := range map[string]map[string]string{
				"registry": {"dsn": tt.dsn},
				"nats":     {"app": tt.natsCreds, "sys": nonEmptyOr(tt.sysCreds, natstest.SysUser+":"+natstest.SysPassword)},
			} {
				if err := k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: data}); err != nil {
					t.Fatal(err)
				}
			}
			o := sampleTopology(ns)
			o.Spec.NATS.URLs = nc.URLs()
			o.Spec.NATS.CredentialsSecretRef = &topologyv1.SecretKeyRef{Name: "nats", Key: "app"}
			o.Spec.NATS.SystemCredentialsSecretRef = &topologyv1.SecretKeyRef{Name: "nats", Key: "sys"}
			if err := k.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
			r := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(50)}
			reconcileOnce(t, r, o)
			got := reconcileOnce(t, r, o)

			if tt.reason == "" {
				// Not a stall: only the census needs the system account.
				if c := condition(t, got, topologyv1.ConditionStalled); c.Status == metav1.ConditionTrue {
					t.Fatalf("Stalled %s/%s: %s", c.Status, c.Reason, c.Message)
				}
				c := wantCondition(t, got, topologyv1.ConditionVersionFloorMet, metav1.ConditionFalse, topologyv1.ReasonCensusFailed)
				if !strings.Contains(c.Message, tt.field) {
					t.Fatalf("VersionFloorMet message %q does not name %s", c.Message, tt.field)
				}
				return
			}
			c := wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionTrue, tt.reason)
			wantCondition(t, got, topologyv1.ConditionReady, metav1.ConditionFalse, tt.reason)
			if got.Status.Phase != topologyv1.PhaseStalled {
				t.Fatalf("phase %s beside Stalled=True, want Stalled", got.Status.Phase)
			}
			if !strings.HasPrefix(c.Message, tt.field+": ") {
				t.Fatalf("Stalled message %q does not start with the field %s", c.Message, tt.field)
			}
			for _, secret := range []string{"hunter2", "notaport", "nosuchrole:", "127.0.0.1"} {
				for _, cond := range got.Status.Conditions {
					if strings.Contains(cond.Message, secret) {
						t.Fatalf("%s message %q shows part of the DSN or credentials (%q)", cond.Type, cond.Message, secret)
					}
				}
			}
		})
	}
}

// After a stall ends in an error a retry may fix, the phase no longer
// says Stalled: it read Stalled beside Stalled=False "retrying" after a
// SecretNotFound.
//
// checks P7
func TestPhaseLeavesStalledWhenTheStallBecomesARetry(t *testing.T) {
	ns := newNamespace(t)
	createStatefulSet(t, ns, "ingest")
	createSecret(t, ns, "nats", "sys.creds")
	o := sampleTopology(ns)
	if err := k.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	r := &controllers.ShardTopologyReconciler{Client: k, Recorder: events.NewFakeRecorder(50)}
	reconcileOnce(t, r, o)
	got := reconcileOnce(t, r, o)
	wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionTrue, topologyv1.ReasonSecretNotFound)
	if got.Status.Phase != topologyv1.PhaseStalled {
		t.Fatalf("phase %s, want Stalled", got.Status.Phase)
	}
	// The Secret appears with a DSN that reaches nothing: a retry may fix
	// that, so the topology is not stalled any more.
	dsn := "postgres://shardkeeper@127.0.0.1:1/registry?sslmode=disable&connect_timeout=1"
	if err := k.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns}, StringData: map[string]string{"dsn": dsn}}); err != nil {
		t.Fatal(err)
	}
	got = reconcileOnce(t, r, o)
	wantCondition(t, got, topologyv1.ConditionStalled, metav1.ConditionFalse, topologyv1.ReasonReconcileError)
	if got.Status.Phase == topologyv1.PhaseStalled {
		t.Fatalf("phase Stalled beside Stalled=False: %s", conditionsString(got))
	}
}

func nonEmptyOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
