package member

import (
	"fmt"
	"sort"
)

// Mutation breaks one rule of the core on purpose, so a test can show that
// the simulator (or a scripted test) notices: a rule whose mutation
// survives is a rule nothing tests. Mutations live only in this internal
// package; pkg/worker never sets one.
type Mutation string

// The mutations, one per defect of issue 20 and per protocol rule of
// issue 19 that concerns the member.
const (
	// ConfirmWithoutVersionCheck applies a confirmation to units that
	// changed after it was asked (issue 20 defect 1).
	ConfirmWithoutVersionCheck Mutation = "confirm-without-version-check"
	// ConfirmDuringHandoverStartsPuller lets a confirmation put a unit
	// being handed over back into delivery (defect 2).
	ConfirmDuringHandoverStartsPuller Mutation = "confirm-during-handover-starts-puller"
	// FreezeAckAcrossRejoin counts a freeze acknowledgement sent under an
	// earlier incarnation (defect 4).
	FreezeAckAcrossRejoin Mutation = "freeze-ack-across-rejoin"
	// LostClaimReplyGuessed takes a claim whose reply was lost for refused
	// instead of confirming it (defect 5).
	LostClaimReplyGuessed Mutation = "lost-claim-reply-guessed"
	// StaleIncarnationRejoinsAtOnce rejoins without naming the
	// incarnation it held, as a process that never held the name does, so
	// the registry lets it take the name back from a later process under
	// the same name at once (defect 6).
	StaleIncarnationRejoinsAtOnce Mutation = "stale-incarnation-rejoins-at-once"
	// StaleIncarnationGivesUp gives up for good at ErrStaleIncarnation
	// without asking the registry whose the later incarnation is, so this
	// process's own join that committed late displaces it (issue 20: the
	// worker called Join, not Rejoin).
	StaleIncarnationGivesUp Mutation = "stale-incarnation-gives-up"
	// NoLazyFenceCheck publishes no fence deadline and checks none before
	// a step: only the timer fences (issue 19).
	NoLazyFenceCheck Mutation = "no-lazy-fence-check"
	// NoSelfFence never fences on the member's own clock (issue 19).
	NoSelfFence Mutation = "no-self-fence"
	// SelfFenceAfterExpiry fences at sent + TTL + margin, after the
	// registry may see the lease expired (issue 19).
	SelfFenceAfterExpiry Mutation = "self-fence-after-expiry"
	// UnpinSkippedBeforeFirstPull starts pullers without lifting the pin
	// (issue 19).
	UnpinSkippedBeforeFirstPull Mutation = "unpin-skipped-before-first-pull"
	// StaleConfirmationApplied applies a confirmation reply that is no
	// longer the one in flight (issue 19).
	StaleConfirmationApplied Mutation = "stale-confirmation-applied"
	// PullersBeforeBarrierRead starts pullers as soon as a fence lifts,
	// before a registry read shows the order barrier (issue 24).
	PullersBeforeBarrierRead Mutation = "pullers-before-barrier-read"
	// RecoveryConfirmAppliedFenced applies the confirmation that ends a
	// recovery before it lifts the fence, as the core did before
	// 45510e8: a handover it reports whose puller already stopped is
	// parked as held, and the lift starts its puller again.
	RecoveryConfirmAppliedFenced Mutation = "recovery-confirm-applied-fenced"
)

// Mutations lists every mutation, sorted.
func Mutations() []Mutation {
	all := []Mutation{ConfirmWithoutVersionCheck, ConfirmDuringHandoverStartsPuller, FreezeAckAcrossRejoin,
		LostClaimReplyGuessed, StaleIncarnationRejoinsAtOnce, StaleIncarnationGivesUp, NoLazyFenceCheck, NoSelfFence, SelfFenceAfterExpiry,
		UnpinSkippedBeforeFirstPull, StaleConfirmationApplied, PullersBeforeBarrierRead, RecoveryConfirmAppliedFenced}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all
}

// mutations is the set a Core runs with; empty in production.
type mutations map[Mutation]bool

func (m mutations) on(x Mutation) bool { return m[x] }

// Mutate returns a copy of cfg that runs the core with the given
// mutations. It refuses names it does not know, so a typo cannot make a
// mutation test pass by testing nothing.
func Mutate(cfg Config, ms ...Mutation) (Config, error) {
	known := map[Mutation]bool{}
	for _, m := range Mutations() {
		known[m] = true
	}
	out := cfg
	out.mutations = mutations{}
	for m := range cfg.mutations {
		out.mutations[m] = true
	}
	for _, m := range ms {
		if !known[m] {
			return cfg, fmt.Errorf("unknown mutation %q: allowed are %v", m, Mutations())
		}
		out.mutations[m] = true
	}
	return out, nil
}
