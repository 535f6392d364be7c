package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// FileRecorder appends one JSON line per record to a file of its own, with
// one write(2) per record and no user-space buffering. A record is in the
// kernel's page cache once Record returns, so it survives the process being
// SIGKILLed a moment later: exactly the death the checker must see through.
// (It does not survive the machine losing power; nothing here needs that.)
//
// The file is opened O_APPEND, so concurrent Records never interleave within
// a line. The first line is a KindClock record.
type FileRecorder struct {
	f    *os.File
	path string
	bufs sync.Pool // *[]byte, so Record does not allocate

	mu     sync.Mutex
	err    error // first write error, returned by Close
	lost   int64 // records not written because of errors
	closed bool
}

// NewFileRecorder creates dir if needed and a new file in it named
// "<member>-<pid>-<mono>.jsonl", where mono is Now at creation, so a member's
// restarts (new pid, later mono) never share a file. It writes the clock
// record before it returns.
func NewFileRecorder(dir, member string) (*FileRecorder, error) {
	if member == "" {
		return nil, errors.New("new history recorder: empty member name")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("new history recorder: %w", err)
	}
	clock := clockRecord(member)
	name := fileSafe(member) + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(clock.Start, 10) + fileExt
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("new history recorder: %w", err)
	}
	r := &FileRecorder{f: f, path: path}
	r.bufs.New = func() any { b := make([]byte, 0, 256); return &b }
	r.Record(clock)
	if err := r.firstErr(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("new history recorder %s: %w", path, err)
	}
	return r, nil
}

// fileExt is the extension of history files; ReadDir reads only these.
const fileExt = ".jsonl"

// fileSafe keeps a member name from escaping dir or hiding the file.
func fileSafe(member string) string {
	return strings.NewReplacer("/", "_", string(filepath.Separator), "_", "\x00", "_").Replace(member)
}

// Record writes r as one line with one write(2). It never returns an error,
// because the delivery path has nobody to hand it to; the first error is kept
// for Close. Records after Close are dropped.
func (r *FileRecorder) Record(rec Record) {
	bp := r.bufs.Get().(*[]byte)
	b := append(appendRecord((*bp)[:0], rec), '\n')
	// os.File.Write issues one write(2) for a regular file and loops only on
	// a short write, which for a regular file means the disk is full.
	_, err := r.f.Write(b)
	*bp = b
	r.bufs.Put(bp)
	if err != nil {
		r.fail(err)
	}
}

// fail keeps the first error and counts lost records, ignoring those caused
// by a Record racing Close.
func (r *FileRecorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed && errors.Is(err, os.ErrClosed) {
		return
	}
	r.lost++
	if r.err == nil {
		r.err = err
	}
}

func (r *FileRecorder) firstErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close closes the file. It reports the first write error, if any, with the
// number of records lost to errors: a history with holes must not pass as
// complete evidence.
func (r *FileRecorder) Close() error {
	r.mu.Lock()
	r.closed = true
	werr, lost := r.err, r.lost
	r.mu.Unlock()
	cerr := r.f.Close()
	if werr != nil {
		return fmt.Errorf("history %s: %d records lost: %w", r.path, lost, werr)
	}
	if cerr != nil {
		return fmt.Errorf("close history %s: %w", r.path, cerr)
	}
	return nil
}

// Path returns the file's path.
func (r *FileRecorder) Path() string { return r.path }
