package fleettest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// SinkWrite is one write of a row as the reference worker's append-only
// sink recorded it.
type SinkWrite struct {
	ID        string
	Unit      string
	Member    string
	Epoch     int64
	WrittenAt time.Time
}

// Sink reads every write of the reference workers' sink, in write order.
func (f *Fleet) Sink(ctx context.Context) ([]SinkWrite, error) {
	w, err := ReadSink(ctx, f.DSN)
	return ownRows(w, f.Opts.RowPrefix), err
}

// ownRows keeps the writes of rows whose id starts with prefix: a fleet's
// own, in a sink another fleet shares.
func ownRows(ws []SinkWrite, prefix string) []SinkWrite {
	if prefix == "" {
		return ws
	}
	return slices.DeleteFunc(ws, func(w SinkWrite) bool { return !strings.HasPrefix(w.ID, prefix) })
}

// ReadSink reads every write of the reference workers' sink in the
// database at dsn, in write order.
func ReadSink(ctx context.Context, dsn string) ([]SinkWrite, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id, unit, member, epoch, written_at FROM shardkeeper_sink_writes ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SinkWrite, error) {
		var w SinkWrite
		err := r.Scan(&w.ID, &w.Unit, &w.Member, &w.Epoch, &w.WrittenAt)
		return w, err
	})
}

// Delivery sums up what reached the sink.
type Delivery struct {
	Published, Delivered, Missing int
	// Duplicates counts extra writes of rows already written
	// (at-least-once redeliveries the sink absorbed).
	Duplicates int
	// MaxGap is, per unit, the longest wait between consecutive first
	// writes of its rows.
	MaxGap map[string]time.Duration
	// Written holds, per unit, the sorted first-write times of its rows.
	Written map[string][]time.Time
}

// MaxGapWithin is the unit's longest wait between consecutive first writes
// that both fall in [from, to].
func (d Delivery) MaxGapWithin(unit string, from, to time.Time) time.Duration {
	var gap time.Duration
	var prev time.Time
	for _, t := range d.Written[unit] {
		if t.Before(from) || t.After(to) {
			continue
		}
		if !prev.IsZero() {
			gap = max(gap, t.Sub(prev))
		}
		prev = t
	}
	return gap
}

// WaitDelivered waits until every published row is in the sink (P3) or
// timeout passes, and reports duplicates and per-unit delivery gaps.
func (f *Fleet) WaitDelivered(published map[string]ownership.Unit, timeout time.Duration) (Delivery, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(timeout)
	for {
		sink, err := f.Sink(ctx)
		if err != nil {
			return Delivery{}, err
		}
		d, missing := summarize(published, sink)
		if d.Missing == 0 {
			return d, nil
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("%d of %d published rows never reached the sink, e.g. %s (unit %s)",
				d.Missing, d.Published, missing, published[missing])
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// summarize counts published rows found in the sink, and returns the
// first missing id.
func summarize(published map[string]ownership.Unit, sink []SinkWrite) (Delivery, string) {
	d := Delivery{Published: len(published), MaxGap: map[string]time.Duration{}, Written: map[string][]time.Time{}}
	first := map[string]SinkWrite{}
	writes := map[string]int{}
	for _, w := range sink {
		writes[w.ID]++
		if f, ok := first[w.ID]; !ok || w.WrittenAt.Before(f.WrittenAt) {
			first[w.ID] = w
		}
	}
	byUnit := map[string][]time.Time{}
	var missing []string
	for id := range published {
		w, ok := first[id]
		if !ok {
			d.Missing++
			missing = append(missing, id)
			continue
		}
		d.Delivered++
		d.Duplicates += writes[id] - 1
		byUnit[w.Unit] = append(byUnit[w.Unit], w.WrittenAt)
	}
	for u, ts := range byUnit {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		d.Written[u] = ts
		for i := 1; i < len(ts); i++ {
			d.MaxGap[u] = max(d.MaxGap[u], ts[i].Sub(ts[i-1]))
		}
	}
	sort.Strings(missing)
	if len(missing) == 0 {
		return d, ""
	}
	return d, missing[0]
}

// Monitor samples every running worker's own account of what it holds and
// counts units that two unfenced workers claim at the same sample and units
// of the active topology nobody delivers. It is a live view only: what
// workers say is not evidence (the history checker judges P1 from what
// they did). A sample in which some worker did not answer is skipped for
// the unowned count: an unreachable worker is not known to hold nothing.
type Monitor struct {
	targets func() map[string]string
	stop    chan struct{}
	done    chan struct{}

	mu     sync.Mutex
	result MonitorResult
	// topo is the active topology for unowned counting.
	topo ownership.Topology
	// reg and key, when set, are the registry each sample is checked
	// against.
	reg poolctl.Registry
	key string
}

// MonitorResult is what a Monitor saw.
type MonitorResult struct {
	// Samples counts samples taken; Skipped counts those in which at least
	// one worker did not answer (left out of the unowned count).
	Samples, Skipped int
	// MaxMultiplyOwned is the most units held by two or more unfenced
	// workers in one sample; MultiplyOwnedInstants sums them over samples.
	MaxMultiplyOwned, MultiplyOwnedInstants int
	// UnownedUnitSamples sums, over samples, active units no unfenced
	// worker held.
	UnownedUnitSamples int
	// Examples names a few multiply-owned sightings.
	Examples []string
	// NotRegistryOwner counts sightings of a worker delivering a unit the
	// registry gave to someone else, in reads before and after (P1).
	NotRegistryOwner int
	// Holders lists, per unit, every worker seen holding it.
	Holders map[string]map[string]bool
	// Interval is the sampling interval.
	Interval time.Duration
}

// UnownedUnitSeconds estimates unit-seconds without an owner.
func (r MonitorResult) UnownedUnitSeconds() float64 {
	return float64(r.UnownedUnitSamples) * r.Interval.Seconds()
}

// StartMonitor samples the fleet's workers, and checks them against the
// registry, every interval until Stop.
func (f *Fleet) StartMonitor(topo ownership.Topology, interval time.Duration) *Monitor {
	m := StartMonitor(func() map[string]string {
		out := map[string]string{}
		for _, w := range f.Workers() {
			out[w.Name] = w.Addr
		}
		return out
	}, topo, interval)
	m.CheckRegistry(f.Registry, f.Topology)
	return m
}

// StartMonitor samples the workers targets names (name -> status address)
// every interval until Stop.
func StartMonitor(targets func() map[string]string, topo ownership.Topology, interval time.Duration) *Monitor {
	m := &Monitor{targets: targets, topo: topo, stop: make(chan struct{}), done: make(chan struct{})}
	m.result.Holders = map[string]map[string]bool{}
	m.result.Interval = interval
	go m.run(interval)
	return m
}

// CheckRegistry makes every sample also compare what workers say they
// deliver with the registry's owners.
func (m *Monitor) CheckRegistry(reg poolctl.Registry, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reg, m.key = reg, key
}

// owners reads the registry's owner of every held unit, or nil.
func (m *Monitor) owners(ctx context.Context) map[string]string {
	m.mu.Lock()
	reg, key := m.reg, m.key
	m.mu.Unlock()
	if reg == nil {
		return nil
	}
	claims, err := reg.Claims(ctx, key)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, c := range claims {
		if c.State != poolctl.StateFree {
			out[c.Unit] = c.Owner
		}
	}
	return out
}

// SetTopology changes the topology whose unowned units are counted.
func (m *Monitor) SetTopology(t ownership.Topology) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.topo = t
}

func (m *Monitor) run(interval time.Duration) {
	defer close(m.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		m.sample()
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
	}
}

func (m *Monitor) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	before := m.owners(ctx)
	holders := map[string][]string{}
	unreachable := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, addr := range m.targets() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := StatusOf(ctx, addr)
			if err != nil {
				mu.Lock()
				unreachable++
				mu.Unlock()
				return
			}
			if s.Fenced {
				return // a fenced worker says it delivers nothing
			}
			mu.Lock()
			for u := range s.Held {
				holders[u] = append(holders[u], name)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	after := m.owners(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.result.Samples++
	if before != nil && after != nil {
		m.checkOwners(holders, before, after)
	}
	multi := 0
	for u, hs := range holders {
		if m.result.Holders[u] == nil {
			m.result.Holders[u] = map[string]bool{}
		}
		for _, h := range hs {
			// A terminating pod's process ("name@uid") is the same owner
			// as far as "did the owner change" goes.
			m.result.Holders[u][strings.SplitN(h, "@", 2)[0]] = true
		}
		if len(hs) > 1 {
			multi++
			if len(m.result.Examples) < 5 {
				m.result.Examples = append(m.result.Examples, fmt.Sprintf("%s held by %v", u, hs))
			}
		}
	}
	m.result.MultiplyOwnedInstants += multi
	m.result.MaxMultiplyOwned = max(m.result.MaxMultiplyOwned, multi)
	if unreachable > 0 {
		m.result.Skipped++
		return
	}
	for _, u := range m.topo.Units() {
		if len(holders[u.String()]) == 0 {
			m.result.UnownedUnitSamples++
		}
	}
}

// Result returns what the monitor saw so far, and keeps sampling.
func (m *Monitor) Result() MonitorResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.result
	r.Holders = map[string]map[string]bool{}
	for u, hs := range m.result.Holders {
		r.Holders[u] = map[string]bool{}
		for h := range hs {
			r.Holders[u][h] = true
		}
	}
	return r
}

// checkOwners flags units a worker delivers while the registry named
// another owner both before and after the workers were asked: a window
// the worker's own report cannot have fallen between.
func (m *Monitor) checkOwners(holders map[string][]string, before, after map[string]string) {
	for u, hs := range holders {
		for _, h := range hs {
			name := strings.SplitN(h, "@", 2)[0]
			if before[u] != name && after[u] != name {
				m.result.NotRegistryOwner++
				if len(m.result.Examples) < 10 {
					m.result.Examples = append(m.result.Examples,
						fmt.Sprintf("%s delivered by %s, registry owner %q then %q", u, name, before[u], after[u]))
				}
			}
		}
	}
}

// Stop ends sampling and returns the result.
func (m *Monitor) Stop() MonitorResult {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.result
}
