package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is one nats-server running as a separate process, from a binary of
// any version (see Binary). Its standard output and error go to LogPath, so
// a panic stays readable after the process died.
type Proc struct {
	Config  ServerConfig
	Binary  string
	LogPath string

	confPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	starts  int
}

// NewProc writes cfg to dir and prepares a process of bin; Start runs it.
func NewProc(bin string, cfg ServerConfig, dir string) (*Proc, error) {
	conf := filepath.Join(dir, cfg.Name+".conf")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create directory for %s: %w", cfg.Name, err)
	}
	if err := os.WriteFile(conf, []byte(cfg.Render()), 0o600); err != nil {
		return nil, fmt.Errorf("write configuration of %s: %w", cfg.Name, err)
	}
	return &Proc{Config: cfg, Binary: bin, LogPath: filepath.Join(dir, cfg.Name+".log"), confPath: conf}, nil
}

// StartProc starts a server process for the test, waits until it accepts
// client connections, and kills it when the test ends.
func StartProc(tb testing.TB, bin string, cfg ServerConfig, dir string) *Proc {
	tb.Helper()
	p, err := NewProc(bin, cfg, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Kill)
	if err := p.Start(20 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Start runs the process (again, after it stopped) and waits until its
// client port accepts connections. If the process exits first, Start
// returns an error that quotes the end of its log.
func (p *Proc) Start(timeout time.Duration) error {
	p.mu.Lock()
	if p.cmd != nil && !p.exitedLocked() {
		p.mu.Unlock()
		return fmt.Errorf("start %s: already running", p.Config.Name)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("open log of %s: %w", p.Config.Name, err)
	}
	p.starts++
	fmt.Fprintf(logf, "=== natstest: start %d of %s (%s)\n", p.starts, p.Config.Name, p.Binary)
	cmd := exec.Command(p.Binary, "-c", p.confPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.mu.Unlock()
		return fmt.Errorf("start %s: %w", p.Config.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.waitErr = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()

	addr := fmt.Sprintf("127.0.0.1:%d", p.Config.Port)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("server %s exited while starting (%v): %s", p.Config.Name, p.ExitErr(), p.LogTail(20))
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("server %s not accepting connections on %s within %s: %s", p.Config.Name, addr, timeout, p.LogTail(20))
}

func (p *Proc) exitedLocked() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the current process exits.
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Running says whether the current process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.exitedLocked()
}

// ExitErr is how the last process ended (nil while running or after a
// clean exit).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Log returns everything the server wrote, over all its starts.
func (p *Proc) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	return string(b)
}

// LogTail returns the last n lines of the log.
func (p *Proc) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop asks the server to shut down (SIGTERM) and kills it if it has not
// exited within the timeout.
func (p *Proc) Stop(timeout time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// Kill kills the server (SIGKILL) and waits for it to exit.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return
	}
	<-done
}

// URL is the server's client URL, without credentials.
func (p *Proc) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.Config.Port) }
