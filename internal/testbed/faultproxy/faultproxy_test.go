package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) error {
	t.Helper()
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		t.Fatalf("echo: got %q, want %q", got, msg)
	}
	return nil
}

func TestLatencyIsAddedOnceEachWayAndFlightsAreCounted(t *testing.T) {
	p := New(t, echoServer(t))
	p.SetLatency(25 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	before := p.Stats().Flights
	start := time.Now()
	for i := 0; i < 3; i++ {
		if err := roundTrip(t, c, r, "ping"); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	if el < 150*time.Millisecond || el > 600*time.Millisecond {
		t.Fatalf("3 round trips at 25ms each way took %v, want about 150ms", el)
	}
	if got := p.Stats().Flights - before; got != 3 {
		t.Fatalf("flights = %d, want 3", got)
	}

	// A large message is delayed once, not once per segment.
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = 'x'
	}
	start = time.Now()
	go func() { _, _ = c.Write(append(big, '\n')) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || len(got) != len(big)+1 {
		t.Fatalf("big echo: %d bytes, %v", len(got), err)
	}
	if el := time.Since(start); el > 400*time.Millisecond {
		t.Fatalf("1 MiB echo took %v; latency was applied per segment", el)
	}
}

func TestCutAllBreaksOpenConnectionsAndRefuseBlocksNewOnes(t *testing.T) {
	p := New(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, "before"); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	if n := p.CutAll(); n != 1 {
		t.Fatalf("CutAll closed %d connections, want 1", n)
	}
	if err := roundTrip(t, c, r, "after"); err == nil {
		t.Fatal("round trip over a cut connection succeeded")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		err = roundTrip(t, c2, bufio.NewReader(c2), "refused")
		c2.Close()
	}
	if err == nil {
		t.Fatal("round trip over a refused connection succeeded")
	}
	p.Refuse(false)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(t, c3, bufio.NewReader(c3), "healed"); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
	if s := p.Stats(); s.Cut != 1 || s.Refused < 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHoldKeepsConnectionsOpenAndDeliversOnRelease(t *testing.T) {
	p := New(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	p.Hold(true)
	if _, err := c.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("reply arrived while holding")
	} else if ne := (net.Error)(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want a timeout while holding, got %v", err)
	}
	p.Hold(false)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != "held\n" {
		t.Fatalf("after release: %q, %v", got, err)
	}
}

func TestCutReplyDeliversPartOfTheReplyThenCuts(t *testing.T) {
	cases := []struct {
		name  string
		match string
		keep  int
		send  []string // lines sent one round trip at a time
		got   []string // what the client reads back for each; "" marks the cut
	}{
		{"any reply, after three bytes", "", 3, []string{"hello"}, []string{"hel"}},
		{"the whole reply dropped", "", 0, []string{"hello"}, []string{""}},
		{"the reply that carries the match", "END", 0, []string{"first", "at the END"}, []string{"first\n", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := New(t, echoServer(t))
			conn, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			var match []byte
			if c.match != "" {
				match = []byte(c.match)
			}
			p.CutReply(match, c.keep)
			for i, line := range c.send {
				if _, err := conn.Write([]byte(line + "\n")); err != nil {
					t.Fatal(err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
				got, err := r.ReadString('\n')
				if c.got[i] == got && err == nil {
					continue // a full line, as expected
				}
				want := strings.TrimSuffix(c.got[i], "\n")
				if err == nil || got != want {
					t.Fatalf("round trip %d: read %q (%v), want %q then the cut", i, got, err, want)
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("round trip %d: timed out instead of a cut", i)
				}
			}
			if !p.Disarm() || p.Stats().ReplyCuts != 1 {
				t.Fatalf("the cut did not strike once: stats %+v", p.Stats())
			}
			// The proxy still serves new connections, uncut.
			c2, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if err := roundTrip(t, c2, bufio.NewReader(c2), "after"); err != nil {
				t.Fatalf("after the cut: %v", err)
			}
		})
	}
}

func TestDisarmBeforeAnyReplyCutsNothing(t *testing.T) {
	p := New(t, echoServer(t))
	p.CutReply([]byte("never"), 0)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(t, c, bufio.NewReader(c), "ping"); err != nil {
		t.Fatal(err)
	}
	if p.Disarm() {
		t.Fatal("Disarm reports a cut that did not happen")
	}
	p.CutReply(nil, 0)
	p.Disarm()
	if err := roundTrip(t, c, bufio.NewReader(c), "still open"); err != nil {
		t.Fatalf("a disarmed cut struck: %v", err)
	}
}
