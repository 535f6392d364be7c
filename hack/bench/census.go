package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// Row d: a census of a 3-server cluster holding 64, 1024 and 4096 unit
// consumers. One layout grows (16 partitions x 4, 64, 256 shards), so at
// each size the account holds exactly the consumers the census inspects,
// as a real fleet's would. (16 x 256 rather than 4 x 1024 because the
// layout left max_consumers unlimited when this row was built, which
// nats-server 2.15 counts as unset and then refuses a stream's 1001st
// consumer; streams now set it.) The census is the operator's: the
// consumers placed from their streams' listings through the application
// connection. The baseline, taken alternately with the censuses of each
// size, is a census that inspects no consumer: the system pings every
// census needs. For the record, each size also probes the JSZ request the
// census made before issue 23.

const (
	censusRounds   = 7
	censusReplicas = 3
	censusGoal     = 200 * time.Millisecond // at 64 consumers
)

var censusShards = []int{4, 64, 256}

// censusSize is what one size measured.
type censusSize struct {
	consumers int
	times     []time.Duration
	baseline  []time.Duration
	provision time.Duration
	// incomplete says why a census with the operator's options missed
	// consumers ("" when every census was complete).
	incomplete string
	// read is what the last census of this size read.
	read natsops.CensusRead
	// jsz is the probe of the JSZ request the census made before issue 23;
	// jszErr says why it failed.
	jsz    jszProbe
	jszErr string
	// prof is this process's CPU while the censuses of this size ran.
	prof *profile
}

func runCensus(ctx context.Context, e *env) ([]result, error) {
	urls, stop, err := e.natsCluster("census", 3)
	if err != nil {
		return nil, err
	}
	defer stop()
	app, err := nats.Connect(strings.Join(urls, ","), nats.UserInfo(natstest.AppUser, natstest.AppPassword))
	if err != nil {
		return nil, fmt.Errorf("connect as the app user: %w", err)
	}
	defer app.Close()
	sys, err := nats.Connect(urls[0], nats.UserInfo(natstest.SysUser, natstest.SysPassword))
	if err != nil {
		return nil, fmt.Errorf("connect as the system user: %w", err)
	}
	defer sys.Close()

	var sizes []censusSize
	for _, v := range censusShards {
		l := censusLayout(v)
		s, err := measureCensusSize(ctx, e, app, sys, l)
		if err != nil {
			return nil, err
		}
		sizes = append(sizes, s)
		e.say("d: %d consumers: census %s (median of %d), no-consumer census %s; one census read %s in %d replies",
			s.consumers, ms(median(s.times)), censusRounds, ms(median(s.baseline)), kb(s.read.Bytes), s.read.Replies)
	}
	return []result{censusResult(sizes)}, nil
}

func censusLayout(shards int) natsops.Layout {
	return natsops.Layout{SubjectPrefix: "census", ConsumerName: "ingest", Partitions: 16, Shards: shards,
		Replicas: censusReplicas, PinnedTTL: 2 * time.Minute, AckWait: 30 * time.Second}
}

// measureCensusSize provisions l (adding to what exists) and takes
// censusRounds censuses of its consumers, each after one of the baseline.
func measureCensusSize(ctx context.Context, e *env, app, sys *nats.Conn, l natsops.Layout) (censusSize, error) {
	s := censusSize{consumers: l.Partitions * l.Shards}
	start := time.Now()
	if err := provisionRetrying(ctx, app, l); err != nil {
		return s, err
	}
	s.provision = time.Since(start)
	e.debug("d: provisioned %d R%d consumers in %s", s.consumers, l.Replicas, s.provision)
	opts := natsops.CensusOptions{JetStream: app, Consumers: l.Consumers()}
	base := natsops.CensusOptions{}
	prof, err := e.startProfile(fmt.Sprintf("d-census-%d", s.consumers))
	if err != nil {
		return s, err
	}
	defer prof.stop()
	s.prof = prof
	for range censusRounds {
		d, _, err := timeCensus(ctx, sys, base)
		if err != nil {
			return s, err
		}
		s.baseline = append(s.baseline, d)
		d, c, err := timeCensus(ctx, sys, opts)
		if err != nil {
			return s, err
		}
		if err := censusComplete(c, s.consumers); err != nil && s.incomplete == "" {
			s.incomplete = err.Error()
		}
		s.read = c.Read
		s.times = append(s.times, d)
	}
	// The probe is for the record: a probe that times out on a loaded
	// machine is reported, not fatal to the row.
	jsz, err := probeJSZ(ctx, sys, 3, fmt.Sprintf(`{"account":%q,"streams":true,"consumer":true}`, natstest.AppAccount))
	s.jsz = jsz
	if err != nil {
		s.jszErr = err.Error()
	}
	return s, ctx.Err()
}

// jszProbe is how long the servers took to answer a census's JSZ
// request (body), with no deadline but a minute, and how big the answers
// were.
type jszProbe struct {
	slowest time.Duration
	bytes   int
	replies int
}

func probeJSZ(ctx context.Context, sys *nats.Conn, servers int, body string) (jszProbe, error) {
	var p jszProbe
	inbox := sys.NewRespInbox()
	sub, err := sys.SubscribeSync(inbox)
	if err != nil {
		return p, err
	}
	defer sub.Unsubscribe()
	start := time.Now()
	if err := sys.PublishRequest("$SYS.REQ.SERVER.PING.JSZ", inbox, []byte(body)); err != nil {
		return p, err
	}
	for p.replies < servers {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			return p, fmt.Errorf("JSZ probe: %d of %d replies: %w", p.replies, servers, err)
		}
		p.replies++
		p.bytes += len(m.Data)
		p.slowest = time.Since(start)
	}
	return p, nil
}

func timeCensus(ctx context.Context, sys *nats.Conn, opts natsops.CensusOptions) (time.Duration, *natsops.Census, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	c, err := natsops.TakeCensus(cctx, sys, opts)
	if err != nil {
		return 0, nil, fmt.Errorf("census of %d consumers: %w", len(opts.Consumers), err)
	}
	return time.Since(start), c, nil
}

// censusComplete checks that the census saw every server and every
// consumer with its replicas: a census that timed out on a server would
// be fast and wrong.
func censusComplete(c *natsops.Census, consumers int) error {
	if len(c.Servers) != 3 || !c.FloorMet() {
		return fmt.Errorf("census saw %d servers, floor met %v: %s", len(c.Servers), c.FloorMet(), strings.Join(c.Findings, "; "))
	}
	found := 0
	for _, p := range c.Consumers {
		if p.Found && len(p.Hosts()) == censusReplicas {
			found++
		}
	}
	if found != consumers {
		return fmt.Errorf("census placed %d of %d consumers on %d servers each", found, consumers, censusReplicas)
	}
	return nil
}

// provisionRetrying provisions l, retrying while a young cluster cannot
// place replicated assets yet, and up to 5 times when JetStream requests
// time out (a loaded 2-core machine: 4096 R3 consumers missed the 10s
// bound of a request in three runs of one morning). Provision is
// idempotent, so a retry creates only what is still missing.
func provisionRetrying(ctx context.Context, nc *nats.Conn, l natsops.Layout) error {
	deadline := time.Now().Add(time.Minute)
	timeouts := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		_, err := natsops.Provision(pctx, nc, l)
		cancel()
		if err == nil {
			return nil
		}
		young := strings.Contains(err.Error(), "insufficient resources") || strings.Contains(err.Error(), "no suitable peers")
		timedOut := strings.Contains(err.Error(), "context deadline exceeded") || strings.Contains(err.Error(), "timeout")
		switch {
		case young && time.Now().Before(deadline):
		case timedOut && timeouts < 5 && ctx.Err() == nil:
			timeouts++
		default:
			return fmt.Errorf("provision %d x %d: %w", l.Partitions, l.Shards, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func censusResult(sizes []censusSize) result {
	small, large := sizes[0], sizes[len(sizes)-1]
	growth := float64(median(large.times)) / float64(median(small.times))
	var measured, notes []string
	for _, s := range sizes {
		measured = append(measured, fmt.Sprintf("%d: %s", s.consumers, ms(median(s.times))))
		notes = append(notes, fmt.Sprintf("%4d R%d consumers: census %s (median %s); no-consumer census %s (median %s); provisioned in %s",
			s.consumers, censusReplicas, durations(s.times), ms(median(s.times)), durations(s.baseline), ms(median(s.baseline)),
			ms(s.provision)),
			fmt.Sprintf("     one census read %d replies, %s, %d consumer entries (%s)", s.read.Replies, kb(s.read.Bytes), s.read.Consumers, s.read.Placement),
			fmt.Sprintf("     before issue 23 the census asked every server's JSZ: %d replies, %.1f MB, the last after %s (no deadline)%s",
				s.jsz.replies, float64(s.jsz.bytes)/1e6, ms(s.jsz.slowest), failedNote(s.jszErr)))
		if s.incomplete != "" {
			measured[len(measured)-1] += " (INCOMPLETE)"
			notes = append(notes, fmt.Sprintf("     INCOMPLETE with the operator's options (each server has %s to answer): %s",
				natsops.DefaultCensusTimeout, s.incomplete))
		}
	}
	r := result{
		row: "d", what: "census, 3 servers, 64 / 1024 / 4096 R3 consumers",
		measured: strings.Join(measured, ", "),
		baseline: fmt.Sprintf("no-consumer census %s", ms(median(small.baseline))),
		ratio:    fmt.Sprintf("growth 64->4096: %.1fx (%.0fx the consumers)", growth, float64(large.consumers)/float64(small.consumers)),
		goal:     fmt.Sprintf("64 under %s; growth reported", ms(censusGoal)),
		verdict:  judge(median(small.times) < censusGoal && small.incomplete == ""),
		notes:    notes,
	}
	r.notes = append(r.notes, fmt.Sprintf("this process's CPU during the %d-consumer censuses (the census client: decoding the listings and merging):", large.consumers))
	for _, l := range large.prof.top(12) {
		r.notes = append(r.notes, "  "+l)
	}
	if r.verdict == missed {
		r.why = []string{fmt.Sprintf("the census of 64 consumers took %s (median)", ms(median(small.times)))}
		r.profile = small.prof.top(20)
	}
	for _, s := range sizes {
		if s.incomplete != "" {
			r.why = append(r.why, fmt.Sprintf("at %d consumers the census is incomplete: %s", s.consumers, s.incomplete))
		}
	}
	return r
}

func failedNote(err string) string {
	if err == "" {
		return ""
	}
	return "; the probe FAILED: " + err
}
