// Command shardkeeper-demo runs the operator's main job on embedded
// defaults, with real parts on this machine: a local control plane
// (kube-apiserver, etcd and kube-controller-manager built by
// hack/testbin.sh), a test kubelet running three reference worker
// processes as the pods of a StatefulSet, a 3-server NATS cluster,
// PostgreSQL, and the operator. It applies the sample ShardTopology,
// publishes rows, changes V from 8 to 16 and shows the rollout's progress
// live, checks that every row arrived, then stops everything it started.
// With --ordering PerKey it publishes keyed rows through the subject
// transform, leaves a backlog in the old units (slowed sinks) and shows
// the order barrier holding moved keys until their old units drained;
// the checker then judges per-key order too. --to-partitions changes N
// instead of V (the keyed publisher then follows the active epoch and
// acknowledges it, as a change of N's barrier needs).
//
// Run it with `make demo` (`make demo DEMO_ARGS='--ordering PerKey'`,
// `make demo DEMO_ARGS='--ordering PerKey --to-partitions 6'`).
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

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// options are the demo's flags.
type options struct {
	toShards int
	// toPartitions, when set, is the N the demo changes to instead of V.
	toPartitions int
	ordering     topologyv1.Ordering
}

func main() {
	verbose := flag.Bool("v", false, "show the operator's logs")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	toShards := flag.Int("to-shards", 16, "V to change the sample to")
	toPartitions := flag.Int("to-partitions", 0, "N to change the sample to instead of V (0: change V)")
	ordering := flag.String("ordering", string(topologyv1.OrderingNone), "spec.rollout.ordering of the demo's topology: None or PerKey (PerKey also sets spec.nats.shardAssignment SubjectTransform and publishes keyed rows)")
	flag.Parse()
	opts := options{toShards: *toShards, toPartitions: *toPartitions, ordering: topologyv1.Ordering(*ordering)}
	if opts.ordering != topologyv1.OrderingNone && opts.ordering != topologyv1.OrderingPerKey {
		fmt.Fprintf(os.Stderr, "--ordering %q: must be %s or %s\n", *ordering, topologyv1.OrderingNone, topologyv1.OrderingPerKey)
		os.Exit(2)
	}
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
		err = runScenario(ctx, p, opts)
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
