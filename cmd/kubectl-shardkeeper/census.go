package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
)

// errFloorNotMet is what "census" returns, after printing, when a server
// that matters is below the floor or unknown; the command exits 1.
var errFloorNotMet = errors.New("version floor not met")

// censusFlags are the flags of "census".
type censusFlags struct {
	server    string
	creds     string
	floor     string
	account   string
	consumers consumerList
	timeout   time.Duration
	format    string
}

// consumerList collects repeated --consumer STREAM/NAME flags.
type consumerList []natsops.ConsumerRef

func (l *consumerList) String() string {
	var s []string
	for _, r := range *l {
		s = append(s, r.String())
	}
	return strings.Join(s, ",")
}

func (l *consumerList) Set(v string) error {
	stream, name, ok := strings.Cut(v, "/")
	if !ok || stream == "" || name == "" {
		return fmt.Errorf("want STREAM/NAME, got %q", v)
	}
	*l = append(*l, natsops.ConsumerRef{Stream: stream, Name: name})
	return nil
}

// runCensus reads every NATS server's version through the system account,
// prints it, and fails when the floor is not met, so a user can run it
// before applying a topology.
func runCensus(args []string) error {
	f, err := parseCensusFlags(args)
	if err != nil {
		return err
	}
	opts := []nats.Option{nats.Name("kubectl-shardkeeper census"), nats.Timeout(f.timeout), nats.MaxReconnects(0)}
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	nc, err := nats.Connect(f.server, opts...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact(f.server), err)
	}
	defer nc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 4*f.timeout)
	defer cancel()
	c, err := natsops.TakeCensus(ctx, nc, natsops.CensusOptions{
		Floor: f.floor, Timeout: f.timeout, Account: f.account, Consumers: f.consumers,
	})
	if err != nil {
		return fmt.Errorf("take census through %s: %w", redact(f.server), err)
	}
	if f.format == formatJSON {
		err = printJSON(stdout, c)
	} else {
		err = printCensus(stdout, c)
	}
	if err != nil {
		return err
	}
	if !c.FloorMet() {
		return fmt.Errorf("%w: floor %s, lowest %s, below: %s", errFloorNotMet, c.Floor, c.MinVersion, strings.Join(c.BelowFloor, ", "))
	}
	return nil
}

func parseCensusFlags(args []string) (censusFlags, error) {
	var f censusFlags
	fs := newFlagSet("census")
	fs.StringVar(&f.server, "server", "", "NATS URL(s), comma separated; credentials may be embedded (required)")
	fs.StringVar(&f.creds, "creds", "", "credentials file of a system account user")
	fs.StringVar(&f.floor, "floor", natsops.DefaultFloor.String(), "lowest acceptable server version")
	fs.StringVar(&f.account, "account", "", "JetStream account of the --consumer streams (default: search all)")
	fs.Var(&f.consumers, "consumer", "STREAM/NAME of a consumer whose leader and replicas must be counted (repeatable)")
	fs.DurationVar(&f.timeout, "timeout", natsops.DefaultCensusTimeout, "how long to wait for servers that should answer")
	format := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kubectl shardkeeper census --server URL [--creds FILE] [--floor 2.14.0] [-o json]\n\n"+
			"Reads the version of every NATS server that matters through the system account and\n"+
			"exits 1 when any is below the floor or could not be seen.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, fmt.Errorf("%w: %w", errUsage, err)
	}
	f.format = *format
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	case f.server == "":
		return f, fmt.Errorf("%w: --server is required", errUsage)
	case f.timeout <= 0:
		return f, fmt.Errorf("%w: --timeout must be positive", errUsage)
	}
	if _, err := natsops.ParseVersion(f.floor); err != nil {
		return f, fmt.Errorf("%w: --floor: %w", errUsage, err)
	}
	return f, checkFormat(f.format)
}

// printCensus writes a verdict line, the servers in a table, the inspected
// consumers and the findings.
func printCensus(w io.Writer, c *natsops.Census) error {
	verdict := "floor met"
	if !c.FloorMet() {
		verdict = "FLOOR NOT MET, below: " + strings.Join(c.BelowFloor, ", ")
	}
	fmt.Fprintf(w, "Census through %s at %s, floor %s, lowest %s: %s\n\n",
		c.Connected, c.TakenAt.Format(time.RFC3339), c.Floor, c.MinVersion, verdict)
	rows := make([][]string, 0, len(c.Servers))
	for _, s := range c.Servers {
		rows = append(rows, []string{s.Name, s.Version, dash(s.Cluster), string(s.Role), apiLevel(s.APILevel), strconv.Itoa(s.Consumers), status(s)})
	}
	if err := printTable(w, []string{"name", "version", "cluster", "role", "api", "consumers", "status"}, rows); err != nil {
		return err
	}
	if len(c.Consumers) > 0 {
		fmt.Fprintln(w)
		rows = rows[:0]
		for _, p := range c.Consumers {
			leader := dash(p.Leader)
			if !p.Found {
				leader = "(not found)"
			}
			rows = append(rows, []string{p.ConsumerRef.String(), leader, dash(strings.Join(p.Replicas, ","))})
		}
		if err := printTable(w, []string{"consumer", "leader", "replicas"}, rows); err != nil {
			return err
		}
	}
	if len(c.Findings) > 0 {
		fmt.Fprintln(w, "\nFindings:")
		for _, f := range c.Findings {
			fmt.Fprintln(w, "  - "+f)
		}
	}
	return nil
}

func status(s natsops.ServerInfo) string {
	switch {
	case s.BelowFloor:
		return "BELOW FLOOR: " + s.Reason
	case !s.Counted:
		return "not counted: " + s.Reason
	}
	return "ok"
}

func apiLevel(l int) string {
	if l == 0 {
		return "-"
	}
	return strconv.Itoa(l)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// redact hides credentials embedded in NATS URLs (user and password, or a
// token in the user's place) before they reach a message.
func redact(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil && strings.Contains(p, "@"):
			parts[i] = "(unparsable URL)"
		case err == nil && u.User != nil:
			u.User = url.User("REDACTED")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
