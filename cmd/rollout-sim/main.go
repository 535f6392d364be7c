// Command rollout-sim replays a change of a fleet's topology step by step
// under two strategies, side by side: independent (every worker places on
// its own while pods restart one at a time) and sequenced (shardkeeper's
// plans). For each step it prints how many units are pulled by nobody and
// how many by two or more; the model and what is counted are described in
// package internal/ownership/rolloutsim.
//
// --membership says which slots independent workers place over. fixed (the
// default) is the fixed slot set 0..members-1, each pod with its own N and
// V: the baseline's definition, "capped rendezvous over a fixed slot set",
// and what cmd/shardkeeper-worker --strategy independent does, so it is
// the fair one. live places over the slots each pod sees running, as
// --views says; it reshuffles at every restart, which no fixed-replica
// fleet does, and is kept to compare with earlier figures.
//
//	go run ./cmd/rollout-sim --membership fixed --partitions 4 --from-shards 8 --to-shards 16 --members 4
//	go run ./cmd/rollout-sim --sweep --cases 300 --seed 1
//
// A single replay prints the step table of the chosen membership, then
//
//	max multiply-owned: independent=X sequenced=Y; unowned unit-steps: independent=A sequenced=B
//
// and ends with the figures over the whole roll as a field report counts
// them (distinct units pulled by two or more pods at some step, and by
// nobody at a step where every pod ran) for sequenced and for independent
// under live (stale and fresh views) and fixed membership, and a last line
// naming the membership that matches the baseline's definition. A sweep
// ends with the max multiply-owned line.
//
// It exits 1 when sequenced ever has a multiply-owned unit or a step breaks
// a promise, and 2 on bad flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/ownership/rolloutsim"
)

// errSequencedBroken means sequenced broke a promise: the exit status says
// so, for CI.
var errSequencedBroken = errors.New("sequenced strategy had a multiply-owned unit or broke a promise")

func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errSequencedBroken):
		fmt.Fprintln(os.Stderr, "rollout-sim:", err)
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "rollout-sim:", err)
		os.Exit(2)
	}
}

// options are the command's flags.
type options struct {
	partitions, toPartitions int
	fromShards, toShards     int
	members                  int
	order                    string
	membership, views        string
	sweep                    bool
	cases                    int
	seed                     uint64
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("rollout-sim", flag.ContinueOnError)
	fs.IntVar(&o.partitions, "partitions", 4, "N, partitions before the change")
	fs.IntVar(&o.toPartitions, "to-partitions", 0, "N after the change (default: unchanged)")
	fs.IntVar(&o.fromShards, "from-shards", 8, "V, shards per partition before the change")
	fs.IntVar(&o.toShards, "to-shards", 16, "V after the change")
	fs.IntVar(&o.members, "members", 4, "worker pods (ordinals 0..members-1)")
	fs.StringVar(&o.order, "order", "", "restart order as ordinals, e.g. 3,1,2,0 (default: highest first)")
	fs.StringVar(&o.membership, "membership", string(rolloutsim.Fixed), "slots independent workers place over: fixed (0..members-1, the baseline's definition) or live (the members each sees running)")
	fs.StringVar(&o.views, "views", string(rolloutsim.Stale), "with --membership live, how independent workers see membership: stale (one step late) or fresh")
	fs.BoolVar(&o.sweep, "sweep", false, "replay random cases and print the sweep's summary")
	fs.IntVar(&o.cases, "cases", 300, "cases in a sweep")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of a sweep's random cases")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.toPartitions == 0 {
		o.toPartitions = o.partitions
	}
	return o, nil
}

func run(args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	sc, err := scenario(o)
	if err != nil {
		return err
	}
	if o.sweep {
		return runSweep(o, sc, out)
	}
	return runOne(sc, out)
}

func scenario(o options) (rolloutsim.Scenario, error) {
	order, err := parseOrder(o.order)
	if err != nil {
		return rolloutsim.Scenario{}, err
	}
	sc := rolloutsim.Scenario{
		From:       ownership.Topology{Partitions: o.partitions, Shards: o.fromShards},
		To:         ownership.Topology{Partitions: o.toPartitions, Shards: o.toShards},
		Members:    o.members,
		Order:      order,
		Membership: rolloutsim.Membership(o.membership),
		Views:      rolloutsim.Views(o.views),
	}
	return sc, sc.Validate()
}

func parseOrder(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--order: %w", err)
		}
		out = append(out, n)
	}
	return out, nil
}
