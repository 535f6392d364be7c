package sim

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Shrink makes a failing run's configuration smaller while it still
// fails: it turns fault kinds off one by one, then leaves out planned
// fault instances one by one, then per-message faults (lost or delayed
// requests and replies) one by one, up to budget runs. The result is a
// configuration that still fails, with its trace.
func Shrink(cfg Config, budget int) (Config, Result) {
	cfg.Disabled = maps.Clone(cfg.Disabled)
	if cfg.Disabled == nil {
		cfg.Disabled = map[FaultKind]bool{}
	}
	cfg.Skip = maps.Clone(cfg.Skip)
	if cfg.Skip == nil {
		cfg.Skip = map[int]bool{}
	}
	cfg.Trace = false
	best := Run(cfg)
	if !best.Failed() {
		return cfg, best
	}
	runs := 0
	try := func(change func(*Config), undo func(*Config)) {
		if runs >= budget {
			return
		}
		runs++
		change(&cfg)
		if r := Run(cfg); r.Failed() {
			best = r
			return
		}
		undo(&cfg)
	}
	for _, k := range best.Enabled {
		try(func(c *Config) { c.Disabled[k] = true }, func(c *Config) { delete(c.Disabled, k) })
	}
	for i := range best.Planned {
		key := -(i + 1)
		try(func(c *Config) { c.Skip[key] = true }, func(c *Config) { delete(c.Skip, key) })
	}
	for n := best.FaultOrdinals; n >= 1; n-- {
		try(func(c *Config) { c.Skip[n] = true }, func(c *Config) { delete(c.Skip, n) })
	}
	cfg.Trace = true
	return cfg, Run(cfg)
}

// ReplayArgs are the test flags that replay cfg.
func ReplayArgs(cfg Config) string {
	args := []string{"-seed", strconv.FormatInt(cfg.Seed, 10)}
	if cfg.Mutation != "" {
		args = append(args, "-mutation", cfg.Mutation)
	}
	var kinds []string
	for k, on := range cfg.Disabled {
		if on {
			kinds = append(kinds, string(k))
		}
	}
	if len(kinds) > 0 {
		slices.Sort(kinds)
		args = append(args, "-disable", strings.Join(kinds, ","))
	}
	var skip []int
	for k, on := range cfg.Skip {
		if on {
			skip = append(skip, k)
		}
	}
	if len(skip) > 0 {
		slices.Sort(skip)
		s := make([]string, len(skip))
		for i, k := range skip {
			s[i] = strconv.Itoa(k)
		}
		args = append(args, "-skip", strings.Join(s, ","))
	}
	return strings.Join(args, " ")
}

// ParseReplay fills cfg's Disabled and Skip from the flag values ReplayArgs
// prints.
func ParseReplay(cfg *Config, disable, skip string) error {
	if disable != "" {
		cfg.Disabled = map[FaultKind]bool{}
		for _, k := range strings.Split(disable, ",") {
			if !slices.Contains(FaultKinds, FaultKind(k)) {
				return fmt.Errorf("-disable: fault kind %q is not one of %v", k, FaultKinds)
			}
			cfg.Disabled[FaultKind(k)] = true
		}
	}
	if skip != "" {
		cfg.Skip = map[int]bool{}
		for _, s := range strings.Split(skip, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("-skip: %q is not a fault ordinal (an integer): %w", s, err)
			}
			cfg.Skip[n] = true
		}
	}
	return nil
}

// Report is a failing seed's report: the replay command, the first
// violation, and the shrunk run's trace up to it (the last lines).
func Report(orig Config, first string, shrunk Config, r Result, lines int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d fails: %s\n", orig.Seed, first)
	fmt.Fprintf(&b, "replay:  go test -run 'TestSim$' ./pkg/worker/internal/sim %s\n", ReplayArgs(orig))
	fmt.Fprintf(&b, "shrunk:  go test -run 'TestSim$' ./pkg/worker/internal/sim %s\n", ReplayArgs(shrunk))
	fmt.Fprintf(&b, "shrunk run fails: %s\n", r.First())
	fmt.Fprintf(&b, "faults left after shrinking: %v\n", r.Injected)
	at := failAt(r.First())
	var kept []string
	for _, l := range r.Trace {
		var sec float64
		if _, err := fmt.Sscanf(strings.TrimSpace(l), "%fs", &sec); err == nil && time.Duration(sec*1e9) > at+time.Millisecond {
			break
		}
		if strings.Contains(l, "fetched") || strings.Contains(l, "publish ") {
			continue
		}
		kept = append(kept, l)
	}
	if len(kept) > lines {
		fmt.Fprintf(&b, "trace (last %d of %d lines):\n", lines, len(kept))
		kept = kept[len(kept)-lines:]
	} else {
		fmt.Fprintf(&b, "trace:\n")
	}
	for _, l := range kept {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}
