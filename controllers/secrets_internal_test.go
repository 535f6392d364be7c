package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// secretStore answers Gets of Secrets (whole, or their metadata) from a
// map, counting the whole reads: the API server and the metadata cache
// as readSecret sees them.
type secretStore struct {
	secrets map[string]*corev1.Secret
	reads   int
}

func (s *secretStore) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	sec, ok := s.secrets[key.Name]
	if !ok {
		return apierrors.NewNotFound(corev1.Resource("secrets"), key.Name)
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		s.reads++
		sec.DeepCopyInto(o)
	case *metav1.PartialObjectMetadata:
		o.ObjectMeta = *sec.ObjectMeta.DeepCopy()
	}
	return nil
}

func (s *secretStore) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("not used")
}

// A Secret is read from the API server once per resourceVersion the
// metadata cache shows: a reconcile of an unchanged Secret reads nothing,
// a rotated one is read again, and a deleted one is not found.
func TestASecretIsReadAgainOnlyWhenItsResourceVersionMoved(t *testing.T) {
	ctx := context.Background()
	store := &secretStore{secrets: map[string]*corev1.Secret{
		"nats": {ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nats", ResourceVersion: "1"}, Data: map[string][]byte{"creds": []byte("old")}},
	}}
	r := &ShardTopologyReconciler{APIReader: store, SecretMetadata: store}
	topo, name := types.NamespacedName{Namespace: "ns", Name: "t"}, types.NamespacedName{Namespace: "ns", Name: "nats"}
	read := func(want string, wantReads int) {
		t.Helper()
		sec, err := r.readSecret(ctx, topo, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(sec.Data["creds"]); got != want || store.reads != wantReads {
			t.Fatalf("read %q after %d API reads, want %q after %d", got, store.reads, want, wantReads)
		}
		sec.Data["creds"] = []byte("scribbled by a caller") // must not reach the next read
	}
	read("old", 1)
	read("old", 1)
	store.secrets["nats"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nats", ResourceVersion: "2"}, Data: map[string][]byte{"creds": []byte("new")}}
	read("new", 2)
	read("new", 2)
	delete(store.secrets, "nats")
	if _, err := r.readSecret(ctx, topo, name); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted Secret: err %v, want not found", err)
	}
}
