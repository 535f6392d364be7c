package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// The README gives the SQL that creates the operator's and the workers'
// PostgreSQL roles (issue 21). This runs that block as the README prints
// it, on a fresh server: the operator role migrates the schema and rolls
// epochs under its leader token, the SDK runs a worker under the worker
// role through everything a worker writes (join, claims, renewals,
// activity reports, a freeze acknowledgement, a handover, leaving), and
// the worker role is refused every write that is the operator's: the
// token itself, and the rows the token guards, even with the current
// token number presented (a worker DSN must not be able to act as the
// operator, nor fence the real one).
func TestTheREADMEsRolesRunAWorkerAndKeepItFromTheOperatorsRows(t *testing.T) {
	ctx := context.Background()
	setup, grants := readmeRoleSQL(t, "../../README.md")

	pg := pgtest.New(t)
	superDSN := pg.NewTestDatabase(t)
	db := databaseOf(t, superDSN)
	passwords := map[string]string{"shardkeeper_operator": "operator-secret", "shardkeeper_worker": "worker-secret"}
	runAs(t, superDSN, fillRoleSQL(t, setup, db, passwords))
	operatorDSN := roleDSN(pg, "shardkeeper_operator", passwords, db)
	workerDSN := roleDSN(pg, "shardkeeper_worker", passwords, db)

	// The operator role migrates (StartInfra opens the registry without
	// SkipMigrate) and creates the topology; then the README's grants.
	f := fleettest.StartInfra(t, fleettest.Options{PG: pg, RegistryDSN: operatorDSN, Servers: 1,
		Partitions: 1, Shards: 1, DrainTimeout: time.Second})
	runAs(t, superDSN, fillRoleSQL(t, grants, db, passwords))
	f.ClientDSN = workerDSN
	assertSchemaOwner(t, superDSN, "shardkeeper_operator")

	base := f.Registry
	first, err := base.TakeOperatorToken(ctx, f.Topology, "operator-a")
	if err != nil {
		t.Fatalf("the operator role takes its token: %v", err)
	}
	f.Registry = base.AsOperator(first)
	f.ChangeTopology(1, 1)

	watch := &privilegeWatch{}
	a := startArmedSDK(t, f, "a", nil, watch.arm, nil)
	waitHolding(t, a, 30*time.Second, "0.0")
	assertRenewsAndReports(t, f, "a", "0.0")
	assertSystemIDRecorded(t, superDSN, f.Topology)

	t.Run("the worker role may not act as the operator", func(t *testing.T) {
		assertWorkerRoleRefused(t, f, workerDSN, first.Epoch)
		tok, err := base.OperatorToken(ctx, f.Topology)
		if err != nil {
			t.Fatal(err)
		}
		if tok.Epoch != first.Epoch || tok.Holder != first.Holder {
			t.Fatalf("operator token is %d held by %q after the worker role's attempts, want %d held by %q",
				tok.Epoch, tok.Holder, first.Epoch, first.Holder)
		}
	})

	// A new leader takes over: the old one's writes are refused, the new
	// one's epoch change needs the worker's freeze acknowledgement.
	second, err := base.TakeOperatorToken(ctx, f.Topology, "operator-b")
	if err != nil {
		t.Fatalf("the next leader takes its token: %v", err)
	}
	if err := base.AsOperator(first).SetDraining(ctx, f.Topology, "a", true); !isOperatorFenced(err) {
		t.Fatalf("the superseded leader's drain request: %v, want refused as superseded", err)
	}
	f.Registry = base.AsOperator(second)
	f.ChangeTopology(1, 2)
	waitHolding(t, a, 30*time.Second, "0.0", "0.1")

	// The new leader drains a: it hands both units over to b.
	b := startArmedSDK(t, f, "b", nil, watch.arm, nil)
	if err := f.Registry.SetDraining(ctx, f.Topology, "a", true); err != nil {
		t.Fatalf("the leader's drain request: %v", err)
	}
	waitHolding(t, b, 60*time.Second, "0.0", "0.1")
	waitHolding(t, a, 30*time.Second)
	for _, w := range []*sdkWorker{a, b} {
		if err := w.stop(30 * time.Second); err != nil {
			t.Fatalf("%s stops: %v", w.w.Status().Member, err)
		}
	}
	if denied := watch.refusals(); len(denied) > 0 {
		t.Fatalf("the worker role was refused in the SDK's own calls:\n%s", strings.Join(denied, "\n"))
	}
	if watch.calls() == 0 {
		t.Fatal("the privilege watch saw no registry call: the workers did not run through it")
	}
}

// readmeRoleSQL reads the fenced sql block after "Workers never migrate"
// in the README and returns its statements in two parts: those to run
// before the operator first starts, and those after (split at the
// README's "once the operator has started" comment).
func readmeRoleSQL(t *testing.T, path string) (before, after []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the README: %v", err)
	}
	text := string(raw)
	at := strings.Index(text, "Workers never migrate")
	if at < 0 {
		t.Fatal(`the README no longer says "Workers never migrate": update this test to find its roles' SQL`)
	}
	open := strings.Index(text[at:], "```sql\n")
	if open < 0 {
		t.Fatal("no ```sql block after \"Workers never migrate\" in the README")
	}
	body := text[at+open+len("```sql\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatal("the README's roles' SQL block is not closed")
	}
	part := &before
	var stmt strings.Builder
	for _, line := range strings.Split(body[:end], "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "--"):
			if strings.Contains(line, "once the operator has started") {
				part = &after
			}
			continue
		case line == "":
			continue
		}
		stmt.WriteString(line)
		stmt.WriteString(" ")
		if strings.HasSuffix(line, ";") {
			*part = append(*part, strings.TrimSpace(stmt.String()))
			stmt.Reset()
		}
	}
	if rest := strings.TrimSpace(stmt.String()); rest != "" {
		t.Fatalf("the README's roles' SQL ends in an unterminated statement: %q", rest)
	}
	if len(before) == 0 || len(after) == 0 {
		t.Fatalf("the README's roles' SQL has no %q split (before: %d statements, after: %d)",
			"once the operator has started", len(before), len(after))
	}
	return before, after
}

var (
	rolePassword = regexp.MustCompile(`CREATE ROLE (\w+) LOGIN PASSWORD '\.\.\.'`)
	readmeDB     = regexp.MustCompile(`ON DATABASE ingest\b`)
)

// fillRoleSQL fills in the README's placeholders: each role's password
// and the database's name.
func fillRoleSQL(t *testing.T, stmts []string, db string, passwords map[string]string) []string {
	t.Helper()
	out := make([]string, len(stmts))
	for i, s := range stmts {
		s = rolePassword.ReplaceAllStringFunc(s, func(m string) string {
			role := rolePassword.FindStringSubmatch(m)[1]
			pw, ok := passwords[role]
			if !ok {
				t.Fatalf("the README creates role %s, which this test does not know", role)
			}
			return fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, pw)
		})
		out[i] = readmeDB.ReplaceAllString(s, "ON DATABASE "+pgx.Identifier{db}.Sanitize())
	}
	return out
}

// runAs runs stmts one at a time on dsn, failing on the first refused.
func runAs(t *testing.T, dsn string, stmts []string) {
	t.Helper()
	ctx := context.Background()
	conn := connectAs(t, dsn)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("the README's %q: %v", s, err)
		}
	}
}

func databaseOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func roleDSN(pg *pgtest.Server, role string, passwords map[string]string, db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", role, url.QueryEscape(passwords[role]), pg.Port, db)
}

// assertSystemIDRecorded: the schema's owner (the operator's role, no
// superuser) reads the server's system identifier, and the commit trigger,
// run for the worker role's writes, records it beside the timeline.
func assertSystemIDRecorded(t *testing.T, superDSN, topology string) {
	t.Helper()
	ctx := context.Background()
	conn := connectAs(t, superDSN)
	var recorded, server *int64
	if err := conn.QueryRow(ctx, `SELECT r.system_id, (SELECT system_identifier FROM pg_control_system())
		FROM shardkeeper.registry_seq r WHERE r.topology = $1`, topology).Scan(&recorded, &server); err != nil {
		t.Fatalf("read the recorded system identifier: %v", err)
	}
	if recorded == nil || server == nil || *recorded != *server {
		t.Fatalf("recorded system identifier %v, server's %v: want the server's, recorded through the operator-owned function", recorded, server)
	}
}

// assertSchemaOwner checks that the operator role, not the superuser,
// created the schema's tables: otherwise the default privileges the
// README sets (FOR ROLE shardkeeper_operator) would not be what this test
// exercised.
func assertSchemaOwner(t *testing.T, superDSN, role string) {
	t.Helper()
	ctx := context.Background()
	conn := connectAs(t, superDSN)
	var others []string
	rows, err := conn.Query(ctx, `SELECT tablename || ' (' || tableowner || ')' FROM pg_tables
		WHERE schemaname = 'shardkeeper' AND tableowner <> $1 ORDER BY 1`, role)
	if err != nil {
		t.Fatal(err)
	}
	if others, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(others) > 0 {
		t.Fatalf("tables not owned by %s: %v", role, others)
	}
}

// assertRenewsAndReports waits until member's lease moved on (a renewal
// committed) and it reported activity for unit.
func assertRenewsAndReports(t *testing.T, f *fleettest.Fleet, member, unit string) {
	t.Helper()
	ctx := context.Background()
	snap, err := f.Registry.Snapshot(ctx, f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	m := snap.Member(member)
	if m == nil {
		t.Fatalf("%s has no member row", member)
	}
	joined := m.LeaseExpiresAt
	fleettest.Eventually(t, 10*time.Second, func() error {
		snap, err := f.Registry.Snapshot(ctx, f.Topology)
		if err != nil {
			return err
		}
		if m := snap.Member(member); !m.Live || !m.LeaseExpiresAt.After(joined) {
			return fmt.Errorf("%s's lease not renewed yet: %+v", member, *m)
		}
		return nil
	})
	fleettest.Eventually(t, 10*time.Second, func() error {
		acts, err := f.Registry.Activity(ctx, f.Topology)
		if err != nil {
			return err
		}
		for _, a := range acts {
			if a.Member == member && a.Unit == unit {
				return nil
			}
		}
		return fmt.Errorf("no activity report of %s for %s yet: %+v", member, unit, acts)
	})
}

// assertWorkerRoleRefused tries, as the worker role, every way to write
// as the operator, each in a transaction rolled back afterwards, and
// wants each refused for lack of privilege. Where a token applies, the
// worker presents the current one (the number is no secret: refusals
// print it).
func assertWorkerRoleRefused(t *testing.T, f *fleettest.Fleet, workerDSN string, current int64) {
	ctx := context.Background()
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: workerDSN, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := reg.TakeOperatorToken(ctx, f.Topology, "forger"); !isDenied(err) {
		t.Errorf("TakeOperatorToken as the worker role: %v, want permission denied", err)
	}
	conn := connectAs(t, workerDSN)
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != "shardkeeper_worker" {
		t.Fatalf("the worker DSN connects as %q (%v), want shardkeeper_worker", user, err)
	}
	forge := fmt.Sprintf("SELECT set_config('shardkeeper.operator_token', '%d', true)", current)
	for _, c := range []struct {
		name  string
		stmts []string
	}{
		{"read the operator's token", []string{`SELECT epoch FROM shardkeeper.operator_tokens WHERE topology = $1`}},
		{"raise the operator's token", []string{`UPDATE shardkeeper.operator_tokens SET epoch = epoch + 1 WHERE topology = $1`}},
		{"replace the operator's token", []string{`INSERT INTO shardkeeper.operator_tokens (topology, epoch, holder, taken_at)
			VALUES ($1, 1000, 'forger', now()) ON CONFLICT (topology) DO UPDATE SET epoch = 1000, holder = 'forger'`}},
		{"delete the operator's token", []string{`DELETE FROM shardkeeper.operator_tokens WHERE topology = $1`}},
		{"fence as the operator", []string{fmt.Sprintf(`SELECT shardkeeper.operator_fence($1, %d)`, current)}},
		{"recover as the operator", []string{fmt.Sprintf(`SELECT shardkeeper.operator_recover_fence($1, %d, 'forger', 1)`, current)}},
		{"retire the active epoch", []string{`UPDATE shardkeeper.epochs SET state = 'retired', retired_at = now() WHERE topology = $1 AND state = 'active'`}},
		{"retire the active epoch under the current token", []string{forge,
			`UPDATE shardkeeper.epochs SET state = 'retired', retired_at = now() WHERE topology = $1 AND state = 'active'`}},
		{"create a pending epoch under the current token", []string{forge, `INSERT INTO shardkeeper.epochs
			(topology, epoch, partitions, shards, state, created_at) VALUES ($1, 1000, 1, 4, 'pending', now())`}},
		{"delete the epochs", []string{`DELETE FROM shardkeeper.epochs WHERE topology = $1`}},
		{"delete the topology", []string{`DELETE FROM shardkeeper.topologies WHERE topology = $1`}},
		{"drain a member under the current token", []string{forge,
			`UPDATE shardkeeper.members SET draining = true WHERE topology = $1 AND member = 'a'`}},
		{"add to the retiring set under the current token", []string{forge,
			`INSERT INTO shardkeeper.retiring_units (topology, unit) VALUES ($1, '0.0')`}},
		{"clear the retiring set", []string{`DELETE FROM shardkeeper.retiring_units WHERE topology = $1`}},
		{"allow RESET under the current token", []string{forge, `INSERT INTO shardkeeper.reset_permissions
			(topology, allowed, census_taken_at, reason, published_at) VALUES ($1, true, now(), 'forged', now())
			ON CONFLICT (topology) DO UPDATE SET allowed = true, reason = 'forged'`}},
		{"clear the registry's behind gate", []string{`UPDATE shardkeeper.registry_seq SET behind_reason = NULL, behind_seen = 0 WHERE topology = $1`}},
		{"lower the registry's sequence", []string{`UPDATE shardkeeper.registry_seq SET seq = 0 WHERE topology = $1`}},
		{"delete the registry's sequence", []string{`DELETE FROM shardkeeper.registry_seq WHERE topology = $1`}},
		{"write an order barrier under the current token", []string{forge, `INSERT INTO shardkeeper.order_barriers
			(topology, epoch, from_shards, to_shards, partition, predecessor, before_seq) VALUES ($1, 1, 4, 8, 0, 1, 0)`}},
		{"lift the order barrier", []string{`UPDATE shardkeeper.order_barriers SET lifted_at = now() WHERE topology = $1`}},
		{"delete the order barrier", []string{`DELETE FROM shardkeeper.order_barriers WHERE topology = $1`}},
		{"rewrite the migration record", []string{`DELETE FROM shardkeeper.schema_migrations WHERE version >= 8`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var last error
			for _, s := range c.stmts {
				args := []any{}
				if strings.Contains(s, "$1") {
					args = append(args, f.Topology)
				}
				if _, last = tx.Exec(ctx, s, args...); last != nil {
					break
				}
			}
			if !isDenied(last) {
				t.Errorf("as the worker role: %v, want permission denied (42501)", last)
			}
		})
	}
}

// isDenied reports a PostgreSQL refusal for lack of privilege.
func isDenied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

func isOperatorFenced(err error) bool {
	_, ok := poolctl.OperatorFenced(err)
	return ok
}

// privilegeWatch sits between the SDK and the registry and records every
// call refused for lack of privilege: the SDK retries a failed call, so a
// refusal would otherwise show only as a slow test, or not at all.
type privilegeWatch struct {
	mu      sync.Mutex
	n       int
	refused []string
}

// arm puts the watch under a worker's registry (startArmedSDK's arm).
func (w *privilegeWatch) arm(r *faultyRegistry) {
	r.Registry = &watchedRegistry{Registry: r.Registry, w: w}
}

func (w *privilegeWatch) note(call string, errs ...error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	for _, err := range errs {
		if isDenied(err) {
			w.refused = append(w.refused, fmt.Sprintf("%s: %v", call, err))
		}
	}
}

func (w *privilegeWatch) refusals() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.refused...)
}

func (w *privilegeWatch) calls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// watchedRegistry reports each call the SDK makes to its watch.
type watchedRegistry struct {
	poolctl.Registry
	w *privilegeWatch
}

func (r *watchedRegistry) Rejoin(ctx context.Context, m poolctl.MemberRef, process string) (poolctl.Lease, error) {
	l, err := r.Registry.Rejoin(ctx, m, process)
	r.w.note("Rejoin", err)
	return l, err
}

func (r *watchedRegistry) Renew(ctx context.Context, m poolctl.MemberRef) (poolctl.Lease, error) {
	l, err := r.Registry.Renew(ctx, m)
	r.w.note("Renew", err)
	return l, err
}

func (r *watchedRegistry) Leave(ctx context.Context, m poolctl.MemberRef) error {
	err := r.Registry.Leave(ctx, m)
	r.w.note("Leave", err)
	return err
}

func (r *watchedRegistry) Fence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	err := r.Registry.Fence(ctx, m, gen)
	r.w.note("Fence", err)
	return err
}

func (r *watchedRegistry) Unfence(ctx context.Context, m poolctl.MemberRef, gen int64) error {
	err := r.Registry.Unfence(ctx, m, gen)
	r.w.note("Unfence", err)
	return err
}

func (r *watchedRegistry) ClaimMany(ctx context.Context, m poolctl.MemberRef, under int64, units []string) ([]poolctl.ClaimOutcome, error) {
	outs, err := r.Registry.ClaimMany(ctx, m, under, units)
	errs := []error{err}
	for _, o := range outs {
		errs = append(errs, o.Err)
	}
	r.w.note("ClaimMany", errs...)
	return outs, err
}

func (r *watchedRegistry) ReleaseMany(ctx context.Context, tokens []poolctl.Token) ([]error, error) {
	errs, err := r.Registry.ReleaseMany(ctx, tokens)
	r.w.note("ReleaseMany", append([]error{err}, errs...)...)
	return errs, err
}

func (r *watchedRegistry) ConfirmOwned(ctx context.Context, m poolctl.MemberRef, expected map[string]int64) (poolctl.Confirmation, error) {
	c, err := r.Registry.ConfirmOwned(ctx, m, expected)
	r.w.note("ConfirmOwned", err)
	return c, err
}

func (r *watchedRegistry) AckFreeze(ctx context.Context, m poolctl.MemberRef, epoch int64) error {
	err := r.Registry.AckFreeze(ctx, m, epoch)
	r.w.note("AckFreeze", err)
	return err
}

func (r *watchedRegistry) ReportActivity(ctx context.Context, m poolctl.MemberRef, units []poolctl.UnitActivity) error {
	err := r.Registry.ReportActivity(ctx, m, units)
	r.w.note("ReportActivity", err)
	return err
}

func (r *watchedRegistry) Snapshot(ctx context.Context, topology string) (poolctl.Snapshot, error) {
	s, err := r.Registry.Snapshot(ctx, topology)
	r.w.note("Snapshot", err)
	return s, err
}

// connectAs opens one connection on dsn, closed when the test ends.
func connectAs(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}
