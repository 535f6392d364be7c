package poolctl

import (
	"fmt"
	"maps"

	"github.com/shardkeeper/shardkeeper/internal/poolctl/twinhook"
)

func init() {
	twinhook.Mutate = func(t any, name string) error { return t.(*Twin).mutate(name) }
}

// twinMutation is a registry rule the twin breaks on purpose (see
// twinhook): it exists so the simulator can prove it would notice.
type twinMutation struct {
	adoptLive bool // adopt while the owner's lease is live
	noGrace   bool // adopt (and re-home, and lift fences) with no grace
	// hidePendingBarrier: snapshots show a barrier only once its epoch
	// is active, as when the operator wrote it at the activation.
	hidePendingBarrier bool
}

func (t *Twin) mutate(name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch name {
	case "adopt-while-lease-live":
		t.mutation.adoptLive = true
	case "no-grace":
		t.mutation.noGrace = true
	case "barrier-hidden-while-pending":
		t.mutation.hidePendingBarrier = true
	default:
		return fmt.Errorf("twin mutation %q: want adopt-while-lease-live, no-grace or barrier-hidden-while-pending: %w", name, ErrInvalid)
	}
	return nil
}

// bend applies the mutation to a claim view.
func (m twinMutation) bend(v *claimView) {
	if m.noGrace {
		v.Grace = 0
	}
	if m.adoptLive {
		owners := maps.Clone(v.Owners)
		for name, o := range owners {
			expired := *o
			expired.LeaseExpiresAt = v.Now.Add(-v.Grace)
			owners[name] = &expired
		}
		v.Owners = owners
	}
}
