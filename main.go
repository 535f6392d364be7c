// Command shardkeeper is the operator: a controller-runtime manager running
// the ShardTopology reconciler, with leader election, health and readiness
// probes and Prometheus metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/shardkeeper/shardkeeper/internal/operator"
)

func main() {
	var o operator.Options
	var logOpts zap.Options
	fs := flag.NewFlagSet("shardkeeper", flag.ExitOnError)
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address the Prometheus metrics endpoint binds to; 0 disables it")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address the /healthz and /readyz endpoints bind to")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "0", "address net/http/pprof binds to, for profiling; 0 disables it")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "elect a leader so that only one replica reconciles at a time")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "shardkeeper.topology.shardkeeper.dev", "name of the leader election Lease")
	fs.DurationVar(&o.RegistryTimeout, "registry-timeout", 0, "bound of each registry operation of the operator (0: 10s); a registry that does not answer within it is reported in status")
	logOpts.BindFlags(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on bad flags

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOpts)))
	ctx := ctrl.SetupSignalHandler()
	if err := run(ctx, o); err != nil {
		ctrl.Log.Error(err, "Operator stopped")
		os.Exit(1)
	}
}

func run(ctx context.Context, o operator.Options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	mgr, err := operator.New(ctx, cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.Info("Starting manager")
	return mgr.Start(ctx)
}
