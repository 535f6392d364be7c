package sim

import (
	"container/heap"
	"math/rand/v2"
)

// event is one thing that will happen at a virtual instant. Events at the
// same instant run in the order of a key drawn from the seed, so the seed
// also decides every tie.
type event struct {
	at   int64  // virtual ns, a multiple of a microsecond
	key  uint64 // random tie-break
	seq  uint64 // insertion order, the last tie-break
	fn   func()
	proc *process // nil: not bound to a process; else deferred while it is paused, dropped once it is dead
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.seq < b.seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return e
}

// sched is the virtual clock and the queue of pending events.
type sched struct {
	now  int64
	rng  *rand.Rand
	q    eventHeap
	seq  uint64
	runs int // events run
	// sameInstant counts events run at now: a member and the world
	// answering each other at once for ever would never let time pass.
	sameInstant int
	stuck       bool
}

// maxSameInstant bounds the events at one virtual instant; maxEvents
// bounds a run. A run that hits either is stopped and fails.
const (
	maxSameInstant = 10000
	maxEvents      = 2000000
)

// at schedules fn at virtual instant t (never before now).
func (s *sched) at(t int64, p *process, fn func()) {
	if t < s.now {
		t = s.now
	}
	t = roundUS(t)
	s.seq++
	heap.Push(&s.q, &event{at: t, key: s.rng.Uint64(), seq: s.seq, fn: fn, proc: p})
}

// after schedules fn d ns from now.
func (s *sched) after(d int64, p *process, fn func()) { s.at(s.now+d, p, fn) }

// step runs the next event that is due at or before until; false when
// none is.
func (s *sched) step(until int64) bool {
	for len(s.q) > 0 {
		e := s.q[0]
		if e.at > until {
			return false
		}
		heap.Pop(&s.q)
		if e.at == s.now {
			s.sameInstant++
		} else {
			s.sameInstant = 0
		}
		if s.sameInstant > maxSameInstant || s.runs > maxEvents {
			s.stuck = true
			return false
		}
		s.now = e.at
		if p := e.proc; p != nil {
			if p.dead {
				continue
			}
			if p.pausedUntil > s.now {
				// A paused process does nothing: its events wait for the
				// resume, in their order.
				e.at, e.key = p.pausedUntil, 0
				s.seq++
				e.seq = s.seq
				heap.Push(&s.q, e)
				continue
			}
		}
		s.runs++
		e.fn()
		return true
	}
	return false
}

// roundUS rounds a virtual instant up to the microsecond, the registry's
// resolution, so history stamps and registry stamps compare exactly.
func roundUS(t int64) int64 {
	const us = 1000
	if r := t % us; r != 0 {
		return t + us - r
	}
	return t
}

// between draws a duration in [lo, hi] ns, in whole microseconds.
func (s *sched) between(lo, hi int64) int64 {
	if hi <= lo {
		return roundUS(lo)
	}
	return roundUS(lo + s.rng.Int64N(hi-lo+1))
}

// chance reports true with probability p.
func (s *sched) chance(p float64) bool { return s.rng.Float64() < p }
