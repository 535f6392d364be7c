package history

import (
	"time"

	"golang.org/x/sys/unix"
)

// Now returns CLOCK_MONOTONIC in nanoseconds: the clock of every Record.
//
// Go's time.Now carries a monotonic reading too, but as an offset from the
// process's own start, so two processes' readings cannot be compared.
// Linux's CLOCK_MONOTONIC is system-wide: every process on one machine reads
// the same clock, which is never stepped by NTP or settimeofday, so the
// records of a killed worker and of the worker that took over its units fall
// on one time line.
//
// unix.ClockGettime is a real system call (about 300 ns on a virtual
// machine), too slow to pay twice per delivery. Go's own monotonic reading is
// CLOCK_MONOTONIC read through the vDSO, so Now reads unix.ClockGettime once,
// next to a time.Now, and from then on adds time.Since to that anchor. The
// anchor is off from the true clock by at most monoAnchor.err (the half-gap
// of the closest of several pairings, a few hundred nanoseconds at worst),
// the same for every record of the process; conversions to wall time cancel
// it, because the clock record is taken with Now too.
func Now() int64 {
	return monoAnchor.mono + int64(time.Since(monoAnchor.at))
}

// rawMono reads CLOCK_MONOTONIC with a system call.
func rawMono() int64 {
	var ts unix.Timespec
	// ClockGettime cannot fail for CLOCK_MONOTONIC on Linux: the clock id is
	// valid and ts is addressable.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// anchor pairs a CLOCK_MONOTONIC reading with a Go time that carries the
// process's monotonic reading.
type anchor struct {
	mono int64     // CLOCK_MONOTONIC at the instant of at
	at   time.Time // has a monotonic reading
	err  int64     // bound on |mono - true CLOCK_MONOTONIC at at|, ns
}

var monoAnchor = newAnchor()

// newAnchor takes the tightest of a few pairings: raw reads before and after
// a time.Now bound the instant it was taken.
func newAnchor() anchor {
	var best anchor
	for i := range 16 {
		before := rawMono()
		at := time.Now()
		after := rawMono()
		if gap := after - before; i == 0 || gap/2 < best.err {
			best = anchor{mono: before + gap/2, at: at, err: gap/2 + 1}
		}
	}
	return best
}

// clockRecord pairs Now with CLOCK_REALTIME (time.Now's wall reading, the
// clock PostgreSQL's clock_timestamp() reads). Both are vDSO reads; the pair
// with the smallest gap of a few tries is dated at its midpoint.
func clockRecord(member string) Record {
	best := Record{Kind: KindClock, Member: member}
	bestGap := int64(-1)
	for range 5 {
		before := Now()
		wall := time.Now().UnixNano()
		after := Now()
		if gap := after - before; bestGap < 0 || gap < bestGap {
			bestGap = gap
			best.Start = before + gap/2
			best.Wall = wall
		}
	}
	return best
}

// MonoToWall returns what to add to a Now reading of this process to get
// wall-clock nanoseconds, as of now. It stays right while nobody steps the
// wall clock.
func MonoToWall() int64 {
	c := clockRecord("")
	return c.Wall - c.Start
}
