// Command shardkeeper-demo runs the operator's main job on embedded
// defaults, with real parts on this machine: a local control plane
// (kube-apiserver, etcd and kube-controller-manager built by
// hack/testbin.sh), a test kubelet running three reference worker
// processes as the pods of a StatefulSet, a 3-server NATS cluster,
// PostgreSQL, and the operator. It applies the sample ShardTopology,
// publishes rows, changes V from 8 to 16 and shows the rollout's progress
// live, checks that every row arrived, then stops everything it started.
//
// Run it with `make demo`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	verbose := flag.Bool("v", false, "show the operator's logs")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	toShards := flag.Int("to-shards", 16, "V to change the sample to")
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

	p, err := startParts(ctx)
	if err == nil {
		err = runScenario(ctx, p, *toShards)
	}
	if p != nil {
		p.stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
