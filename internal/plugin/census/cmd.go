// Package census is "kubectl shardkeeper census": with NAME, the NATS
// server versions the operator's last census saw (status.census), so no
// NATS credentials are needed on the laptop; with --server, a census taken
// from here through the system account. Both exit 1 when a server that
// matters is below the floor or unknown.
package census

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/status"
)

// ErrFloorNotMet is what census returns, after printing, when a server
// that matters is below the floor or unknown.
var ErrFloorNotMet = errors.New("version floor not met")

type options struct {
	f         *plugin.Factory
	server    string
	creds     string
	floor     string
	account   string
	consumers []string
	timeout   time.Duration
	output    string
}

// NewCmd returns the census command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	o := &options{f: f}
	cmd := &cobra.Command{
		Use:   "census [NAME | --server URL]",
		Short: "Show every NATS server's version: from a ShardTopology's status, or asked directly with --server",
		Long: `With NAME: the versions the operator's last census saw, per server, from
status.census (no NATS credentials needed here). With --server: reads the
version of every NATS server that matters through the system account,
from this machine. Both exit 1 when a server is below the floor or could
not be seen.`,
		Example: `  kubectl shardkeeper census ingest
  kubectl shardkeeper census --server nats://sys:pass@nats:4222 --floor 2.14.0`,
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return plugin.Usagef("at most one NAME, got %q", args)
			case len(args) == 1 && o.server != "":
				return plugin.Usagef("give NAME to read status.census or --server to ask NATS, not both")
			case len(args) == 0 && o.server == "":
				return plugin.Usagef("give a ShardTopology NAME, or --server URL")
			}
			return nil
		},
		ValidArgsFunction: f.CompleteTopologies,
		RunE: func(_ *cobra.Command, args []string) error {
			if err := plugin.CheckDataFormat(o.output); err != nil {
				return err
			}
			if len(args) == 1 {
				return o.fromStatus(args[0])
			}
			return o.direct()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.server, "server", "", "NATS URL(s), comma separated; credentials may be embedded")
	fl.StringVar(&o.creds, "creds", "", "with --server: credentials file of a system account user")
	fl.StringVar(&o.floor, "floor", natsops.DefaultFloor.String(), "with --server: lowest acceptable server version")
	fl.StringVar(&o.account, "account", "", "with --server: JetStream account of the --consumer streams (default: search all)")
	fl.StringSliceVar(&o.consumers, "consumer", nil, "with --server: STREAM/NAME of a consumer whose leader and replicas must be counted (repeatable)")
	fl.DurationVar(&o.timeout, "timeout", natsops.DefaultCensusTimeout, "with --server: how long to wait for servers that should answer")
	fl.StringVarP(&o.output, "output", "o", "", "json or yaml; default a table")
	return cmd
}

// fromStatus prints status.census of the topology.
func (o *options) fromStatus(name string) error {
	return o.f.WithTopology(name, func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error {
		cs := t.Status.Census
		if cs == nil || cs.ObservedAt == nil {
			return fmt.Errorf("shardtopology %s/%s has no census in status yet (spec.nats.systemCredentialsSecretRef set? see kubectl shardkeeper status %s)",
				t.Namespace, t.Name, t.Name)
		}
		if o.output != "" {
			if err := plugin.WriteData(o.f.Out, o.output, "census", cs); err != nil {
				return err
			}
		} else if err := printStatusCensus(o.f.Out, t, o.f.Clock()); err != nil {
			return err
		}
		if len(cs.BelowFloor) > 0 {
			return fmt.Errorf("%w: floor %s, lowest %s, below: %s", ErrFloorNotMet, t.Spec.NATS.VersionFloorOrDefault(), cs.MinVersion, strings.Join(cs.BelowFloor, ", "))
		}
		return nil
	})
}

func printStatusCensus(w io.Writer, t *topologyv1.ShardTopology, now time.Time) error {
	cs := t.Status.Census
	verdict := "floor met"
	if len(cs.BelowFloor) > 0 {
		verdict = "FLOOR NOT MET, below: " + strings.Join(cs.BelowFloor, ", ")
	}
	fmt.Fprintf(w, "Census of shardtopology %s/%s taken %s ago (%s), floor %s, lowest %s: %s\n\n", t.Namespace, t.Name,
		status.Age(cs.ObservedAt.Time, now), cs.ObservedAt.UTC().Format(time.RFC3339), t.Spec.NATS.VersionFloorOrDefault(), cs.MinVersion, verdict)
	rows := make([][]string, 0, len(cs.Servers))
	for _, s := range cs.Servers {
		st := "ok"
		if s.BelowFloor {
			st = "BELOW FLOOR"
		}
		rows = append(rows, []string{s.Name, s.Version, dash(s.Cluster), dash(s.Role), st})
	}
	return plugin.PrintTable(w, []string{"name", "version", "cluster", "role", "status"}, rows)
}

// direct takes a census through the system account from here, so a user
// can run it before applying a topology.
func (o *options) direct() error {
	if o.timeout <= 0 {
		return plugin.Usagef("--timeout must be positive, got %s", o.timeout)
	}
	if _, err := natsops.ParseVersion(o.floor); err != nil {
		return plugin.Usagef("--floor: %v", err)
	}
	var refs []natsops.ConsumerRef
	for _, v := range o.consumers {
		stream, name, ok := strings.Cut(v, "/")
		if !ok || stream == "" || name == "" {
			return plugin.Usagef("--consumer wants STREAM/NAME, got %q", v)
		}
		refs = append(refs, natsops.ConsumerRef{Stream: stream, Name: name})
	}
	opts := []nats.Option{nats.Name("kubectl-shardkeeper census"), nats.Timeout(o.timeout), nats.MaxReconnects(0)}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	nc, err := nats.Connect(o.server, opts...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", Redact(o.server), err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*o.timeout)
	defer cancel()
	c, err := natsops.TakeCensus(ctx, nc, natsops.CensusOptions{Floor: o.floor, Timeout: o.timeout, Account: o.account, Consumers: refs})
	if err != nil {
		return fmt.Errorf("take census through %s: %w", Redact(o.server), err)
	}
	if o.output != "" {
		err = plugin.WriteData(o.f.Out, o.output, "census", c)
	} else {
		err = printCensus(o.f.Out, c)
	}
	if err != nil {
		return err
	}
	if !c.FloorMet() {
		return fmt.Errorf("%w: floor %s, lowest %s, below: %s", ErrFloorNotMet, c.Floor, c.MinVersion, strings.Join(c.BelowFloor, ", "))
	}
	return nil
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
		rows = append(rows, []string{s.Name, s.Version, dash(s.Cluster), string(s.Role), apiLevel(s.APILevel), strconv.Itoa(s.Consumers), serverStatus(s)})
	}
	if err := plugin.PrintTable(w, []string{"name", "version", "cluster", "role", "api", "consumers", "status"}, rows); err != nil {
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
		if err := plugin.PrintTable(w, []string{"consumer", "leader", "replicas"}, rows); err != nil {
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

func serverStatus(s natsops.ServerInfo) string {
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

// Redact hides credentials embedded in NATS URLs (user and password, or a
// token in the user's place) before they reach a message.
func Redact(servers string) string {
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
