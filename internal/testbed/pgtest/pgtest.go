// Package pgtest starts a throwaway PostgreSQL server from the machine's
// Debian packages on a free loopback port, for tests and the demo. The data
// directory lives in a temporary folder with fsync off and is removed on
// Stop. As root, initdb and the server run as the postgres user, since
// initdb refuses to run as root.
//
// It owns the server's lifecycle only; schemas belong to their packages.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// ErrNoBinaries means the PostgreSQL server binaries are not installed.
var ErrNoBinaries = errors.New("PostgreSQL server binaries not found: run hack/deps.sh (apt-get install postgresql) or set SHARDKEEPER_PG_BIN")

// Server is one running PostgreSQL server.
type Server struct {
	// Port is the loopback TCP port it listens on.
	Port int

	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
}

// New starts a server for the test and stops it when the test ends.
func New(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx)
	if err != nil {
		tb.Fatalf("start PostgreSQL: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// newDataDir finds the server binaries and the user to run them as, and
// makes an empty data directory that user owns.
func newDataDir(prefix string) (bin string, cred *syscall.Credential, dir string, err error) {
	if bin, err = binDir(); err != nil {
		return "", nil, "", err
	}
	if cred, err = serverCredential(); err != nil {
		return "", nil, "", err
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", nil, "", fmt.Errorf("create PostgreSQL directory: %w", err)
	}
	if err = prepareDir(dir, cred); err != nil {
		os.RemoveAll(dir)
		return "", nil, "", err
	}
	return bin, cred, dir, nil
}

// Start initialises a data directory and starts a server on a free port.
func Start(ctx context.Context) (*Server, error) {
	bin, cred, dir, err := newDataDir("shardkeeper-pg-")
	if err != nil {
		return nil, err
	}
	if err := initdb(ctx, bin, dir, cred); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		s, err := startServer(ctx, bin, dir, cred)
		if err == nil {
			return s, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		// Most likely another process took the port between FreePort and
		// bind; try another.
	}
}

// DSN is a connection string for database db as the superuser postgres.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// NewDatabase creates a fresh, empty database and returns its DSN, so tests
// sharing one server do not see each other's tables.
func (s *Server) NewDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("connect to create database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.DSN(name), nil
}

// NewTestDatabase is NewDatabase named after the test, failing it on error.
// It also turns shardkeeper.test_clock on for the database, which lets tests
// move the registry's clock (poolctl's ShiftClock); production databases
// never have it, so their clock cannot be moved.
func (s *Server) NewTestDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", time.Now().UnixNano(), os.Getpid())
	ctx := context.Background()
	dsn, err := s.NewDatabase(ctx, name)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.alterDatabase(ctx, name, "SET shardkeeper.test_clock = 'on'"); err != nil {
		tb.Fatal(err)
	}
	return dsn
}

// alterDatabase runs ALTER DATABASE name <change>; it applies to sessions
// opened afterwards.
func (s *Server) alterDatabase(ctx context.Context, name, change string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("connect to alter database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" "+change); err != nil {
		return fmt.Errorf("alter database %s %s: %w", name, change, err)
	}
	return nil
}

// Pid is the postmaster's process id, for tests that pause or kill it.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Log returns what the server has written so far, for failing tests.
func (s *Server) Log() string { return s.log.String() }

// Stop shuts the server down (fast mode) and removes its data directory.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT) // in case a test paused it
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

func startServer(ctx context.Context, bin, dir string, cred *syscall.Credential) (*Server, error) {
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	log := &bytes.Buffer{}
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port),
		"-k", filepath.Join(dir, "sock"),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
		"-c", "shared_buffers=64MB",
	)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &Server{Port: port, dir: dir, cmd: cmd, done: make(chan struct{}), log: log}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.waitReady(ctx); err != nil {
		s.cmd.Process.Kill()
		<-s.done
		return nil, fmt.Errorf("%w; server log:\n%s", err, log.String())
	}
	return s, nil
}

// waitReady polls until the server accepts a connection, it exits, or ctx
// ends.
func (s *Server) waitReady(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited before accepting connections")
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func initdb(ctx context.Context, bin, dir string, cred *syscall.Credential) error {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth=trust",
		"--no-sync", "--encoding=UTF8", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

// prepareDir makes dir reachable by the server's user and creates its
// socket directory.
func prepareDir(dir string, cred *syscall.Credential) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, sub := range []string{"data", "sock"} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return fmt.Errorf("chown %s to postgres: %w", p, err)
			}
		}
	}
	return nil
}

// serverCredential is the postgres user's when running as root (initdb
// refuses root), nil otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the postgres user (apt-get install postgresql): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// binDir finds the server binaries: $SHARDKEEPER_PG_BIN, else the newest
// /usr/lib/postgresql/<major>/bin.
func binDir() (string, error) {
	if d := os.Getenv("SHARDKEEPER_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			return "", fmt.Errorf("SHARDKEEPER_PG_BIN=%s: %w", d, ErrNoBinaries)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// SignalAll sends sig to the postmaster and every process it started
// (backends, checkpointer, walwriter...): SIGSTOP on all of them is a hung
// server, whose sockets accept but never answer; SIGCONT resumes it. The
// children are read from /proc, so this works on Linux only.
func (s *Server) SignalAll(sig syscall.Signal) error {
	pids := []int{s.Pid()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", s.Pid(), s.Pid()))
	if err != nil {
		return fmt.Errorf("list the postmaster's children: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("signal %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}
