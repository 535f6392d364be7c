package fleettest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

// Worker is one reference worker process.
type Worker struct {
	Name string
	// Addr serves /readyz, /status and /metrics.
	Addr    string
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{}
}

// Env is the environment a reference worker of this fleet needs, apart
// from its health address.
func (f *Fleet) Env(member string) []string {
	urls := make([]string, 0, len(f.NATS.URLs()))
	for _, u := range f.NATS.URLs() {
		urls = append(urls, natstest.UserURL(u, natstest.AppUser, natstest.AppPassword))
	}
	return []string{
		"SHARDKEEPER_TOPOLOGY=" + f.Topology,
		"POD_NAME=" + member,
		// Every server, so a worker starting while one is down connects
		// to another.
		"NATS_URL=" + strings.Join(urls, ","),
		"REGISTRY_DSN=" + f.ClientDSN,
		"SUBJECT_PREFIX=" + f.Layout.SubjectPrefix,
		"WORKER_HISTORY_DIR=" + f.HistoryDir,
	}
}

// StartWorker starts a reference worker process named member.
func (f *Fleet) StartWorker(member string) *Worker {
	f.T.Helper()
	return f.StartWorkerWith(member)
}

// StartWorkerWith starts a reference worker process named member with
// extra environment variables ("NAME=value"), e.g. its test knobs.
func (f *Fleet) StartWorkerWith(member string, env ...string) *Worker {
	f.T.Helper()
	port, err := testbed.FreePort()
	if err != nil {
		f.T.Fatal(err)
	}
	w := &Worker{Name: member, Addr: fmt.Sprintf("127.0.0.1:%d", port), exited: make(chan struct{})}
	w.LogPath = filepath.Join(os.TempDir(), fmt.Sprintf("shardkeeper-%s-%d.log", member, time.Now().UnixNano()))
	logf, err := os.Create(w.LogPath)
	if err != nil {
		f.T.Fatal(err)
	}
	w.cmd = exec.Command(WorkerBinary(f.T), "--drain-timeout", f.Opts.DrainTimeout.String(), "-v", "1")
	w.cmd.Env = append(os.Environ(), f.Env(member)...)
	w.cmd.Env = append(w.cmd.Env, "WORKER_HEALTH_ADDR="+w.Addr)
	w.cmd.Env = append(w.cmd.Env, env...)
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		f.T.Fatalf("start worker %s: %v", member, err)
	}
	go func() { _ = w.cmd.Wait(); logf.Close(); close(w.exited) }()
	f.mu.Lock()
	f.workers[member] = w
	f.mu.Unlock()
	f.T.Cleanup(func() {
		if f.T.Failed() {
			f.T.Logf("log of worker %s:\n%s", member, tail(w.Log(), 60))
		}
	})
	return w
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Workers returns the workers started so far that have not exited.
func (f *Fleet) Workers() []*Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Worker
	for _, w := range f.workers {
		if !w.Exited() {
			out = append(out, w)
		}
	}
	return out
}

// Exited reports whether the process has ended.
func (w *Worker) Exited() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process (SIGKILL, SIGSTOP, SIGCONT, SIGTERM).
func (w *Worker) Signal(sig syscall.Signal) error { return w.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to timeout for a clean exit, returning
// the exit error (nil after a clean handover and leave).
func (w *Worker) Stop(timeout time.Duration) error {
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
		if code := w.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("worker %s exited with status %d", w.Name, code)
		}
		return nil
	case <-time.After(timeout):
		_ = w.cmd.Process.Kill()
		<-w.exited
		return fmt.Errorf("worker %s did not stop within %s", w.Name, timeout)
	}
}

// Log returns what the worker printed.
func (w *Worker) Log() string {
	b, _ := os.ReadFile(w.LogPath)
	return string(b)
}

// Status asks the worker for its state.
func (w *Worker) Status(ctx context.Context) (worker.Status, error) { return StatusOf(ctx, w.Addr) }

// StatusOf asks the worker serving at addr for its state.
func StatusOf(ctx context.Context, addr string) (worker.Status, error) {
	var s worker.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// StopAll kills every worker still running.
func (f *Fleet) StopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.workers {
		if !w.Exited() {
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
	}
}
