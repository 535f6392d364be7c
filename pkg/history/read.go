package history

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Process is one file's records: one process's history.
type Process struct {
	// Name is the file's stem, "<member>-<pid>-<mono>".
	Name string
	// Records are in the order the process wrote them; the first is the
	// KindClock record.
	Records []Record
	// MonoToWall is what to add to a monotonic ns of this process to get wall
	// ns, from the clock record.
	MonoToWall int64
	// Truncated says the file ended in a partial line that was dropped: the
	// process died in the middle of a write.
	Truncated bool
}

// WallTime converts a monotonic reading of the process to wall time.
func (p Process) WallTime(mono int64) time.Time {
	return time.Unix(0, mono+p.MonoToWall)
}

// ReadDir reads every history file (*.jsonl) in dir, in name order. A last
// line without its newline that does not parse is dropped (the process was
// killed mid-write) and marks the Process Truncated; any other line that
// does not parse is an error naming the file and line. A file with no
// complete record is skipped: its process died before NewFileRecorder
// returned, so it cannot have recorded anything.
func ReadDir(dir string) ([]Process, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read history dir: %w", err)
	}
	var out []Process
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), fileExt) {
			continue
		}
		p, err := ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if len(p.Records) > 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

// ReadFile reads one history file with the rules of ReadDir.
func ReadFile(path string) (Process, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Process{}, fmt.Errorf("read history: %w", err)
	}
	p := Process{Name: strings.TrimSuffix(filepath.Base(path), fileExt)}
	for line := 1; len(data) > 0; line++ {
		text, rest, complete := bytes.Cut(data, []byte{'\n'})
		data = rest
		var r Record
		if err := json.Unmarshal(text, &r); err != nil {
			if !complete {
				p.Truncated = true
				break
			}
			return Process{}, fmt.Errorf("read %s line %d: %w", path, line, err)
		}
		if line == 1 && r.Kind != KindClock {
			return Process{}, fmt.Errorf("read %s line 1: first record is %q, want %q", path, r.Kind, KindClock)
		}
		p.Records = append(p.Records, r)
	}
	if len(p.Records) > 0 {
		p.MonoToWall = p.Records[0].Wall - p.Records[0].Start
	}
	return p, nil
}
