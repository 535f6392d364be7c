package ownership

// placer runs the proposal algorithm Placement describes. Units and slots
// are referred to by index into their sorted lists, and the order among
// pairs is (weight, then lower unit index, then lower slot index), which is
// the canonical order of units and slots.
type placer struct {
	uk, sk []uint64
	cap    int

	// owner[i] is the slot index unit i holds, or -1.
	owner []int32
	// held is one min-heap per slot, weakest unit on top, stored flat:
	// slot j uses held[j*cap : j*cap+heldLen[j]].
	held    []entry
	heldLen []int32

	// Each unit keeps a short list of its next choices so that most
	// proposals cost no scan of all slots; next[i*choices+k] for k in
	// [nextPos[i], nextLen[i]).
	next    []choice
	nextPos []uint8
	nextLen []uint8
	// last[i] is the last slot unit i proposed to; lastSet marks that
	// there was one.
	last    []choice
	lastSet []bool
}

// choices is how many next choices a unit caches per scan. Most units are
// placed on their first or second choice, so a few suffice.
const choices = 4

// entry is a unit held by a slot.
type entry struct {
	w uint64
	i int32
}

// choice is a slot a unit may propose to.
type choice struct {
	w uint64
	j int32
}

func newPlacer(units []Unit, slots []Slot, cap int) *placer {
	p := &placer{
		uk:      make([]uint64, len(units)),
		sk:      make([]uint64, len(slots)),
		cap:     cap,
		owner:   make([]int32, len(units)),
		held:    make([]entry, len(slots)*cap),
		heldLen: make([]int32, len(slots)),
		next:    make([]choice, len(units)*choices),
		nextPos: make([]uint8, len(units)),
		nextLen: make([]uint8, len(units)),
		last:    make([]choice, len(units)),
		lastSet: make([]bool, len(units)),
	}
	for i, u := range units {
		p.uk[i] = unitKey(u)
		p.owner[i] = -1
	}
	for j, s := range slots {
		p.sk[j] = slotKey(s)
	}
	return p
}

// run places every unit and returns the slot index of each. It ends because
// every unit proposes to each slot at most once and the slots have room for
// all units (len(slots)*cap >= len(units)).
func (p *placer) run() []int32 {
	free := make([]int32, 0, len(p.owner))
	for i := len(p.owner) - 1; i >= 0; i-- {
		free = append(free, int32(i))
	}
	for len(free) > 0 {
		i := free[len(free)-1]
		free = free[:len(free)-1]
		if out, ok := p.propose(i, p.nextChoice(i)); ok {
			if out >= 0 {
				free = append(free, out)
			}
			continue
		}
		free = append(free, i)
	}
	return p.owner
}

// propose offers unit i to slot c.j. It reports whether the slot took it,
// and which unit the slot turned away to make room (-1 for none).
func (p *placer) propose(i int32, c choice) (int32, bool) {
	h := p.held[int(c.j)*p.cap : int(c.j)*p.cap+p.cap]
	n := p.heldLen[c.j]
	e := entry{w: c.w, i: i}
	if int(n) < p.cap {
		h[n] = e
		p.heldLen[c.j] = n + 1
		siftUp(h, int(n))
		p.owner[i] = c.j
		return -1, true
	}
	if !weaker(h[0], e) {
		return -1, false
	}
	out := h[0].i
	p.owner[out] = -1
	h[0] = e
	siftDown(h, 0)
	p.owner[i] = c.j
	return out, true
}

// nextChoice returns the best slot unit i has not proposed to yet.
func (p *placer) nextChoice(i int32) choice {
	if p.nextPos[i] == p.nextLen[i] {
		p.refill(i)
	}
	c := p.next[int(i)*choices+int(p.nextPos[i])]
	p.nextPos[i]++
	p.last[i], p.lastSet[i] = c, true
	return c
}

// refill scans all slots for unit i's next best choices after the last one
// it proposed to. It always finds one: a unit is only turned away by a slot
// that is full, and the slots have room for every unit, so no unit tries
// every slot in vain.
func (p *placer) refill(i int32) {
	buf := p.next[int(i)*choices : int(i)*choices+choices]
	n := 0
	uk := p.uk[i]
	bound, bounded := p.last[i], p.lastSet[i]
	for j, sk := range p.sk {
		c := choice{w: weight(uk, sk), j: int32(j)}
		if bounded && !better(bound, c) {
			continue
		}
		if n == choices && !better(c, buf[n-1]) {
			continue
		}
		k := min(n, choices-1)
		for k > 0 && better(c, buf[k-1]) {
			buf[k] = buf[k-1]
			k--
		}
		buf[k] = c
		n = min(n+1, choices)
	}
	p.nextPos[i], p.nextLen[i] = 0, uint8(n)
}

// better reports whether a unit prefers slot a to slot b.
func better(a, b choice) bool {
	return a.w > b.w || (a.w == b.w && a.j < b.j)
}

// weaker reports whether a slot prefers unit b to unit a.
func weaker(a, b entry) bool {
	return a.w < b.w || (a.w == b.w && a.i > b.i)
}

// siftUp and siftDown keep h a min-heap under weaker (weakest on top).
func siftUp(h []entry, k int) {
	for k > 0 {
		parent := (k - 1) / 2
		if !weaker(h[k], h[parent]) {
			return
		}
		h[k], h[parent] = h[parent], h[k]
		k = parent
	}
}

func siftDown(h []entry, k int) {
	n := len(h)
	for {
		l := 2*k + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && weaker(h[r], h[l]) {
			m = r
		}
		if !weaker(h[m], h[k]) {
			return
		}
		h[k], h[m] = h[m], h[k]
		k = m
	}
}
