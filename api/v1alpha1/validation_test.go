package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// k is a client of a real kube-apiserver with the CRD installed: the rules
// under test are the API server's, not a copy of them.
var k client.Client

func TestMain(m *testing.M) {
	env, err := kubetest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	if err := topologyv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	k, err = client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		panic(err)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

var seq atomic.Int64

// minimal is the smallest object the API accepts: everything else defaults.
func minimal() *topologyv1.ShardTopology {
	return &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("topo-%d", seq.Add(1)), Namespace: "default"},
		Spec: topologyv1.ShardTopologySpec{
			Partitions:         4,
			ShardsPerPartition: 8,
			NATS:               topologyv1.NATSSpec{URLs: []string{"nats://nats.ingest.svc:4222"}},
			Registry:           topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload:           topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
		},
	}
}

func dur(s string) *metav1.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return &metav1.Duration{Duration: d}
}

func TestCreateValidation(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*topologyv1.ShardTopology)
		wantErr string // empty: must be accepted
	}{
		{"minimal spec is accepted", func(*topologyv1.ShardTopology) {}, ""},
		{"partitions below 1 is refused", func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 0 },
			"spec.partitions: Invalid value: 0: spec.partitions in body should be greater than or equal to 1"},
		{"partitions above 1024 is refused", func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 1025 },
			"spec.partitions in body should be less than or equal to 1024"},
		{"shards below 1 is refused", func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 0 },
			"spec.shardsPerPartition in body should be greater than or equal to 1"},
		{"shards above 1024 is refused", func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 2048 },
			"spec.shardsPerPartition in body should be less than or equal to 1024"},
		{"exactly 65536 units is accepted", func(o *topologyv1.ShardTopology) { o.Spec.Partitions, o.Spec.ShardsPerPartition = 256, 256 }, ""},
		{"more than 65536 units is refused", func(o *topologyv1.ShardTopology) { o.Spec.Partitions, o.Spec.ShardsPerPartition = 257, 256 },
			"spec.shardsPerPartition: Invalid value: partitions x shardsPerPartition must be at most 65536 units"},
		{"version floor with v prefix and pre-release is accepted", func(o *topologyv1.ShardTopology) { o.Spec.NATS.VersionFloor = "v2.14.1-rc.1" }, ""},
		{"version floor that is not semver is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.VersionFloor = "2.14" },
			"spec.nats.versionFloor: Invalid value: \"2.14\": must be a semantic version such as 2.14.0"},
		{"version floor below 2.11.0 is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.VersionFloor = "2.10.22" },
			"spec.nats.versionFloor: Invalid value: \"2.10.22\": must be at least 2.11.0"},
		{"zero pinned TTL is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.PinnedTTL = dur("0s") },
			"spec.nats.pinnedTTL: Invalid value: \"0s\": must be a duration above 0s and at most 24h"},
		{"negative ack wait is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.AckWait = dur("-5s") },
			"spec.nats.ackWait: Invalid value: \"-5s\": must be a duration above 0s and at most 24h"},
		{"max ack pending below 100 is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.MaxAckPending = 64 },
			"spec.nats.maxAckPending in body should be greater than or equal to 100"},
		{"max ack pending above a million is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.MaxAckPending = 2_000_000 },
			"spec.nats.maxAckPending in body should be less than or equal to 1000000"},
		{"drain timeout over an hour is refused", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.DrainTimeout = dur("2h") },
			"spec.rollout.drainTimeout: Invalid value: \"2h0m0s\": must be a duration above 0s and at most 1h"},
		{"lease TTL under a second is refused", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.LeaseTTL = dur("500ms") },
			"spec.rollout.leaseTTL: Invalid value: \"500ms\": must be a duration from 1s to 10m"},
		{"renew interval over half the lease is refused", func(o *topologyv1.ShardTopology) {
			o.Spec.Rollout.LeaseTTL, o.Spec.Rollout.RenewInterval = dur("10s"), dur("6s")
		}, "spec.rollout.renewInterval: Invalid value: renewInterval must be at most half of leaseTTL"},
		{"renew interval of exactly half the lease is accepted", func(o *topologyv1.ShardTopology) {
			o.Spec.Rollout.LeaseTTL, o.Spec.Rollout.RenewInterval = dur("10s"), dur("5s")
		}, ""},
		{"zero pods at once is refused", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.MaxPodsAtOnce = -1 },
			"spec.rollout.maxPodsAtOnce in body should be greater than or equal to 1"},
		{"no NATS URL is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.URLs = nil },
			"spec.nats.urls: Required value"},
		{"an http URL is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.URLs = []string{"http://nats:4222"} },
			"spec.nats.urls: Invalid value: every URL must be nats://, tls://, ws:// or wss:// with a host"},
		{"tls and websocket URLs are accepted", func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.URLs = []string{"tls://a.example:4222", "wss://b.example:443"}
		}, ""},
		{"secret ref without key is refused", func(o *topologyv1.ShardTopology) { o.Spec.Registry.DSNSecretRef.Key = "" },
			"spec.registry.dsnSecretRef.key"},
		{"credentials ref without name is refused", func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.CredentialsSecretRef = &topologyv1.SecretKeyRef{Key: "creds"}
		}, "spec.nats.credentialsSecretRef.name"},
		{"complete secret refs are accepted", func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.CredentialsSecretRef = &topologyv1.SecretKeyRef{Name: "nats", Key: "app.creds"}
			o.Spec.NATS.SystemCredentialsSecretRef = &topologyv1.SecretKeyRef{Name: "nats", Key: "sys.creds"}
			o.Spec.NATS.TLSSecretRef = &topologyv1.SecretRef{Name: "nats-tls"}
		}, ""},
		{"subject prefix with a dot is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.SubjectPrefix = "a.b" },
			"spec.nats.subjectPrefix: Invalid value: \"a.b\": spec.nats.subjectPrefix in body should match"},
		{"consumer name with a space is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.ConsumerName = "my consumer" },
			"spec.nats.consumerName"},
		{"replicas above 5 is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.Replicas = 7 },
			"spec.nats.replicas in body should be less than or equal to 5"},
		{"unknown shard assignment is refused", func(o *topologyv1.ShardTopology) { o.Spec.NATS.ShardAssignment = "Random" },
			"spec.nats.shardAssignment: Unsupported value: \"Random\""},
		{"bad StatefulSet name is refused", func(o *topologyv1.ShardTopology) { o.Spec.Workload.StatefulSetName = "Ingest_Workers" },
			"spec.workload.statefulSetName"},
		{"PerKey ordering under SubjectTransform is accepted", func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.ShardAssignment = topologyv1.ShardAssignmentSubjectTransform
			o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
		}, ""},
		{"PerKey ordering under Publisher assignment is refused, naming both fields", func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.ShardAssignment = topologyv1.ShardAssignmentPublisher
			o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
		}, "spec.rollout.ordering: Invalid value: spec.rollout.ordering PerKey needs spec.nats.shardAssignment SubjectTransform"},
		// The default assignment is Publisher: PerKey alone is refused too.
		{"PerKey ordering with the default assignment is refused", func(o *topologyv1.ShardTopology) {
			o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
		}, "spec.rollout.ordering PerKey needs spec.nats.shardAssignment SubjectTransform"},
		{"unknown ordering is refused", func(o *topologyv1.ShardTopology) { o.Spec.Rollout.Ordering = "Total" },
			"spec.rollout.ordering: Unsupported value: \"Total\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := minimal()
			tt.mutate(o)
			err := k.Create(context.Background(), o)
			checkAdmission(t, err, tt.wantErr)
		})
	}
}

func TestUpdateTransitionRules(t *testing.T) {
	withPrefix := func(o *topologyv1.ShardTopology) { o.Spec.NATS.SubjectPrefix = "shardkeeper" }
	perKey := func(o *topologyv1.ShardTopology) {
		o.Spec.NATS.ShardAssignment = topologyv1.ShardAssignmentSubjectTransform
		o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
	}
	tests := []struct {
		name    string
		create  func(*topologyv1.ShardTopology) // nil: minimal
		mutate  func(*topologyv1.ShardTopology)
		wantErr string
	}{
		{"changing N and V is accepted", nil, func(o *topologyv1.ShardTopology) { o.Spec.Partitions, o.Spec.ShardsPerPartition = 6, 16 }, ""},
		{"setting a subject prefix after creation is refused", nil, func(o *topologyv1.ShardTopology) { o.Spec.NATS.SubjectPrefix = "other" },
			"spec.nats.subjectPrefix: Invalid value: subjectPrefix is immutable"},
		{"changing a stored subject prefix is refused", withPrefix, func(o *topologyv1.ShardTopology) { o.Spec.NATS.SubjectPrefix = "other" },
			"spec.nats.subjectPrefix: Invalid value: subjectPrefix is immutable"},
		// An object created under the old shared default keeps it: a
		// manifest applied without the field must not switch it to the
		// per-topology default (that would orphan its streams).
		{"removing a stored subject prefix is refused", withPrefix, func(o *topologyv1.ShardTopology) { o.Spec.NATS.SubjectPrefix = "" },
			"spec.nats.subjectPrefix: Invalid value: subjectPrefix is immutable"},
		{"keeping a stored subject prefix is accepted", withPrefix, func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 5 }, ""},
		{"changing consumer name is refused", nil, func(o *topologyv1.ShardTopology) { o.Spec.NATS.ConsumerName = "other" },
			"spec.nats.consumerName: Invalid value: consumerName is immutable"},
		{"changing shard assignment is refused", nil, func(o *topologyv1.ShardTopology) {
			o.Spec.NATS.ShardAssignment = topologyv1.ShardAssignmentSubjectTransform
		}, "spec.nats.shardAssignment: Invalid value: shardAssignment is immutable"},
		{"raising the version floor is accepted", nil, func(o *topologyv1.ShardTopology) { o.Spec.NATS.VersionFloor = "2.15.0" }, ""},
		{"changing V with PerKey ordering is accepted", perKey, func(o *topologyv1.ShardTopology) { o.Spec.ShardsPerPartition = 12 }, ""},
		{"changing N with PerKey ordering is accepted", perKey, func(o *topologyv1.ShardTopology) { o.Spec.Partitions = 6 }, ""},
		{"changing N and V at once with PerKey ordering is refused", perKey, func(o *topologyv1.ShardTopology) {
			o.Spec.Partitions, o.Spec.ShardsPerPartition = 6, 12
		}, "spec.partitions: Invalid value: with spec.rollout.ordering PerKey, spec.partitions and spec.shardsPerPartition cannot change in one update"},
		{"changing N and V at once while setting ordering None is accepted", perKey, func(o *topologyv1.ShardTopology) {
			o.Spec.Partitions, o.Spec.ShardsPerPartition, o.Spec.Rollout.Ordering = 6, 12, topologyv1.OrderingNone
		}, ""},
		{"turning PerKey on under Publisher assignment is refused", nil, func(o *topologyv1.ShardTopology) {
			o.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
		}, "spec.rollout.ordering PerKey needs spec.nats.shardAssignment SubjectTransform"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			o := minimal()
			if tt.create != nil {
				tt.create(o)
			}
			if err := k.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
			tt.mutate(o)
			checkAdmission(t, k.Update(ctx, o), tt.wantErr)
		})
	}
}

func TestDefaultsAreApplied(t *testing.T) {
	ctx := context.Background()
	o := minimal()
	if err := k.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	got := &topologyv1.ShardTopology{}
	if err := k.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
		t.Fatal(err)
	}
	n, r := got.Spec.NATS, got.Spec.Rollout
	checks := []struct {
		field     string
		got, want any
	}{
		// No shared default: the operator derives one per topology.
		{"nats.subjectPrefix", n.SubjectPrefix, ""},
		{"nats.consumerName", n.ConsumerName, topologyv1.DefaultConsumerName},
		{"nats.replicas", n.Replicas, int32(topologyv1.DefaultReplicas)},
		{"nats.versionFloor", n.VersionFloor, topologyv1.DefaultVersionFloor},
		{"nats.shardAssignment", n.ShardAssignment, topologyv1.ShardAssignmentPublisher},
		{"nats.pinnedTTL", n.PinnedTTL.Duration, topologyv1.DefaultPinnedTTL},
		{"nats.ackWait", n.AckWait.Duration, topologyv1.DefaultAckWait},
		{"nats.maxAckPending", n.MaxAckPending, int32(topologyv1.DefaultMaxAckPending)},
		// A layout built without the spec (tests, the bench) gets the same.
		{"nats.maxAckPending (natsops.DefaultMaxAckPending)", natsops.DefaultMaxAckPending, topologyv1.DefaultMaxAckPending},
		{"rollout.paused", r.Paused, false},
		{"rollout.drainTimeout", r.DrainTimeout.Duration, topologyv1.DefaultDrainTimeout},
		{"rollout.leaseTTL", r.LeaseTTL.Duration, topologyv1.DefaultLeaseTTL},
		{"rollout.renewInterval", r.RenewInterval.Duration, topologyv1.DefaultRenewInterval},
		{"rollout.maxPodsAtOnce", r.MaxPodsAtOnce, int32(topologyv1.DefaultMaxPodsAtOnce)},
		{"rollout.ordering", r.Ordering, topologyv1.OrderingNone},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("spec.%s defaulted to %v, want %v", c.field, c.got, c.want)
		}
	}
}

// checkAdmission fails unless err is nil (wantErr empty) or an Invalid
// error whose message contains wantErr.
func checkAdmission(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("refused, want accepted: %v", err)
	case wantErr == "":
		return
	case err == nil:
		t.Fatalf("accepted, want refused with %q", wantErr)
	case !apierrors.IsInvalid(err):
		t.Fatalf("got %v, want an Invalid error", err)
	case !strings.Contains(err.Error(), wantErr):
		t.Fatalf("error %q\ndoes not contain %q", err.Error(), wantErr)
	}
}

// TestMalformedDurationIsRefused sends raw JSON, since a typed client cannot
// express a duration that does not parse.
func TestMalformedDurationIsRefused(t *testing.T) {
	o := minimal()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: raw}
	u.SetGroupVersionKind(topologyv1.GroupVersion.WithKind("ShardTopology"))
	if err := unstructured.SetNestedField(u.Object, "soon", "spec", "rollout", "leaseTTL"); err != nil {
		t.Fatal(err)
	}
	checkAdmission(t, k.Create(context.Background(), u), `spec.rollout.leaseTTL: Invalid value: "soon": must be a duration such as 30s, 1m30s or 500ms`)
}

// TestSampleIsAccepted keeps config/samples true: the sample users copy
// must pass the API server's validation.
func TestSampleIsAccepted(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "samples", "topology_v1alpha1_shardtopology.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	o := &topologyv1.ShardTopology{}
	if err := yaml.UnmarshalStrict(b, o); err != nil {
		t.Fatalf("sample does not decode strictly: %v", err)
	}
	o.Namespace = "default"
	o.Name = fmt.Sprintf("sample-%d", seq.Add(1))
	checkAdmission(t, k.Create(context.Background(), o), "")
}

// Topologies that set no prefix get one each: namespace and name when they
// fit, a shortened form with a hash otherwise; never the same for two, and
// always one the API's own pattern accepts.
func TestDefaultSubjectPrefixIsPerTopology(t *testing.T) {
	long := strings.Repeat("n", 40)
	tests := []struct {
		name            string
		namespace, topo string
		want            string // empty: only checked against the pattern
	}{
		{"namespace and name when they fit", "team-a", "ingest", "team-a_ingest"},
		{"another name in the same namespace", "team-a", "orders", "team-a_orders"},
		{"a name with dots is shortened with a hash", "team-a", "ingest.v2", ""},
		{"a long name is shortened with a hash", "team-a", long, ""},
		{"a long namespace is shortened with a hash", long, "ingest", ""},
	}
	pattern := regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := topologyv1.DefaultSubjectPrefixFor(tt.namespace, tt.topo)
			if tt.want != "" && got != tt.want {
				t.Fatalf("prefix %q, want %q", got, tt.want)
			}
			if !pattern.MatchString(got) {
				t.Fatalf("prefix %q does not match the API's pattern %s", got, pattern)
			}
			if other, dup := seen[got]; dup {
				t.Fatalf("prefix %q is also %s's", got, other)
			}
			seen[got] = tt.namespace + "/" + tt.topo
		})
	}
	o := &topologyv1.ShardTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "ingest"}}
	if got := o.SubjectPrefix(); got != "team-a_ingest" {
		t.Fatalf("SubjectPrefix() with none set = %q", got)
	}
	o.Spec.NATS.SubjectPrefix = "shardkeeper"
	if got := o.SubjectPrefix(); got != "shardkeeper" {
		t.Fatalf("SubjectPrefix() with one set = %q", got)
	}
}
