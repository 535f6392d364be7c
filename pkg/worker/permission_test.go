package worker

import (
	"sync"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
)

// The per-row P1 check reads the core's published permission: one atomic
// load and one monotonic clock read (the map read only when the
// permission changed). It must answer what the permission says, on the
// fence deadline as on the token.
func TestMayDeliverFollowsThePublishedPermission(t *testing.T) {
	u, other := ownership.Unit{Partition: 0, Shard: 1}, ownership.Unit{Partition: 0, Shard: 2}
	tok := poolctl.Token{Topology: "ns/t", Unit: u.String(), Member: "w-0", Epoch: 3}
	later := sinceStart() + time.Hour
	tests := []struct {
		name string
		perm *member.Permission
		want bool
	}{
		{"nothing published yet", nil, false},
		{"held at this token", &member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, FenceDue: later}, true},
		{"held at another epoch", &member.Permission{Units: map[ownership.Unit]poolctl.Token{u: {Epoch: 4}}, FenceDue: later}, false},
		{"another unit held", &member.Permission{Units: map[ownership.Unit]poolctl.Token{other: tok}, FenceDue: later}, false},
		{"fenced", &member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, Fenced: true, FenceDue: later}, false},
		{"fence deadline passed", &member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, FenceDue: sinceStart()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &Worker{}
			if tt.perm != nil {
				w.perm.Store(tt.perm)
			}
			p := &puller{w: w, unit: u, token: tok}
			if got := p.mayDeliver(); got != tt.want {
				t.Fatalf("mayDeliver = %v, want %v", got, tt.want)
			}
		})
	}
}

// A puller keeps the permission's answer while the permission is the
// same; every newly published one is read again, whichever way it
// answers.
func TestMayDeliverReadsEveryNewPermission(t *testing.T) {
	u := ownership.Unit{Partition: 0, Shard: 1}
	tok := poolctl.Token{Topology: "ns/t", Unit: u.String(), Member: "w-0", Epoch: 3}
	later := sinceStart() + time.Hour
	held := func() *member.Permission {
		return &member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, FenceDue: later}
	}
	steps := []struct {
		perm *member.Permission
		want bool
	}{
		{held(), true},
		{&member.Permission{Units: map[ownership.Unit]poolctl.Token{}, FenceDue: later}, false},
		{held(), true},
		{&member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, Fenced: true, FenceDue: later}, false},
		{held(), true},
		{&member.Permission{Units: map[ownership.Unit]poolctl.Token{u: tok}, FenceDue: sinceStart()}, false},
	}
	w := &Worker{}
	p := &puller{w: w, unit: u, token: tok}
	for i, st := range steps {
		w.perm.Store(st.perm)
		for range 2 { // the second check answers from the kept answer
			if got := p.mayDeliver(); got != st.want {
				t.Fatalf("step %d: mayDeliver = %v, want %v", i, got, st.want)
			}
		}
	}
}

// BenchmarkMayDeliver measures the per-row check against the mutex and map
// it replaced.
func BenchmarkMayDeliver(b *testing.B) {
	units := map[ownership.Unit]poolctl.Token{}
	for i := range 64 {
		u := ownership.Unit{Partition: i % 4, Shard: i}
		units[u] = poolctl.Token{Unit: u.String(), Member: "w-0", Epoch: 1}
	}
	u := ownership.Unit{Partition: 1, Shard: 5}
	tok := units[u]
	b.Run("permission", func(b *testing.B) {
		w := &Worker{}
		w.perm.Store(&member.Permission{Units: units, FenceDue: sinceStart() + time.Hour})
		p := &puller{w: w, unit: u, token: tok}
		for b.Loop() {
			if !p.mayDeliver() {
				b.Fatal("refused")
			}
		}
	})
	b.Run("mutex (before the core)", func(b *testing.B) {
		old := &oldShape{held: map[ownership.Unit]*oldHolding{}, fenceDue: sinceStart() + time.Hour}
		for u, t := range units {
			old.held[u] = &oldHolding{token: t}
		}
		for b.Loop() {
			if !old.mayDeliver(u, tok) {
				b.Fatal("refused")
			}
		}
	})
}

// oldShape is the state and check the core replaced, as they were.
type oldShape struct {
	mu       sync.Mutex
	held     map[ownership.Unit]*oldHolding
	fenced   bool
	fenceDue time.Duration
}

type oldHolding struct {
	token     poolctl.Token
	releasing bool
}

func (w *oldShape) mayDeliver(u ownership.Unit, t poolctl.Token) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.held[u]
	return !(w.fenced || sinceStart() >= w.fenceDue) && h != nil && h.token == t && !h.releasing
}
