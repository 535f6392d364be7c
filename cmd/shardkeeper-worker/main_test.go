package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

func TestConfigRefusesMissingAndBadFlagsByName(t *testing.T) {
	env := map[string]string{"POD_NAME": "ingest-0", "NATS_URL": "nats://x:4222", "REGISTRY_DSN": "postgres://r", "SHARDKEEPER_TOPOLOGY": "ns/t"}
	getenv := func(k string) string { return env[k] }
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"environment alone suffices", nil, ""},
		{"empty topology", []string{"--topology", ""}, "--topology is required"},
		{"unknown strategy", []string{"--strategy", "yolo"}, "--strategy must be sequenced or independent"},
		{"independent needs replicas", []string{"--strategy", "independent"}, "--replicas must be at least 1"},
		{"unknown flag", []string{"--frobnicate"}, "frobnicate"},
		{"version needs nothing else", []string{"--version", "--topology", ""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig(tt.args, getenv)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "":
				if !c.showVersion && c.sinkDSN != c.registryDSN {
					t.Fatalf("sink DSN defaults to %q, want the registry's", c.sinkDSN)
				}
			case err == nil || !errors.Is(err, errBadFlag) || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// --help prints the usage and succeeds; only a refused configuration is a
// usage error (2).
func TestHelpExitsZeroAndBadFlagsTwo(t *testing.T) {
	env := map[string]string{"POD_NAME": "ingest-0", "NATS_URL": "nats://x:4222", "REGISTRY_DSN": "postgres://r", "SHARDKEEPER_TOPOLOGY": "ns/t"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantDone bool
		wantOut  string
	}{
		{"--help", []string{"--help"}, 0, true, ""},
		{"-h", []string{"-h"}, 0, true, ""},
		{"an unknown flag", []string{"--frobnicate"}, 2, true, "frobnicate"},
		{"a good configuration runs", nil, 0, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(tt.args, func(k string) string { return env[k] })
			var out strings.Builder
			code, done := configExit(err, &out)
			if code != tt.wantCode || done != tt.wantDone {
				t.Fatalf("exit %d (ends: %v), want %d (ends: %v); error %v", code, done, tt.wantCode, tt.wantDone, err)
			}
			if !strings.Contains(out.String(), tt.wantOut) || (tt.wantOut == "" && out.Len() > 0) {
				t.Fatalf("printed %q, want %q", out.String(), tt.wantOut)
			}
		})
	}
}

// A registry DSN that reaches nothing is reported as the registry's
// problem, not as the sink's (which shares the DSN by default).
func TestAnUnreachableRegistryIsReportedAsTheRegistry(t *testing.T) {
	nc := natstest.StartCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	creds := filepath.Join(t.TempDir(), "app.creds")
	if err := os.WriteFile(creds, []byte(natstest.AppUser+":"+natstest.AppPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := "postgres://shardkeeper:secret-password@127.0.0.1:1/ingest?connect_timeout=5"
	cfg := config{topology: "ns/t", member: "ingest-0", natsURL: nc.URL(), natsCreds: creds, registryDSN: dsn, sinkDSN: dsn,
		healthAddr: "127.0.0.1:0", drainTimeout: time.Second, fetchBatch: 1, strategy: "sequenced"}
	err := run(ctx, cfg, logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "registry") || strings.Contains(err.Error(), "sink") {
		t.Fatalf("run: %v, want an error naming the registry and not the sink", err)
	}
	if strings.Contains(err.Error(), "secret-password") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

func TestDrainTimeoutFromFlagOrEnvironment(t *testing.T) {
	base := map[string]string{"POD_NAME": "ingest-0", "NATS_URL": "nats://x:4222", "REGISTRY_DSN": "postgres://r", "SHARDKEEPER_TOPOLOGY": "ns/t"}
	tests := []struct {
		name    string
		env     string
		args    []string
		want    time.Duration
		wantErr string
	}{
		{name: "default is the SDK's and the spec's", want: 30 * time.Second},
		{name: "environment", env: "30s", want: 30 * time.Second},
		{name: "the flag wins", env: "30s", args: []string{"--drain-timeout", "5s"}, want: 5 * time.Second},
		{name: "a bad value is refused by name", env: "soon", wantErr: "WORKER_DRAIN_TIMEOUT must be a positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "WORKER_DRAIN_TIMEOUT" {
					return tt.env
				}
				return base[k]
			}
			c, err := parseConfig(tt.args, getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || c.drainTimeout != tt.want {
				t.Fatalf("drain timeout %s (err %v), want %s", c.drainTimeout, err, tt.want)
			}
		})
	}
}

// The sink writes a row only under a valid claim, counts a redelivered row
// as a duplicate, and refuses a write whose claim was released (stale
// epoch), leaving the row for the next owner.
//
// checks P1, P3
func TestSinkWritesOnlyUnderAValidClaim(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewTestDatabase(t)
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	const topo = "ns/sink"
	if err := reg.EnsureTopology(ctx, topo, fleettest.FastParams()); err != nil {
		t.Fatal(err)
	}
	lease, err := reg.Join(ctx, topo, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	epoch, err := reg.CreatePending(ctx, topo, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.AckFreeze(ctx, lease.MemberRef, epoch); err != nil {
		t.Fatal(err)
	}
	if err := reg.Activate(ctx, topo, epoch); err != nil {
		t.Fatal(err)
	}
	c, err := reg.Claim(ctx, lease.MemberRef, epoch, "0.0")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := newSink(ctx, pool, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	row := func(id string) worker.Row {
		return worker.Row{Unit: ownership.Unit{}, Token: c.Token, Headers: map[string][]string{worker.RowIDHeader: {id}}}
	}

	if got := s.write(ctx, row("a")); got != worker.Ack {
		t.Fatalf("first write: %s, want ack", got)
	}
	if got := s.write(ctx, row("a")); got != worker.Ack || testutil.ToFloat64(s.duplicates) != 1 {
		t.Fatalf("redelivery: %s with %v duplicates, want ack and 1", got, testutil.ToFloat64(s.duplicates))
	}
	if err := reg.Release(ctx, c.Token); err != nil {
		t.Fatal(err)
	}
	if got := s.write(ctx, row("b")); got != worker.Abandon || testutil.ToFloat64(s.refused) != 1 {
		t.Fatalf("write after release: %s, want abandon (refused by the guard)", got)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shardkeeper_sink_writes WHERE id = 'b'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("stale write landed: %d rows (err %v)", n, err)
	}
	// The sink keeps every write, the duplicate too, with who wrote it.
	var writes, members int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT member) FROM shardkeeper_sink_writes WHERE id = 'a'`).Scan(&writes, &members); err != nil || writes != 2 || members != 1 {
		t.Fatalf("row a: %d writes by %d members (err %v), want 2 by 1", writes, members, err)
	}
}

// The worker logs JSON lines with the operator's keys, so one query finds
// a unit's story in both.
func TestLogsAreJSONWithTheOperatorsKeys(t *testing.T) {
	var b strings.Builder
	log := newLogger(&b, 0).WithValues("topology", "prod/ingest", "member", "ingest-0")
	log.Info("Took over with RESET", "unit", "3.11", "epoch", 7)
	log.V(1).Info("not at -v 0")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line (V(1) hidden), got %q", b.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatalf("not JSON: %v: %s", err, lines[0])
	}
	for k, want := range map[string]any{"level": "info", "msg": "Took over with RESET", "topology": "prod/ingest", "member": "ingest-0", "unit": "3.11", "epoch": 7.0} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (line %s)", k, got[k], want, lines[0])
		}
	}
	if _, err := time.Parse(time.RFC3339, fmt.Sprint(got["ts"])); err != nil {
		t.Errorf("ts %v is not RFC 3339 as the operator writes it: %v", got["ts"], err)
	}
}

// The worker takes NATS credentials in every form the operator takes them,
// from the files a pod mounts, and refuses bad ones naming the flag.
func TestNATSCredentialFormsMatchTheOperators(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		cfg  config
		want string // "" means accepted
	}{
		{"user and password", config{natsCreds: write("up", "app:secret\n")}, ""},
		{"token", config{natsCreds: write("tok", "s3cr3t")}, ""},
		{"missing credentials file", config{natsCreds: filepath.Join(dir, "absent")}, "--nats-creds"},
		{"TLS directory with a bad CA", config{natsTLSDir: filepath.Dir(write("ca.crt", "not a certificate"))}, "--nats-tls-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := natsAuth(tc.cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}
