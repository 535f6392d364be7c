package fleettest

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
)

// Every row the fleet's publishers send is keyed: its subject is the one
// pkg/publish gives its key (so it lands where a real publisher's row of
// that key lands), and it carries the key and its place among the key's
// rows (1, 2, 3 ...) in these headers. The history checker takes both
// from the fleet's own record of what it sent (Keyed), not from the
// workers.
const (
	KeyHeader    = "Shardkeeper-Key"
	KeySeqHeader = "Shardkeeper-Key-Seq"
)

// keysPerUnit is how many keys a unit-addressed publisher spreads one
// unit's rows over: few enough that every key gets rows before and after
// a change, more than one so a unit's rows are not one key's.
const keysPerUnit = 4

// PublishedRow is one row a publisher sent and the stream acknowledged.
type PublishedRow struct {
	ID    string
	Key   string
	Seq   int64
	Unit  ownership.Unit // as recorded: shard -1 under a subject transform
	Acked time.Time      // when the stream's acknowledgement came back
	// StreamSeq is the row's sequence in its partition's stream, from the
	// stream's acknowledgement.
	StreamSeq uint64
}

// Publisher sends rows with unique ids (the Nats-Msg-Id header), each of
// one key and numbered in the key's sequence, and remembers every row the
// stream acknowledged. It picks keys one of two ways: round robin over a
// topology's units (or given units), a few keys of each unit in turn, or
// round robin over a fixed set of keys (StartKeyedPublisher), whose units
// then follow from the topology, as a real publisher's do.
type Publisher struct {
	f  *Fleet
	js jetstream.JetStream
	// idPrefix starts every row id after the fleet's RowPrefix ("row" for
	// StartPublisher), so publishers running side by side never send one
	// id twice (the stream drops a repeated id as a duplicate); the keys
	// carry it too, so no two publishers number one key.
	idPrefix string
	mu       sync.Mutex
	topo     ownership.Topology
	// units, when set, are the units rows go to instead of topo's.
	units []ownership.Unit
	// keys, when set, are the keys rows go round robin over (keyed mode).
	keys []string
	// pool holds, per unit, the keys that address it under addr.
	pool  map[ownership.Unit][]string
	addr  publish.Topology
	acked map[string]PublishedRow
	// failed counts publishes the stream did not acknowledge in time (a
	// row may still have been stored: its key's sequence skips its
	// number).
	failed int
	bursts chan burstRequest
	// switches carry SwitchEpoch's requests to the publishing goroutine,
	// which alone reads and writes epoch: the epoch it acknowledged (0:
	// none) and renews every PublisherTTL/3.
	switches chan switchRequest
	epoch    int64
	stop     chan struct{}
	done     chan struct{}
}

type burstRequest struct {
	n     int
	reply chan error
}

type switchRequest struct {
	topo  ownership.Topology
	epoch int64
	reply chan error
}

// StartPublisher publishes about rate rows a second, round robin over the
// units of topo, until Stop.
func (f *Fleet) StartPublisher(topo ownership.Topology, rate int) *Publisher {
	f.T.Helper()
	p := f.newPublisher("row")
	p.SetTopology(topo)
	go p.run(rate)
	return p
}

// StartUnitPublisher publishes about rate rows a second, round robin over
// units, with row ids "<prefix>-<n>", until Stop: steady traffic on chosen
// units beside StartPublisher's (prefix must differ from "row" and from
// every other publisher's).
func (f *Fleet) StartUnitPublisher(prefix string, units []ownership.Unit, rate int) *Publisher {
	f.T.Helper()
	p := f.newPublisher(prefix)
	p.units = units
	p.addr = f.addressing(unitsShape(units))
	p.pool = f.keyPool(prefix, p.addr, units)
	go p.run(rate)
	return p
}

// StartKeyedPublisher publishes about rate rows a second, round robin over
// keys keys ("<RowPrefix><prefix>k<i>"), with row ids "<prefix>-<n>",
// until Stop. A key's unit is the one pkg/publish gives it under topo (and
// under a subject transform, the stream's active V): so each key gets a
// row every keys/rate seconds whatever the topology, and a change of N or
// V moves keys between units, as it moves a real publisher's.
func (f *Fleet) StartKeyedPublisher(prefix string, topo ownership.Topology, keys, rate int) *Publisher {
	f.T.Helper()
	p := f.newPublisher(prefix)
	for i := range keys {
		p.keys = append(p.keys, f.keyName(prefix, i))
	}
	p.SetTopology(topo)
	go p.run(rate)
	return p
}

func (f *Fleet) newPublisher(prefix string) *Publisher {
	f.T.Helper()
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		f.T.Fatal(err)
	}
	return &Publisher{f: f, js: js, idPrefix: prefix, acked: map[string]PublishedRow{},
		bursts: make(chan burstRequest), switches: make(chan switchRequest), stop: make(chan struct{}), done: make(chan struct{})}
}

// SetTopology switches the units rows go to, as publishers do once the
// new epoch's consumers exist. Keys keep their sequences.
func (p *Publisher) SetTopology(t ownership.Topology) {
	addr := p.f.addressing(t)
	var pool map[ownership.Unit][]string
	if p.keys == nil && p.units == nil {
		pool = p.f.keyPool(p.idPrefix, addr, t.Units())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.topo, p.addr = t, addr
	if pool != nil {
		p.pool = pool
	}
}

// addressing is how the fleet's publishers address rows under t: the
// fleet's subject prefix and shard assignment.
func (f *Fleet) addressing(t ownership.Topology) publish.Topology {
	return publish.Topology{Prefix: f.Layout.SubjectPrefix, Partitions: t.Partitions, Shards: t.Shards,
		Assignment: publish.Assignment(f.Layout.Assignment)}
}

// unitsShape is the smallest topology holding every unit of units.
func unitsShape(units []ownership.Unit) ownership.Topology {
	t := ownership.Topology{Partitions: 1, Shards: 1}
	for _, u := range units {
		t.Partitions, t.Shards = max(t.Partitions, u.Partition+1), max(t.Shards, u.Shard+1)
	}
	return t
}

// keyName is the i-th key of a publisher with prefix: one subject token.
func (f *Fleet) keyName(prefix string, i int) string {
	return f.Opts.RowPrefix + prefix + "k" + strconv.Itoa(i)
}

// keyPool finds keysPerUnit keys for each of units that pkg/publish
// addresses to it under t, scanning the publisher's key names in order,
// so two topologies' pools share keys (a key moved by a change keeps its
// sequence). Under a transform only the partition is the publisher's to
// pick; the shard is still the one the stream's transform gives at t's V.
func (f *Fleet) keyPool(prefix string, t publish.Topology, units []ownership.Unit) map[ownership.Unit][]string {
	f.T.Helper()
	want := map[ownership.Unit]bool{}
	for _, u := range units {
		want[u] = true
	}
	pool := map[ownership.Unit][]string{}
	full := 0
	// A unit's share of keys is 1/(N*V); the bound leaves room for the
	// slowest unit to fill and still fails, rather than spins, on a bug.
	limit := 64 * keysPerUnit * max(t.Partitions*t.Shards, 1)
	for i := 0; full < len(want) && i < limit; i++ {
		key := f.keyName(prefix, i)
		if _, err := t.Subject(key); err != nil {
			f.T.Fatalf("publisher key %q: %v", key, err)
		}
		u := t.Unit(key)
		if !want[u] || len(pool[u]) == keysPerUnit {
			continue
		}
		if pool[u] = append(pool[u], key); len(pool[u]) == keysPerUnit {
			full++
		}
	}
	if full < len(want) {
		f.T.Fatalf("found keys for %d of %d units of %dx%d within %d names", full, len(want), t.Partitions, t.Shards, limit)
	}
	return pool
}

// next is the key and recorded unit of the publisher's n-th row.
func (p *Publisher) next(n int) (string, ownership.Unit, publish.Topology) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys != nil {
		key := p.keys[n%len(p.keys)]
		return key, p.recorded(p.addr.Unit(key)), p.addr
	}
	units := p.units
	if units == nil {
		units = p.topo.Units()
	}
	u := units[n%len(units)]
	keys := p.pool[u]
	return keys[(n/len(units))%len(keys)], p.recorded(u), p.addr
}

// message is the n-th row: its id, key, recorded unit and the message.
func (p *Publisher) message(n int) (PublishedRow, *nats.Msg, error) {
	key, unit, addr := p.next(n)
	subject, err := addr.Subject(key)
	if err != nil {
		return PublishedRow{}, nil, fmt.Errorf("subject of key %s: %w", key, err)
	}
	row := PublishedRow{ID: fmt.Sprintf("%s%s-%08d", p.f.Opts.RowPrefix, p.idPrefix, n), Key: key, Seq: p.f.nextSeq(key), Unit: unit}
	msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte(row.ID)}
	msg.Header.Set(nats.MsgIdHdr, row.ID)
	msg.Header.Set(KeyHeader, key)
	msg.Header.Set(KeySeqHeader, strconv.FormatInt(row.Seq, 10))
	return row, msg, nil
}

func (p *Publisher) run(rate int) {
	defer close(p.done)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	renew := time.NewTicker(publish.PublisherTTL / 3)
	defer renew.Stop()
	for n := 0; ; {
		select {
		case <-p.stop:
			return
		case req := <-p.bursts:
			// In this goroutine, so a key's rows reach the stream in the
			// order of their sequence numbers.
			err := p.burst(&n, req.n)
			req.reply <- err
			continue
		case req := <-p.switches:
			// Here too: every row this goroutine published so far has
			// its stream ack (or failed), so the acknowledgement
			// follows the last row under the older epoch.
			p.SetTopology(req.topo)
			p.epoch = req.epoch
			req.reply <- p.acknowledge()
			continue
		case <-renew.C:
			if p.epoch > 0 {
				_ = p.acknowledge() // the next renewal tries again
			}
			continue
		case <-tick.C:
		}
		row, msg, err := p.message(n)
		n++
		if err != nil {
			p.countFailed()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ack, err := p.js.PublishMsg(ctx, msg)
		cancel()
		if err != nil {
			p.countFailed()
			continue
		}
		row.StreamSeq = ack.Sequence
		p.record(row)
	}
}

// SwitchEpoch moves the publisher to t, the topology of active epoch
// epoch, and acknowledges epoch as a publisher does
// (pkg/publish.Acknowledge, the publisher named by its prefix): after
// every row it published under the older epoch has its stream ack. It
// renews the acknowledgement every PublisherTTL/3 from then on.
func (p *Publisher) SwitchEpoch(t ownership.Topology, epoch int64) error {
	req := switchRequest{topo: t, epoch: epoch, reply: make(chan error, 1)}
	select {
	case p.switches <- req:
	case <-p.done:
		return fmt.Errorf("switch to epoch %d: the publisher was stopped", epoch)
	}
	return <-req.reply
}

// acknowledge records p.epoch as the publisher's epoch.
func (p *Publisher) acknowledge() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return publish.Acknowledge(ctx, p.js, p.f.Layout.SubjectPrefix, p.idPrefix, p.epoch)
}

func (p *Publisher) countFailed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed++
}

// record keeps an acknowledged row, here and in the fleet's key record.
func (p *Publisher) record(row PublishedRow) {
	row.Acked = time.Now()
	p.f.recordKeyed(row)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acked[row.ID] = row
}

// Burst publishes n more rows, in the publisher's own order of keys, as
// fast as the stream acknowledges them (at most burstWindow in flight),
// between two of its steady rows, and returns once every one is
// acknowledged: a backlog of the keys the steady traffic goes on with.
func (p *Publisher) Burst(n int) error {
	req := burstRequest{n: n, reply: make(chan error, 1)}
	select {
	case p.bursts <- req:
	case <-p.done:
		return fmt.Errorf("burst of %d rows: the publisher was stopped", n)
	}
	return <-req.reply
}

// burst publishes rows *n .. *n+count-1 in windows of burstWindow.
func (p *Publisher) burst(n *int, count int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for sent := 0; sent < count; {
		size := min(burstWindow, count-sent)
		rows := make([]PublishedRow, 0, size)
		futures := make([]jetstream.PubAckFuture, 0, size)
		for range size {
			row, msg, err := p.message(*n)
			*n++
			if err != nil {
				return err
			}
			fut, err := p.js.PublishMsgAsync(msg)
			if err != nil {
				return fmt.Errorf("publish %s: %w", row.ID, err)
			}
			rows, futures = append(rows, row), append(futures, fut)
		}
		for i, fut := range futures {
			select {
			case ack := <-fut.Ok():
				rows[i].StreamSeq = ack.Sequence
				p.record(rows[i])
			case err := <-fut.Err():
				return fmt.Errorf("publish %s: %w", rows[i].ID, err)
			case <-ctx.Done():
				return fmt.Errorf("burst timed out: %w", ctx.Err())
			}
		}
		sent += size
	}
	return nil
}

// recorded is the unit a published row is recorded under: u, or only its
// partition (shard -1) under a subject transform, where the publisher does
// not know the shard.
func (p *Publisher) recorded(u ownership.Unit) ownership.Unit {
	if p.f.Layout.Assignment == natsops.AssignByTransform {
		return ownership.Unit{Partition: u.Partition, Shard: -1}
	}
	return u
}

// Stop stops publishing and returns the ids the stream acknowledged.
func (p *Publisher) Stop() map[string]ownership.Unit {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]ownership.Unit, len(p.acked))
	for k, v := range p.acked {
		out[k] = v.Unit
	}
	return out
}

// Rows returns every row the stream acknowledged so far, with its key,
// sequence number and acknowledgement time.
func (p *Publisher) Rows() map[string]PublishedRow {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.acked)
}

// Published is how many rows were acknowledged so far.
func (p *Publisher) Published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// nextSeq numbers key's next row: 1 for its first.
func (f *Fleet) nextSeq(key string) int64 {
	f.keyMu.Lock()
	defer f.keyMu.Unlock()
	f.keySeq[key]++
	return f.keySeq[key]
}

// recordKeyed keeps an acknowledged row's key and sequence number for the
// checker's per-key order check.
func (f *Fleet) recordKeyed(row PublishedRow) {
	f.keyMu.Lock()
	defer f.keyMu.Unlock()
	f.keyed[row.ID] = historycheck.KeyedRow{Key: row.Key, Seq: row.Seq}
}

// Keyed returns the key and sequence number of every row the fleet's
// publishers sent and the stream acknowledged, by row id: the evidence of
// per-key order (Evidence adds it).
func (f *Fleet) Keyed() map[string]historycheck.KeyedRow {
	f.keyMu.Lock()
	defer f.keyMu.Unlock()
	return maps.Clone(f.keyed)
}

// PublishBurst publishes n rows round robin over units as fast as the
// stream acknowledges them, with ids distinct from StartPublisher's, and
// returns the acknowledged ids. It applies back-pressure: at most
// burstWindow publishes are in flight, and each window's acknowledgements
// are awaited before the next one goes out, so a loaded machine slows the
// burst down instead of failing it.
func (f *Fleet) PublishBurst(units []ownership.Unit, n int) map[string]ownership.Unit {
	f.T.Helper()
	return f.PublishBurstAs("burst", units, n)
}

// PublishBurstAs is PublishBurst with row ids "<prefix>-<n>", so a test
// can publish several bursts (the stream drops a repeated id as a
// duplicate). Its rows are keyed like a unit publisher's, with keys of
// their own (prefix's).
func (f *Fleet) PublishBurstAs(prefix string, units []ownership.Unit, n int) map[string]ownership.Unit {
	f.T.Helper()
	p := f.newPublisher(prefix)
	p.units = units
	p.addr = f.addressing(unitsShape(units))
	p.pool = f.keyPool(prefix, p.addr, units)
	close(p.stop)
	close(p.done)
	next := 0
	if err := p.burst(&next, n); err != nil {
		f.T.Fatalf("publish burst: %v", err)
	}
	return p.Stop()
}

// burstWindow is how many asynchronous publishes a burst has in flight at
// most.
const burstWindow = 256
