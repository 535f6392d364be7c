package sim

import (
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/poolctl/twinhook"
)

// The simulator's own mutations: rules of the registry and the sink
// broken on purpose. The member's mutations belong to the member (its
// core) and reach it through MemberEnv.Mutation.
const (
	MutAdoptLive   = "adopt-while-lease-live"
	MutNoGrace     = "no-grace"
	MutNoSinkGuard = "no-sink-write-guard"
)

// WorldMutations lists the simulator's own mutations.
var WorldMutations = []string{MutAdoptLive, MutNoGrace, MutNoSinkGuard}

// mutations is what a run breaks on the simulator's side.
type mutations struct {
	registry    string
	noSinkGuard bool
}

func parseMutation(name string) mutations {
	switch name {
	case MutAdoptLive, MutNoGrace:
		return mutations{registry: name}
	case MutNoSinkGuard:
		return mutations{noSinkGuard: true}
	}
	return mutations{}
}

func (m mutations) applyRegistry(t *poolctl.Twin) error {
	if m.registry == "" {
		return nil
	}
	return twinhook.Mutate(t, m.registry)
}
