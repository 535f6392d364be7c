package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuByRole is CPU time in clock ticks (USER_HZ, 100 a second on Linux)
// used so far by the processes a delivery round runs on: the NATS
// server, PostgreSQL (every backend and helper) and this process (the
// consumers, SDK or plain). Row c samples it around each drain, so the
// row can say where each side's extra CPU went, not only that it ran
// slower.
type cpuByRole struct {
	server, registry, client int64
}

func (c cpuByRole) minus(o cpuByRole) cpuByRole {
	return cpuByRole{server: c.server - o.server, registry: c.registry - o.registry, client: c.client - o.client}
}

func (c cpuByRole) plus(o cpuByRole) cpuByRole {
	return cpuByRole{server: c.server + o.server, registry: c.registry + o.registry, client: c.client + o.client}
}

// sampleCPU reads /proc/<pid>/stat of every process. A process that
// exits between the listing and the read is skipped: PostgreSQL backends
// come and go with connections, and those that exited within a drain are
// not counted (the SDK's registry pool keeps its connections open).
func sampleCPU() (cpuByRole, error) {
	var c cpuByRole
	self := os.Getpid()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return c, err
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, ticks, ok := procTicks(d)
		if !ok {
			continue
		}
		switch {
		case pid == self:
			c.client += ticks
		case comm == "nats-server":
			c.server += ticks
		case comm == "postgres":
			c.registry += ticks
		}
	}
	return c, nil
}

// procTicks is a process's command name and its user + system ticks,
// from /proc/<pid>/stat (fields 14 and 15, after the parenthesised name,
// which may hold spaces).
func procTicks(dir string) (comm string, ticks int64, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	fields := strings.Fields(s[closing+1:])
	if len(fields) < 13 {
		return "", 0, false
	}
	// fields[0] is the state (stat field 3): utime is field 14, stime 15.
	u, err1 := strconv.ParseInt(fields[11], 10, 64)
	k, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return s[open+1 : closing], u + k, true
}

// perRows says c as CPU milliseconds per 100,000 rows for drains of rows
// rows each, n drains.
func (c cpuByRole) perRows(rows, n int) string {
	per := func(ticks int64) float64 { return float64(ticks) * 10 / float64(rows*n) * 100_000 }
	return fmt.Sprintf("server %.0f ms, registry %.0f ms, this process %.0f ms", per(c.server), per(c.registry), per(c.client))
}
