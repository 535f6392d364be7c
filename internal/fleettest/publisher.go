package fleettest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// Publisher sends rows with unique ids (the Nats-Msg-Id header) to the
// units of a topology it is told about, and remembers every id the
// stream acknowledged.
type Publisher struct {
	f  *Fleet
	js jetstream.JetStream
	// idPrefix starts every row id after the fleet's RowPrefix ("row" for
	// StartPublisher), so publishers running side by side never send one
	// id twice (the stream drops a repeated id as a duplicate).
	idPrefix string
	mu       sync.Mutex
	topo     ownership.Topology
	// units, when set, are the units rows go to instead of topo's.
	units  []ownership.Unit
	acked  map[string]ownership.Unit
	failed int
	stop   chan struct{}
	done   chan struct{}
}

// StartPublisher publishes about rate rows a second, round robin over the
// units of topo, until Stop.
func (f *Fleet) StartPublisher(topo ownership.Topology, rate int) *Publisher {
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		f.T.Fatal(err)
	}
	p := &Publisher{f: f, js: js, idPrefix: "row", topo: topo, acked: map[string]ownership.Unit{}, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(rate)
	return p
}

// StartUnitPublisher publishes about rate rows a second, round robin over
// units, with row ids "<prefix>-<n>", until Stop: steady traffic on chosen
// units beside StartPublisher's (prefix must differ from "row" and from
// every other publisher's).
func (f *Fleet) StartUnitPublisher(prefix string, units []ownership.Unit, rate int) *Publisher {
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		f.T.Fatal(err)
	}
	p := &Publisher{f: f, js: js, idPrefix: prefix, units: units, acked: map[string]ownership.Unit{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(rate)
	return p
}

// SetTopology switches the units rows go to, as publishers do once the
// new epoch's consumers exist.
func (p *Publisher) SetTopology(t ownership.Topology) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.topo = t
}

func (p *Publisher) run(rate int) {
	defer close(p.done)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		units := p.units
		if units == nil {
			units = p.topo.Units()
		}
		p.mu.Unlock()
		u := units[n%len(units)]
		id := fmt.Sprintf("%s%s-%08d", p.f.Opts.RowPrefix, p.idPrefix, n)
		msg := &nats.Msg{Subject: p.subject(u, id), Header: nats.Header{}, Data: []byte(id)}
		msg.Header.Set(nats.MsgIdHdr, id)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := p.js.PublishMsg(ctx, msg)
		cancel()
		p.mu.Lock()
		if err == nil {
			p.acked[id] = p.recorded(u)
		} else {
			p.failed++
		}
		p.mu.Unlock()
	}
}

// subject is where row id of unit u goes: the unit's own subject when
// publishers pick the shard, the partition's input subject keyed by the
// row id under a subject transform (NATS picks the shard).
func (p *Publisher) subject(u ownership.Unit, id string) string {
	if p.f.Layout.Assignment == natsops.AssignByTransform {
		return p.f.Layout.RowSubject(u.Partition, id)
	}
	return p.f.Layout.ShardSubject(u.Partition, u.Shard, id)
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
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]ownership.Unit, len(p.acked))
	for k, v := range p.acked {
		out[k] = v
	}
	return out
}

// Published is how many rows were acknowledged so far.
func (p *Publisher) Published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
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
// duplicate).
func (f *Fleet) PublishBurstAs(prefix string, units []ownership.Unit, n int) map[string]ownership.Unit {
	f.T.Helper()
	js, err := jetstream.New(f.NATS.Connect(-1))
	if err != nil {
		f.T.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	acked := map[string]ownership.Unit{}
	for from := 0; from < n; from += burstWindow {
		if err := publishWindow(ctx, js, f, prefix, units, from, min(from+burstWindow, n), acked); err != nil {
			f.T.Fatalf("publish burst: %v", err)
		}
	}
	return acked
}

// burstWindow is how many asynchronous publishes PublishBurst has in
// flight at most.
const burstWindow = 256

// publishWindow publishes rows [from, to) of a burst and waits for their
// acknowledgements.
func publishWindow(ctx context.Context, js jetstream.JetStream, f *Fleet, prefix string, units []ownership.Unit, from, to int, acked map[string]ownership.Unit) error {
	futures := make([]jetstream.PubAckFuture, 0, to-from)
	for i := from; i < to; i++ {
		u := units[i%len(units)]
		id := fmt.Sprintf("%s%s-%08d", f.Opts.RowPrefix, prefix, i)
		msg := &nats.Msg{Subject: f.Layout.ShardSubject(u.Partition, u.Shard, id), Header: nats.Header{}}
		msg.Header.Set(nats.MsgIdHdr, id)
		fut, err := js.PublishMsgAsync(msg)
		if err != nil {
			return fmt.Errorf("publish %s: %w", id, err)
		}
		futures = append(futures, fut)
	}
	for k, fut := range futures {
		i := from + k
		select {
		case <-fut.Ok():
			acked[fmt.Sprintf("%s%s-%08d", f.Opts.RowPrefix, prefix, i)] = units[i%len(units)]
		case err := <-fut.Err():
			return fmt.Errorf("publish %s%s-%08d: %w", f.Opts.RowPrefix, prefix, i, err)
		case <-ctx.Done():
			return fmt.Errorf("publish burst timed out: %w", ctx.Err())
		}
	}
	return nil
}
