// Package faultproxy is a TCP proxy for tests. It sits on loopback between a
// client and a server, adds a fixed latency to each direction, and injects
// network faults on demand: cut every open connection, refuse new ones,
// hold all traffic (a blackhole) while keeping connections open, or cut one
// connection in the middle of a reply (after N bytes of it, or where the
// server sends a given byte sequence) so the client never sees the rest.
//
// It also counts client flights: a flight starts whenever the client sends
// after the server has answered (or on a fresh connection), so the number of
// flights during an operation is the number of round trips it took.
//
// It owns nothing but sockets; it knows no protocol.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Stats are counters since the proxy started.
type Stats struct {
	// Accepted counts connections accepted and forwarded to the target.
	Accepted int64
	// Refused counts connections closed at once because of Refuse, or
	// because the target could not be reached.
	Refused int64
	// Cut counts connections closed by CutAll.
	Cut int64
	// BytesUp and BytesDown count bytes forwarded to and from the target.
	BytesUp, BytesDown int64
	// Flights counts client-to-server flights: one per round trip.
	Flights int64
	// ReplyCuts counts connections cut by CutReply.
	ReplyCuts int64
}

// Proxy forwards every connection it accepts to one target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu       sync.Mutex
	latency  time.Duration
	refuse   bool
	holding  chan struct{} // non-nil while holding; closed on release
	links    map[*link]struct{}
	closed   bool
	replyCut *replyCut // armed by CutReply; nil when none

	wg sync.WaitGroup

	accepted, refused, cut, up, down, flights, replyCuts atomic.Int64
}

// replyCut is an armed CutReply.
type replyCut struct {
	match []byte
	keep  int
	gen   int64 // tells links' match tails from before the arming apart
	fired bool
}

// Start listens on a free loopback port and forwards to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// New is Start for a test: it fails the test on error and closes the proxy
// when the test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Start(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetLatency sets the delay added to each direction. It applies to bytes
// read after the call; traffic is pipelined, so a large message costs the
// latency once, not once per segment.
func (p *Proxy) SetLatency(each time.Duration) {
	p.mu.Lock()
	p.latency = each
	p.mu.Unlock()
}

// Retarget sends connections accepted from now on to target (host:port),
// as a service address repointed at a promoted standby does; open
// connections stay with the old target until they end or are cut.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Refuse makes the proxy close new connections at once (on) or forward them
// again (off). Open connections are not affected; see CutAll.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Hold stops forwarding in both directions while keeping every connection
// open (on), as a network partition does; Hold(false) delivers what was
// held and resumes. New connections are accepted but carry nothing while
// holding.
func (p *Proxy) Hold(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.holding == nil:
		p.holding = make(chan struct{})
	case !on && p.holding != nil:
		close(p.holding)
		p.holding = nil
	}
}

// CutAll closes every open connection (both sides, with a reset where
// possible) and returns how many it closed.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	p.cut.Add(int64(len(links)))
	return len(links)
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:  p.accepted.Load(),
		Refused:   p.refused.Load(),
		Cut:       p.cut.Load(),
		BytesUp:   p.up.Load(),
		BytesDown: p.down.Load(),
		Flights:   p.flights.Load(),
		ReplyCuts: p.replyCuts.Load(),
	}
}

// CutReply arms a one-shot fault on the bytes servers send to clients.
// The first read from a server, on any connection, that completes match
// (any read at all when match is empty) is cut short: the client gets the
// first keep bytes of that read, the rest is dropped, and the connection is
// cut (both sides, with a reset) once those bytes are delivered. Reads
// before it are forwarded as usual, so with a match the client may hold
// everything before the read that completed it.
//
// It is how a test loses a reply after the server acted on the request: a
// database's reply is sent after its commit, so cutting it leaves the
// client with an error and the commit in place. The proxy knows no
// protocol: the caller chooses match (for PostgreSQL, the ReadyForQuery
// that ends a transaction).
func (p *Proxy) CutReply(match []byte, keep int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	gen := int64(1)
	if p.replyCut != nil {
		gen = p.replyCut.gen + 1
	}
	p.replyCut = &replyCut{match: append([]byte(nil), match...), keep: max(keep, 0), gen: gen}
}

// Disarm cancels CutReply and reports whether it had struck.
func (p *Proxy) Disarm() (struck bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replyCut == nil {
		return false
	}
	struck = p.replyCut.fired
	p.replyCut = &replyCut{gen: p.replyCut.gen, fired: true} // spent: matches nothing
	return struck
}

// cutReply checks one read from a server against an armed CutReply and
// returns how many of its bytes to deliver before cutting, or -1.
func (p *Proxy) cutReply(l *link, data []byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	rc := p.replyCut
	if rc == nil || rc.fired {
		return -1
	}
	if l.tailGen != rc.gen {
		l.tail, l.tailGen = nil, rc.gen
	}
	if len(rc.match) > 0 {
		seen := append(l.tail, data...)
		if !bytes.Contains(seen, rc.match) {
			l.tail = append([]byte(nil), seen[max(0, len(seen)-len(rc.match)+1):]...)
			return -1
		}
	}
	rc.fired = true
	p.replyCuts.Add(1)
	return min(rc.keep, len(data))
}

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.holding != nil {
		close(p.holding)
		p.holding = nil
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		refuse, closed, target := p.refuse, p.closed, p.target
		p.mu.Unlock()
		if refuse || closed {
			resetClose(c)
			p.refused.Add(1)
			continue
		}
		s, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			resetClose(c)
			p.refused.Add(1)
			continue
		}
		p.accepted.Add(1)
		p.serve(c, s)
	}
}

// link is one proxied connection: client and server sockets and the state
// shared by its two directions.
type link struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
	lastUp         atomic.Bool // the last bytes seen went client to server
	started        atomic.Bool
	halves         atomic.Int32
	// tail holds the last bytes the server sent, so a CutReply match split
	// across reads is found (its reader goroutine only, under p.mu).
	tail    []byte
	tailGen int64
}

// close ends the link; abrupt closes with a reset, as a cut does.
func (l *link) close(abrupt bool) {
	l.once.Do(func() {
		close(l.done)
		if abrupt {
			resetClose(l.client)
			resetClose(l.server)
			return
		}
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

func (p *Proxy) serve(client, server net.Conn) {
	l := &link{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(2)
	go p.pipe(l, client, server, true)
	go p.pipe(l, server, client, false)
}

type chunk struct {
	data []byte
	due  time.Time
	cut  bool // cut the link once data is delivered (CutReply)
}

// pipe copies src to dst, each chunk delivered latency after it was read.
// A reader goroutine stamps chunks; this goroutine delivers them, so a
// stream of chunks is delayed once, not once per chunk.
func (p *Proxy) pipe(l *link, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.noteRead(l, up, n)
				c := chunk{data: buf[:n]}
				if !up {
					if k := p.cutReply(l, c.data); k >= 0 {
						c.data, c.cut = c.data[:k], true
					}
				}
				p.mu.Lock()
				c.due = time.Now().Add(p.latency)
				p.mu.Unlock()
				select {
				case q <- c:
				case <-l.done:
					return
				}
				if c.cut {
					return // the rest of the reply is dropped
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if !p.wait(l, c.due) {
			p.finish(l, dst, false)
			return
		}
		if _, err := dst.Write(c.data); err != nil || c.cut {
			p.finish(l, dst, false)
			return
		}
	}
	p.finish(l, dst, true)
}

// noteRead counts bytes and flights.
func (p *Proxy) noteRead(l *link, up bool, n int) {
	if up {
		p.up.Add(int64(n))
		if !l.started.Swap(true) || !l.lastUp.Swap(true) {
			p.flights.Add(1)
		}
		return
	}
	p.down.Add(int64(n))
	l.lastUp.Store(false)
}

// wait sleeps until due and while the proxy holds traffic; false means the
// link was cut meanwhile.
func (p *Proxy) wait(l *link, due time.Time) bool {
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return false
		}
	}
	for {
		p.mu.Lock()
		h := p.holding
		p.mu.Unlock()
		if h == nil {
			return true
		}
		select {
		case <-h:
		case <-l.done:
			return false
		}
	}
}

// finish ends one direction: a clean end half-closes dst so the other side
// sees EOF; a failed one, or the second half to end, closes the link.
func (p *Proxy) finish(l *link, dst net.Conn, clean bool) {
	if clean {
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	if !clean || l.halves.Add(1) == 2 {
		l.close(!clean)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}
}

// resetClose closes c with a TCP reset where possible, so the peer sees the
// cut at once instead of a graceful end of stream.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
