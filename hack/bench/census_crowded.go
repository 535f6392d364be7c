package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// Row d2 (issue 23): the census of one 64-unit topology (4 partitions x 16
// shards, R3) on a 3-server cluster that also holds 40,000 other consumers
// (ten other topologies of 4 x 1000 R1 unit consumers, in the same
// account, as topologies sharing a NATS cluster are), beside the same
// census on a second 3-server cluster that holds only the topology. Both
// clusters run at once and the rounds alternate between them, so both
// censuses see the same machine. The census is the operator's: consumers
// placed from their streams' listings. The census of every server's JSZ
// (the operator's before issue 23) is taken too, for the record.
// BENCH_D2_OTHERS sets the other consumers (a multiple of 4000) for a
// trial at a smaller scale; the row's goal is stated for 40,000.

const (
	crowdedRounds        = 15
	crowdedGoal          = 2.0
	crowdedOthersDefault = 40000
	crowdedPerTopology   = 4000 // 4 streams x 1000 R1 consumers
)

// crowdedSide is what one cluster's censuses measured.
type crowdedSide struct {
	times      []time.Duration
	read       natsops.CensusRead
	incomplete string
	// jsz is one census placed from every server's JSZ.
	jszTime time.Duration
	jszRead natsops.CensusRead
	// jszIncomplete says what that census missed ("" when complete).
	jszIncomplete string
}

func runCensusCrowded(ctx context.Context, e *env) ([]result, error) {
	others := crowdedOthersDefault
	if v := os.Getenv("BENCH_D2_OTHERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n%crowdedPerTopology != 0 {
			return nil, fmt.Errorf("BENCH_D2_OTHERS=%q: want a positive multiple of %d", v, crowdedPerTopology)
		}
		others = n
	}
	empty, err := e.censusCluster("d2empty")
	if err != nil {
		return nil, err
	}
	defer empty.close()
	crowded, err := e.censusCluster("d2crowded")
	if err != nil {
		return nil, err
	}
	defer crowded.close()

	own := natsops.Layout{SubjectPrefix: "own", ConsumerName: "ingest", Partitions: 4, Shards: 16,
		Replicas: censusReplicas, PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}
	for _, c := range []*censusConns{empty, crowded} {
		if err := provisionRetrying(ctx, c.app, own); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	for i := range others / crowdedPerTopology {
		l := natsops.Layout{SubjectPrefix: fmt.Sprintf("other%d", i), ConsumerName: "ingest", Partitions: 4, Shards: crowdedPerTopology / 4,
			Replicas: 1, PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}
		if err := provisionRetrying(ctx, crowded.app, l); err != nil {
			return nil, err
		}
		e.say("d2: %d of %d other consumers provisioned after %s", (i+1)*crowdedPerTopology, others, time.Since(start).Round(time.Second))
	}
	provisioned := time.Since(start)

	listing := func(c *censusConns) natsops.CensusOptions {
		return natsops.CensusOptions{JetStream: c.app, Consumers: own.Consumers()}
	}
	var sides [2]crowdedSide
	prof, err := e.startProfile("d2-census-crowded")
	if err != nil {
		return nil, err
	}
	for round := range crowdedRounds {
		// Alternate which cluster goes first, so neither always follows
		// the other's load.
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			c := []*censusConns{empty, crowded}[i]
			d, cs, err := timeCensus(ctx, c.sys, listing(c))
			if err != nil {
				prof.stop()
				return nil, err
			}
			if err := censusComplete(cs, len(own.Consumers())); err != nil && sides[i].incomplete == "" {
				sides[i].incomplete = err.Error()
			}
			sides[i].times = append(sides[i].times, d)
			sides[i].read = cs.Read
		}
	}
	prof.stop()
	for i, c := range []*censusConns{empty, crowded} {
		d, cs, err := timeCensus(ctx, c.sys, natsops.CensusOptions{Consumers: own.Consumers()})
		if err != nil {
			return nil, err
		}
		sides[i].jszTime, sides[i].jszRead = d, cs.Read
		if err := censusComplete(cs, len(own.Consumers())); err != nil {
			sides[i].jszIncomplete = err.Error()
		}
	}
	e.say("d2: census beside %d other consumers %s (median of %d), on the empty cluster %s", others,
		ms(median(sides[1].times)), crowdedRounds, ms(median(sides[0].times)))
	return []result{crowdedResult(sides, others, provisioned, prof)}, nil
}

// censusConns are a census cluster's connections.
type censusConns struct {
	app, sys *nats.Conn
	stop     func()
}

func (c *censusConns) close() {
	c.app.Close()
	c.sys.Close()
	c.stop()
}

// censusCluster starts a 3-server cluster and connects to it as the
// application user (every server) and the system user.
func (e *env) censusCluster(name string) (*censusConns, error) {
	urls, stop, err := e.natsCluster(name, 3)
	if err != nil {
		return nil, err
	}
	app, err := nats.Connect(strings.Join(urls, ","), nats.UserInfo(natstest.AppUser, natstest.AppPassword))
	if err != nil {
		stop()
		return nil, fmt.Errorf("connect to %s as the app user: %w", name, err)
	}
	sys, err := nats.Connect(urls[0], nats.UserInfo(natstest.SysUser, natstest.SysPassword))
	if err != nil {
		app.Close()
		stop()
		return nil, fmt.Errorf("connect to %s as the system user: %w", name, err)
	}
	return &censusConns{app: app, sys: sys, stop: stop}, nil
}

func crowdedResult(sides [2]crowdedSide, others int, provisioned time.Duration, prof *profile) result {
	empty, crowded := sides[0], sides[1]
	ratio := float64(median(crowded.times)) / float64(median(empty.times))
	complete := empty.incomplete == "" && crowded.incomplete == ""
	r := result{
		row:      "d2",
		what:     fmt.Sprintf("census of one 64-unit topology (R3) on 3 servers holding %d other consumers", others),
		measured: fmt.Sprintf("%s, %s read, %d consumers decoded", ms(median(crowded.times)), kb(crowded.read.Bytes), crowded.read.Consumers),
		baseline: fmt.Sprintf("same census, empty cluster: %s, %s read", ms(median(empty.times)), kb(empty.read.Bytes)),
		ratio:    fmt.Sprintf("%.2fx", ratio),
		goal:     fmt.Sprintf("<= %.0fx (at 40000 others)", crowdedGoal),
		verdict:  judge(ratio <= crowdedGoal && complete && others >= crowdedOthersDefault),
		notes: []string{
			fmt.Sprintf("%d alternating rounds; beside the others: %s; empty cluster: %s", crowdedRounds, durations(crowded.times), durations(empty.times)),
			fmt.Sprintf("what one census read: %d replies, %d bytes, %d consumer entries (empty cluster: %d replies, %d bytes, %d consumer entries)",
				crowded.read.Replies, crowded.read.Bytes, crowded.read.Consumers, empty.read.Replies, empty.read.Bytes, empty.read.Consumers),
			fmt.Sprintf("the same census placed from every server's JSZ (before issue 23), once: beside the others %s, %s, %d consumer entries; empty cluster %s, %s, %d",
				ms(crowded.jszTime), kb(crowded.jszRead.Bytes), crowded.jszRead.Consumers, ms(empty.jszTime), kb(empty.jszRead.Bytes), empty.jszRead.Consumers),
			jszNote(crowded, empty),
			fmt.Sprintf("the %d others (%d topologies of 4 x %d R1, same account) provisioned in %s", others, others/crowdedPerTopology, crowdedPerTopology/4, ms(provisioned)),
		},
	}
	if r.verdict == missed {
		if others < crowdedOthersDefault {
			r.why = append(r.why, fmt.Sprintf("BENCH_D2_OTHERS=%d: a trial below the row's %d other consumers is not judged", others, crowdedOthersDefault))
		}
		if ratio > crowdedGoal {
			r.why = append(r.why, fmt.Sprintf("the census beside the others took %.2fx the empty cluster's (median)", ratio))
		}
		for _, s := range []string{empty.incomplete, crowded.incomplete} {
			if s != "" {
				r.why = append(r.why, "incomplete census: "+s)
			}
		}
		r.profile = prof.top(20)
	}
	return r
}

func kb(n int64) string { return fmt.Sprintf("%.1f KB", float64(n)/1e3) }

// jszNote says which JSZ census missed servers or consumers (within
// natsops.DefaultCensusTimeout per server, as the operator's census had).
func jszNote(crowded, empty crowdedSide) string {
	switch {
	case crowded.jszIncomplete == "" && empty.jszIncomplete == "":
		return "both JSZ censuses were complete"
	case empty.jszIncomplete == "":
		return "the JSZ census beside the others was INCOMPLETE: " + crowded.jszIncomplete
	default:
		return fmt.Sprintf("the JSZ censuses were INCOMPLETE: beside the others %q; empty cluster %q", crowded.jszIncomplete, empty.jszIncomplete)
	}
}
