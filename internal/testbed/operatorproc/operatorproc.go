// Package operatorproc runs the operator binary (the module's main
// package) as a separate process for tests: built once per test binary,
// started with a kubeconfig and flags, killed with a real signal and
// started again, so a test can crash the operator in the middle of a step
// the way a failing node does. A supervisor restarts it when it exits on
// its own (losing leader election ends the process), as a Deployment's
// kubelet would, and counts those exits.
//
// It owns the process's lifecycle only; what the operator does is the code
// under test.
package operatorproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds the operator (the module root's main package) once per
// test binary and returns its path. The Go build cache makes later builds
// of an unchanged tree a link step.
func Binary() (string, error) {
	buildOnce.Do(func() { binPath, buildErr = build() })
	return binPath, buildErr
}

func build() (string, error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "shardkeeper-operator-bin-")
	if err != nil {
		return "", fmt.Errorf("create operator build directory: %w", err)
	}
	bin := filepath.Join(dir, "shardkeeper")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the operator: %w\n%s", err, out)
	}
	return bin, nil
}

// Options say how to run the operator.
type Options struct {
	// Kubeconfig is the path of the kubeconfig it reaches the API server
	// with (passed as KUBECONFIG).
	Kubeconfig string
	// Args are its flags.
	Args []string
	// LogPath receives its output, over all its starts.
	LogPath string
}

// Proc is the operator process, across its restarts.
type Proc struct {
	opts Options
	bin  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	starts   int
	expected bool // the test ended the current process on purpose
	// unexpected lists how each process that ended on its own ended.
	unexpected []string
}

// New builds the binary if needed and prepares a process; Start runs it.
func New(o Options) (*Proc, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	return &Proc{opts: o, bin: bin}, nil
}

// Start runs a new operator process. It returns once the process started;
// the operator then waits for the leader election lease (a predecessor
// killed without stepping down holds it for the lease duration).
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return errors.New("start operator: already running")
	}
	logf, err := os.OpenFile(p.opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open operator log: %w", err)
	}
	p.starts++
	fmt.Fprintf(logf, "=== operatorproc: start %d at %s\n", p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.opts.Args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.opts.Kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The operator dies with the test binary, even if the test crashes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start operator: %w", err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected = cmd, done, false
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== operatorproc: process %d ended at %s: %v\n", cmd.Process.Pid, time.Now().Format(time.RFC3339Nano), err)
		logf.Close()
		p.mu.Lock()
		if !p.expected {
			p.unexpected = append(p.unexpected, fmt.Sprintf("process %d: %v", cmd.Process.Pid, err))
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Signal sends sig to the running process and, for signals that end it,
// marks the end as the test's doing.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return errors.New("signal operator: not running")
	}
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.expected = true
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Proc) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.Done()
	return nil
}

// Stop sends SIGTERM and waits up to timeout, then kills.
func (p *Proc) Stop(timeout time.Duration) {
	if p.Signal(syscall.SIGTERM) != nil {
		return
	}
	select {
	case <-p.Done():
	case <-time.After(timeout):
		_ = p.Kill()
	}
}

// Done is closed when the current process ends.
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// Running reports whether a process is running now.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Pid is the current (or last) process's id, 0 before the first start.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Starts counts the processes started so far.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// UnexpectedExits says how each process that ended without the test's
// signal ended.
func (p *Proc) UnexpectedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unexpected...)
}

// Log returns everything the operator wrote, over all its starts.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.opts.LogPath)
	return string(b)
}

// LogTail is the last n lines of the log.
func (p *Proc) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Supervise restarts the operator after every exit the test did not cause,
// a second later, until ctx ends; then it stops the operator.
func (p *Proc) Supervise(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			p.Stop(10 * time.Second)
			return
		case <-p.Done():
		}
		p.mu.Lock()
		restart := !p.expected
		p.mu.Unlock()
		if !restart {
			// The test ended it and starts it again itself; look again
			// shortly.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case <-ctx.Done():
			continue
		case <-time.After(time.Second):
		}
		_ = p.Start()
	}
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
