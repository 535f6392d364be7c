// Command bench runs the performance benchmarks of design.md section 10 on
// real parts (PostgreSQL from the machine's packages, nats-server, an
// envtest control plane) and prints, for every row, what it measured, the
// baseline it measured in the same run, their ratio and the goal. A row
// that misses its goal says why, with the top of a CPU profile taken while
// it ran. Nothing is hard-coded: every number printed was measured here.
//
//	go run ./hack/bench [-rows a,b,c,d,d2,e] [-rounds 15] [-profiles DIR]
//
// `make bench` runs every row after building what they need.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// benchRow is one benchmark of the table.
type benchRow struct {
	id   string
	name string
	run  func(ctx context.Context, e *env) ([]result, error)
}

var rows = []benchRow{
	{"a", "claim 4096 units at 10ms each way", runClaim},
	{"b", "rollout convergence, 16 workers x 4096 units", runRollout},
	{"c", "SDK delivery overhead", runDelivery},
	{"d", "census of 3 servers", runCensus},
	{"d2", "census of one topology on a crowded cluster", runCensusCrowded},
	{"e", "operator steady state", runOperator},
	{"e2", "operator steady state, 100 topologies on one NATS cluster", runOperatorMany},
}

func main() {
	var o options
	flag.StringVar(&o.rows, "rows", "a,b,c,d,d2,e,e2", "rows to run, comma separated")
	flag.IntVar(&o.rounds, "rounds", len(t975)+1, "row c: at most this many alternating rounds (it stops earlier once the ratio's 95% interval is within +/-3%; at most 15)")
	flag.IntVar(&o.deliveryRows, "delivery-rows", defaultDeliveryRows, "row c: rows each side drains per drain (three pairs of drains a round)")
	flag.StringVar(&o.profiles, "profiles", "", "directory for CPU profiles (default: a temporary directory, kept)")
	flag.BoolVar(&o.verbose, "v", false, "log progress in detail")
	flag.Parse()
	if o.rounds < minRounds || o.rounds > len(t975)+1 {
		fmt.Fprintf(os.Stderr, "bench: -rounds must be %d to %d, got %d\n", minRounds, len(t975)+1, o.rounds)
		os.Exit(2)
	}
	// envtest logs through controller-runtime; without a logger it prints
	// a stack trace instead.
	log.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	rows   string
	rounds int
	// deliveryRows is row c's rows per drain.
	deliveryRows int
	profiles     string
	verbose      bool
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	e, err := newEnv(o)
	if err != nil {
		return err
	}
	defer e.close()
	e.say("machine: %s", machine())
	var all []result
	failed := 0
	for _, r := range rows {
		if !slices.Contains(strings.Split(o.rows, ","), r.id) {
			continue
		}
		e.say("row %s: %s", r.id, r.name)
		rowStart := time.Now()
		res, err := r.run(ctx, e)
		e.endRow()
		if err != nil {
			failed++
			res = append(res, result{row: r.id, what: r.name, measured: "not measured", why: []string{err.Error()}})
		}
		e.say("row %s done in %s", r.id, time.Since(rowStart).Round(time.Second))
		all = append(all, res...)
		if ctx.Err() != nil {
			break
		}
	}
	printTable(os.Stdout, all)
	printDetails(os.Stdout, all)
	fmt.Printf("\nbench took %s on %s\n", time.Since(start).Round(time.Second), machine())
	if failed > 0 {
		return fmt.Errorf("%d rows could not be measured", failed)
	}
	return nil
}
