package sim

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Summary is what a batch of seeds found.
type Summary struct {
	Seeds    int
	Events   int64
	Injected map[FaultKind]int64
	// Failed holds the failing seeds' results, by seed (at most
	// Sweep.KeepFailures of them).
	Failed   []Result
	Failures int
	Elapsed  time.Duration
	// FirstFailing is the lowest failing seed, -1 when none failed.
	FirstFailing int64
}

// Sweep runs a range of seeds.
type Sweep struct {
	From, Count int64
	// Config is the template: Seed is set per run.
	Config Config
	// Workers defaults to GOMAXPROCS.
	Workers int
	// StopAtFirst stops handing out seeds once one failed (mutation
	// runs: they want the first failing seed).
	StopAtFirst bool
	// KeepFailures bounds Failed (default 10).
	KeepFailures int
}

// Run runs the sweep's seeds in parallel. Each seed's run is independent
// and deterministic, so the result does not depend on Workers, except
// that StopAtFirst may run a few seeds past the first failure.
func (sw Sweep) Run() Summary {
	// Runs allocate small, short-lived objects at a high rate; a larger
	// heap goal halves the collector's share of the CPU.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	workers := sw.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	keep := sw.KeepFailures
	if keep <= 0 {
		keep = 10
	}
	start := time.Now()
	var next, events atomic.Int64
	var stop atomic.Bool
	next.Store(sw.From)
	var mu sync.Mutex
	sum := Summary{Injected: map[FaultKind]int64{}, FirstFailing: -1}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[FaultKind]int64{}
			n := 0
			var failed []Result
			for !stop.Load() {
				seed := next.Add(1) - 1
				if seed >= sw.From+sw.Count {
					break
				}
				cfg := sw.Config
				cfg.Seed = seed
				r := Run(cfg)
				n++
				events.Add(int64(r.Events))
				for k, v := range r.Injected {
					local[k] += int64(v)
				}
				if r.Failed() {
					r.Trace = nil
					failed = append(failed, r)
					if sw.StopAtFirst {
						stop.Store(true)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			sum.Seeds += n
			for k, v := range local {
				sum.Injected[k] += v
			}
			sum.Failed = append(sum.Failed, failed...)
		}()
	}
	wg.Wait()
	sort.Slice(sum.Failed, func(i, j int) bool { return sum.Failed[i].Seed < sum.Failed[j].Seed })
	sum.Failures = len(sum.Failed)
	if len(sum.Failed) > 0 {
		sum.FirstFailing = sum.Failed[0].Seed
	}
	if len(sum.Failed) > keep {
		sum.Failed = sum.Failed[:keep]
	}
	sum.Events = events.Load()
	sum.Elapsed = time.Since(start)
	return sum
}

// String is the sweep's report: seeds run, faults injected by kind,
// violations.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seeds run: %d in %s (%d events, %.0f seeds/s)\n", s.Seeds, s.Elapsed.Round(time.Millisecond),
		s.Events, float64(s.Seeds)/s.Elapsed.Seconds())
	fmt.Fprintf(&b, "faults injected:")
	for _, k := range FaultKinds {
		fmt.Fprintf(&b, " %s=%d", k, s.Injected[k])
	}
	fmt.Fprintf(&b, "\nfailing seeds: %d\n", s.Failures)
	for _, r := range s.Failed {
		fmt.Fprintf(&b, "  seed %d: %s\n", r.Seed, r.First())
	}
	return b.String()
}
