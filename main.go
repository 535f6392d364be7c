// Command shardkeeper is the operator: a controller-runtime manager running
// the ShardTopology reconciler, with leader election, health and readiness
// probes and Prometheus metrics (HTTPS with authentication and
// authorization by default).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/version"
)

func main() {
	o, logOpts, showVersion, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shardkeeper:", err)
		os.Exit(2)
	}
	if showVersion {
		version.Print("shardkeeper")
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(logOpts)))
	ctx := ctrl.SetupSignalHandler()
	if err := run(ctx, o); err != nil {
		ctrl.Log.Error(err, "Operator stopped")
		os.Exit(1)
	}
}

// parseFlags reads the operator's flags, with WATCH_NAMESPACE from getenv
// as the fallback of --watch-namespace.
func parseFlags(args []string, getenv func(string) string, output io.Writer) (operator.Options, *zap.Options, bool, error) {
	var o operator.Options
	logOpts := &zap.Options{}
	var showVersion bool
	var watch namespaceList
	fs := flag.NewFlagSet("shardkeeper", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.BoolVar(&showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8443", "address the Prometheus metrics endpoint binds to; 0 disables it")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", true, "serve metrics over HTTPS, only to callers the API server authenticates and authorizes for GET /metrics; false serves plain HTTP to anyone")
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", false, "let the metrics server speak HTTP/2 (off: HTTP/2 rapid-reset attacks, CVE-2023-44487)")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address the /healthz and /readyz endpoints bind to")
	fs.BoolVar(&o.FullSecretCache, "full-secret-cache", false, "cache every Secret with its data, as the operator did before its metadata-only Secret watch; for measuring what that watch saves (hack/bench), not for deployments")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "0", "address net/http/pprof binds to, for profiling a running operator; 0 disables it")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "elect a leader so that only one replica reconciles at a time")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "shardkeeper.topology.shardkeeper.dev", "name of the leader election Lease")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", 0, "how long a non-leader waits before taking over a lease its holder stopped renewing (0: 15s)")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", 0, "how long the leader keeps retrying to renew before it steps down (0: 10s)")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", 0, "how often leader election clients retry (0: 2s)")
	fs.DurationVar(&o.CensusInterval, "census-interval", 0, "how often each topology's NATS census runs at least (0: 30s)")
	fs.DurationVar(&o.RegistryTimeout, "registry-timeout", 0, "bound of each registry operation of the operator (0: 10s); a registry that does not answer within it is reported in status")
	fs.Var(&watch, "watch-namespace", "namespace whose ShardTopologies the operator reconciles; repeat it or separate names with commas (env WATCH_NAMESPACE); unset: every namespace")
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, nil, false, err
	}
	if fs.NArg() > 0 {
		return o, nil, false, fmt.Errorf("unexpected argument %q: the operator takes flags only", fs.Arg(0))
	}
	if len(watch) == 0 {
		if err := watch.Set(getenv("WATCH_NAMESPACE")); err != nil {
			return o, nil, false, fmt.Errorf("environment variable WATCH_NAMESPACE: %w", err)
		}
	}
	o.WatchNamespaces = watch
	return o, logOpts, showVersion, nil
}

// namespaceList is the value of --watch-namespace: names from every use of
// the flag, each split at commas.
type namespaceList []string

func (l *namespaceList) String() string { return strings.Join(*l, ",") }

// Set adds the comma-separated names in v; empty items are skipped so that
// an unset WATCH_NAMESPACE means every namespace.
func (l *namespaceList) Set(v string) error {
	for _, ns := range strings.Split(v, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		*l = append(*l, ns)
	}
	return nil
}

func run(ctx context.Context, o operator.Options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	log := ctrl.Log.WithValues("version", version.Get().Version, "revision", version.Get().Revision)
	if len(o.WatchNamespaces) > 0 {
		log = log.WithValues("watchNamespaces", o.WatchNamespaces)
	} else {
		log = log.WithValues("watchNamespaces", "all")
	}
	mgr, err := operator.New(ctx, cfg, o)
	if err != nil {
		return err
	}
	log.Info("Starting manager")
	return mgr.Start(ctx)
}
