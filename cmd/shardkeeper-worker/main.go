// Command shardkeeper-worker is the reference worker: it embeds pkg/worker,
// writes every row it receives into a PostgreSQL table through the claim's
// write guard (a stale owner's write is refused) and acknowledges a row only
// after the write committed. It serves /healthz, /readyz, /status and
// Prometheus /metrics. It runs in the end-to-end tests and the demo, and is
// the example to copy.
//
// Configuration comes from flags, each with an environment variable
// fallback so a pod spec can set them:
//
//	--topology        SHARDKEEPER_TOPOLOGY    namespace/name of the ShardTopology
//	--member          POD_NAME                this worker's member name
//	--nats-url        NATS_URL                NATS server URL(s), comma-separated
//	--nats-creds      NATS_CREDS              optional credentials file: a .creds file,
//	                                          user:password, or a token (as the operator takes them)
//	--nats-tls-dir    NATS_TLS_DIR            optional directory holding ca.crt, tls.crt, tls.key
//	                                          (a mounted TLS Secret, as spec.nats.tlsSecretRef)
//	--registry-dsn    REGISTRY_DSN            PostgreSQL registry (never logged)
//	--sink-dsn        SINK_DSN                sink database; default: the registry's
//	--health-addr     WORKER_HEALTH_ADDR      address of the HTTP endpoints
//	--history-dir     WORKER_HISTORY_DIR      optional: write a delivery history file there
//	--drain-timeout   WORKER_DRAIN_TIMEOUT    bound on a handover's wait for delivered rows until the
//	                                          registry carries spec.rollout.drainTimeout (which wins)
//	--version                                 print the version and exit
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/version"
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv)
	if code, done := configExit(err, os.Stderr); done {
		os.Exit(code)
	}
	if cfg.showVersion {
		version.Print("shardkeeper-worker")
		return
	}
	log := newLogger(os.Stderr, cfg.verbosity)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	runFn := run
	if cfg.strategy == "independent" {
		runFn = runIndependent
	}
	if err := runFn(ctx, cfg, log); err != nil {
		log.Error(err, "Worker stopped")
		os.Exit(1)
	}
}

// config is the worker's settings.
type config struct {
	topology, member            string
	natsURL, natsCreds          string
	natsTLSDir                  string
	registryDSN, sinkDSN        string
	subjectPrefix, consumerName string
	healthAddr                  string
	historyDir                  string
	drainTimeout                time.Duration
	// handlerDelay is a test knob: the sink waits this long before each
	// write, like a slow database, so tests can catch rows in flight.
	handlerDelay time.Duration
	// handlerDelayFile is a test knob too: while this file exists, the
	// sink also waits the duration written in it before each write, so a
	// test can slow one running worker down and speed it up again;
	// removing the file ends the writes' waits at once.
	handlerDelayFile string
	fetchBatch       int
	verbosity        int
	showVersion      bool
	// strategy is "sequenced" (the registry protocol) or "independent"
	// (the baseline: capped rendezvous of partitions x shards over the
	// fixed slots 0..replicas-1, fixed at start).
	strategy                     string
	partitions, shards, replicas int
}

// errBadFlag wraps every configuration refusal.
var errBadFlag = errors.New("bad worker configuration")

// configExit says whether parseConfig's answer ends the process, and with
// which code: --help (the flag package printed the usage already) is a
// success, anything else refused is a usage error (2), said on stderr.
func configExit(err error, stderr io.Writer) (code int, done bool) {
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return 0, true
	default:
		fmt.Fprintln(stderr, err)
		return 2, true
	}
}

// defaultDrainTimeout is the SDK's (worker.Options.DrainTimeout) and the
// spec's default, so a worker that starts before the operator wrote the
// registry drains as long as it will once it reads the registry.
const defaultDrainTimeout = 30 * time.Second

func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("shardkeeper-worker", flag.ContinueOnError)
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs.StringVar(&c.topology, "topology", env("SHARDKEEPER_TOPOLOGY", ""), "namespace/name of the ShardTopology (env SHARDKEEPER_TOPOLOGY)")
	fs.StringVar(&c.member, "member", env("POD_NAME", ""), "member name, normally the pod name (env POD_NAME)")
	fs.StringVar(&c.natsURL, "nats-url", env("NATS_URL", ""), "NATS server URLs, comma-separated (env NATS_URL)")
	fs.StringVar(&c.natsCreds, "nats-creds", env("NATS_CREDS", ""), "NATS credentials file: a .creds file, user:password or a token (env NATS_CREDS)")
	fs.StringVar(&c.natsTLSDir, "nats-tls-dir", env("NATS_TLS_DIR", ""), "directory with ca.crt and optionally tls.crt/tls.key for NATS TLS (env NATS_TLS_DIR)")
	fs.StringVar(&c.registryDSN, "registry-dsn", env("REGISTRY_DSN", ""), "PostgreSQL registry DSN (env REGISTRY_DSN)")
	fs.StringVar(&c.sinkDSN, "sink-dsn", env("SINK_DSN", ""), "sink database DSN; default the registry's (env SINK_DSN)")
	fs.StringVar(&c.subjectPrefix, "subject-prefix", env("SUBJECT_PREFIX", "shardkeeper"), "spec.nats.subjectPrefix, used only until the registry (or, with --strategy independent, always) (env SUBJECT_PREFIX)")
	fs.StringVar(&c.consumerName, "consumer-name", env("CONSUMER_NAME", "ingest"), "spec.nats.consumerName (env CONSUMER_NAME)")
	fs.StringVar(&c.healthAddr, "health-addr", env("WORKER_HEALTH_ADDR", ":8081"), "address of /healthz, /readyz, /status, /metrics (env WORKER_HEALTH_ADDR)")
	fs.StringVar(&c.historyDir, "history-dir", env("WORKER_HISTORY_DIR", ""), "write a delivery history (one JSON-lines file per process) into this directory (env WORKER_HISTORY_DIR)")
	drainDefault, drainErr := envDurationOr(getenv, "WORKER_DRAIN_TIMEOUT", defaultDrainTimeout)
	fs.DurationVar(&c.drainTimeout, "drain-timeout", drainDefault, "bound on a handover's wait for delivered rows, used only until the registry carries the ShardTopology's spec.rollout.drainTimeout, which the operator writes there and which wins (env WORKER_DRAIN_TIMEOUT)")
	fs.BoolVar(&c.showVersion, "version", false, "print the version and exit")
	fs.IntVar(&c.fetchBatch, "fetch-batch", 64, "rows per pull")
	fs.DurationVar(&c.handlerDelay, "handler-delay", envDuration(getenv, "WORKER_HANDLER_DELAY"), "test knob: wait this long before each sink write, like a slow sink (env WORKER_HANDLER_DELAY)")
	fs.StringVar(&c.handlerDelayFile, "handler-delay-file", env("WORKER_HANDLER_DELAY_FILE", ""), "test knob: while this file exists, also wait the duration written in it before each sink write; removing it ends the waits (env WORKER_HANDLER_DELAY_FILE)")
	fs.IntVar(&c.verbosity, "v", 0, "log verbosity")
	fs.StringVar(&c.strategy, "strategy", env("WORKER_STRATEGY", "sequenced"), "sequenced, or independent (a baseline for comparison) (env WORKER_STRATEGY)")
	fs.IntVar(&c.partitions, "partitions", envInt(getenv, "PARTITIONS"), "independent strategy only: N (env PARTITIONS)")
	fs.IntVar(&c.shards, "shards", envInt(getenv, "SHARDS"), "independent strategy only: V (env SHARDS)")
	fs.IntVar(&c.replicas, "replicas", envInt(getenv, "REPLICAS"), "independent strategy only: pods in the StatefulSet (env REPLICAS)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", errBadFlag, err)
	}
	if c.showVersion {
		return c, nil
	}
	if c.sinkDSN == "" {
		c.sinkDSN = c.registryDSN
	}
	var errs []error
	if drainErr != nil {
		errs = append(errs, drainErr)
	}
	required := []struct{ flag, val string }{{"--member", c.member}, {"--nats-url", c.natsURL}}
	switch c.strategy {
	case "sequenced":
		required = append(required, struct{ flag, val string }{"--topology", c.topology}, struct{ flag, val string }{"--registry-dsn", c.registryDSN})
	case "independent":
		required = append(required, struct{ flag, val string }{"--sink-dsn or --registry-dsn", c.sinkDSN})
		if c.replicas < 1 {
			errs = append(errs, fmt.Errorf("%w: --replicas must be at least 1 with --strategy independent", errBadFlag))
		}
	default:
		errs = append(errs, fmt.Errorf("%w: --strategy must be sequenced or independent, got %q", errBadFlag, c.strategy))
	}
	for _, req := range required {
		if req.val == "" {
			errs = append(errs, fmt.Errorf("%w: %s is required", errBadFlag, req.flag))
		}
	}
	return c, errors.Join(errs...)
}

// envDuration reads a duration environment variable, 0 when unset or bad.
func envDuration(getenv func(string) string, name string) time.Duration {
	d, _ := time.ParseDuration(getenv(name))
	return d
}

// envDurationOr reads a duration environment variable, def when unset; a
// value that is not a duration is refused by name.
func envDurationOr(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return def, fmt.Errorf("%w: %s must be a positive duration such as 30s, got %q", errBadFlag, name, v)
	}
	return d, nil
}

// envInt reads an integer environment variable, 0 when unset or bad (the
// flag's validation then names it).
func envInt(getenv func(string) string, name string) int {
	n, _ := strconv.Atoi(getenv(name))
	return n
}
