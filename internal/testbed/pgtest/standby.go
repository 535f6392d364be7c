package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewStandby is StartStandby for a test: it fails the test on error and
// stops the standby when the test ends.
func (s *Server) NewStandby(tb testing.TB, from string) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := s.StartStandby(ctx, from)
	if err != nil {
		tb.Fatalf("start PostgreSQL standby: %v", err)
	}
	tb.Cleanup(st.Stop)
	return st
}

// StartStandby makes an asynchronous streaming standby of s, as a platform
// team would: pg_basebackup -R (which writes primary_conninfo and
// standby.signal) into a new data directory, started on its own port. It
// is a hot standby: it answers reads, and Promote makes it a primary.
//
// from is the address (host:port) it replicates from: s's own, or a proxy
// in front of s, which lets a test stop the WAL stream (faultproxy's Hold)
// so the standby lags by exactly the commits made meanwhile. Pausing
// replay alone does not make it lag at a failover: promotion applies
// every WAL record the standby has received.
func (s *Server) StartStandby(ctx context.Context, from string) (*Server, error) {
	host, port, err := net.SplitHostPort(from)
	if err != nil {
		return nil, fmt.Errorf("standby source %q: want host:port: %w", from, err)
	}
	bin, cred, dir, err := newDataDir("shardkeeper-pg-standby-")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"),
		"-h", host, "-p", port, "-U", "postgres",
		"-D", filepath.Join(dir, "data"), "-R", "-X", "stream", "--no-sync", "-c", "fast")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	st, err := startServer(ctx, bin, dir, cred)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return st, nil
}

// Kill ends the server the way a crashed host does: SIGKILL to the
// postmaster and every process it started, no shutdown checkpoint.
func (s *Server) Kill() error {
	err := s.SignalAll(syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("postmaster %d still running 30s after SIGKILL", s.Pid())
	}
	return err
}

// Promote makes a standby a primary (pg_promote, waiting for it to
// finish). A paused replay is promoted where it paused: the WAL received
// after the pause is not applied, as with a standby that lagged.
func (s *Server) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("promote standby: %w", err)
	}
	if !ok {
		return fmt.Errorf("promote standby: pg_promote did not finish within 60s")
	}
	return nil
}

// Restart starts a server again on the data directory of s after it
// stopped (Kill): PostgreSQL runs crash recovery and comes up as a
// primary on a new port, with every commit s had acknowledged (with
// synchronous_commit on; off leaves the last WAL buffers to chance). A
// failover test reads from it what the lost primary had issued, which the
// promoted standby never got. The directory stays s's, removed by s.Stop
// after the restarted server's own Stop.
func (s *Server) Restart(ctx context.Context) (*Server, error) {
	select {
	case <-s.done:
	default:
		return nil, fmt.Errorf("restart PostgreSQL: postmaster %d is still running", s.Pid())
	}
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	st, err := startServer(ctx, bin, s.dir, cred)
	if err != nil {
		return nil, fmt.Errorf("restart PostgreSQL on %s: %w", s.dir, err)
	}
	return st, nil
}
