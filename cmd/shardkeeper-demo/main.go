// Command shardkeeper-demo runs the operator's main job on embedded defaults:
// it starts a local control plane (kube-apiserver and etcd built by
// hack/testbin.sh), installs the CRD, runs the operator in-process, applies
// the sample ShardTopology, and prints its status and conditions as they
// change. It stops everything it started before it exits.
//
// Run it with `make demo`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

func main() {
	verbose := flag.Bool("v", false, "show the operator's logs")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *verbose {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(zap.New(zap.WriteTo(discard{})))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func run(ctx context.Context) error {
	say("starting a local control plane (kube-apiserver + etcd built from source; the first build takes minutes)")
	env, err := kubetest.Start()
	if err != nil {
		return err
	}
	defer func() {
		say("stopping the control plane")
		_ = env.Stop()
	}()

	mgr, err := operator.New(ctx, env.Config, operator.Options{MetricsAddr: "0", ProbeAddr: "0"})
	if err != nil {
		return err
	}
	opCtx, stopOperator := context.WithCancel(ctx)
	opDone := make(chan error, 1)
	go func() { opDone <- mgr.Start(opCtx) }()
	defer func() {
		say("stopping the operator")
		stopOperator()
		<-opDone
	}()
	say("operator running; CRD shardtopologies.topology.shardkeeper.dev installed")

	k, err := client.New(env.Config, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	return runScenario(ctx, k, filepath.Join(root, "config", "samples", "topology_v1alpha1_shardtopology.yaml"))
}

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
