// Package operator wires the controller-runtime manager: scheme, metrics,
// probes, leader election and every reconciler. main.go and the demo both
// start the operator through it, so they cannot drift apart.
//
// It owns the wiring only; what each reconciler does lives in controllers/.
package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/version"
)

// Options are the operator's settings.
type Options struct {
	// MetricsAddr is where the Prometheus endpoint binds; "0" disables it.
	MetricsAddr string
	// MetricsSecure serves /metrics over HTTPS (a self-signed certificate)
	// and lets through only requests whose bearer token the API server
	// authenticates (TokenReview) and authorizes for GET /metrics
	// (SubjectAccessReview), as kubebuilder v4 does.
	MetricsSecure bool
	// EnableHTTP2 lets the metrics server speak HTTP/2. Off by default, as
	// in kubebuilder: HTTP/2 Stream Cancellation and Rapid Reset
	// (CVE-2023-44487, CVE-2023-39325) make it a liability for an endpoint
	// that gains nothing from it.
	EnableHTTP2 bool
	// ProbeAddr is where /healthz and /readyz bind; "0" disables them.
	ProbeAddr string
	// PprofAddr is where net/http/pprof binds, for profiling a running
	// operator; empty or "0" disables it.
	PprofAddr string
	// LeaderElect makes replicas elect one leader that reconciles.
	LeaderElect bool
	// LeaderElectionNamespace holds the Lease; empty means the pod's own.
	LeaderElectionNamespace string
	// LeaderElectionID names the Lease.
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election;
	// zero means controller-runtime's defaults (15s, 10s, 2s). A replica
	// that dies without stepping down keeps the others waiting for up to
	// LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// WatchNamespaces restricts the operator to ShardTopologies, Secrets,
	// StatefulSets and Pods of these namespaces (--watch-namespace); empty
	// means every namespace. It fills Cache.DefaultNamespaces unless that
	// is set already.
	WatchNamespaces []string
	// Cache restricts what the manager watches (tests limit it to one
	// namespace); the zero value watches everything.
	Cache cache.Options
	// CensusInterval is how often each topology's census runs at least;
	// 0 means controllers.DefaultCensusInterval.
	CensusInterval time.Duration
	// RegistryTimeout bounds every registry operation of the operator; 0
	// means controllers.DefaultRegistryTimeout.
	RegistryTimeout time.Duration
	// SkipControllerNameValidation lets tests run several managers in one
	// process.
	SkipControllerNameValidation bool
	// FullSecretCache restores how the operator cached Secrets before the
	// metadata-only watch: every Secret of the watched namespaces, data
	// included, in a full informer that Secret reads go through. It exists
	// so that hack/bench can measure, in the same run, what the
	// metadata-only watch saves (--full-secret-cache); a deployment has no
	// reason to set it.
	FullSecretCache bool
}

// NewScheme returns a scheme with every type the operator reads or writes.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add client-go types: %w", err)
	}
	if err := topologyv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add %s types: %w", topologyv1.GroupVersion, err)
	}
	return s, nil
}

// New builds a manager with every reconciler and probe registered. Start it
// with mgr.Start(ctx).
func New(ctx context.Context, cfg *rest.Config, o Options) (manager.Manager, error) {
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	cacheOpts := o.Cache
	if len(o.WatchNamespaces) > 0 && cacheOpts.DefaultNamespaces == nil {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.WatchNamespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache:  cacheOpts,
		Client: client.Options{Cache: &client.CacheOptions{
			// Secret and Pod reads go to the API server: a cached read
			// would start an informer holding every Secret (with its data)
			// and every Pod of each watched namespace, or of the whole
			// cluster, for the few the topologies name. Secrets are
			// watched metadata-only (SetupWithManager); Pods are listed
			// only while a roll needs them.
			DisableFor: uncachedReads(o),
		}},
		Metrics:                 metricsOptions(o),
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		// Step down at once on SIGTERM so a new leader need not wait out
		// the lease.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 nonZero(o.LeaseDuration),
		RenewDeadline:                 nonZero(o.RenewDeadline),
		RetryPeriod:                   nonZero(o.RetryPeriod),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	conns := &controllers.Connections{}
	r := &controllers.ShardTopologyReconciler{
		Client:          mgr.GetClient(),
		APIReader:       mgr.GetAPIReader(),
		Recorder:        mgr.GetEventRecorder(controllers.ControllerName),
		Conns:           conns,
		CensusInterval:  o.CensusInterval,
		RegistryTimeout: o.RegistryTimeout,
	}
	if o.FullSecretCache {
		r.SecretReader = mgr.GetClient()
	} else {
		r.SecretMetadata = mgr.GetCache()
	}
	// A process superseded as operator leader in a registry (another
	// replica took the topology's operator token while this one was
	// paused) stops: it starts again as a follower and waits for the
	// Lease, rather than go on refusing itself every write.
	superseded := make(chan error, 1)
	r.OnSuperseded = func(err error) {
		select {
		case superseded <- err:
		default:
		}
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case err := <-superseded:
			return fmt.Errorf("another operator leader took over in the registry: %w", err)
		}
	})); err != nil {
		return nil, fmt.Errorf("add supersession watch: %w", err)
	}
	setup := controllers.SetupOptions{SkipNameValidation: o.SkipControllerNameValidation, FullSecretCache: o.FullSecretCache}
	if err := r.SetupWithManager(ctx, mgr, setup); err != nil {
		return nil, fmt.Errorf("set up %s controller: %w", controllers.ControllerName, err)
	}
	// Close the registry pools and NATS connections when the manager stops.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		conns.CloseAll()
		return nil
	})); err != nil {
		return nil, fmt.Errorf("add connection closer: %w", err)
	}
	if err := registerBuildInfo(metrics.Registry); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add readiness check: %w", err)
	}
	return mgr, nil
}

// nonZero is d as controller-runtime's optional durations take it: nil
// for zero, so its default applies.
func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// metricsOptions serves metrics the way kubebuilder v4 does: with
// MetricsSecure, HTTPS and the authentication and authorization filter;
// HTTP/2 only when asked for.
// uncachedReads are the kinds the manager's client reads from the API
// server rather than from an informer: Secrets (unless FullSecretCache)
// and Pods.
func uncachedReads(o Options) []client.Object {
	if o.FullSecretCache {
		return []client.Object{&corev1.Pod{}}
	}
	return []client.Object{&corev1.Secret{}, &corev1.Pod{}}
}

func metricsOptions(o Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.MetricsAddr, SecureServing: o.MetricsSecure}
	if o.MetricsSecure {
		m.FilterProvider = withAuthenticationAndAuthorization
	}
	if !o.EnableHTTP2 {
		m.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return m
}

// registerBuildInfo adds shardkeeper_build_info to reg once; tests start
// several managers in one process, and they share controller-runtime's
// global registry.
func registerBuildInfo(reg prometheus.Registerer) error {
	err := reg.Register(version.NewCollector())
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("register %s: %w", version.BuildInfoName, err)
	}
	return nil
}
