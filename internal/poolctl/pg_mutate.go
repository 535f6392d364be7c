package poolctl

// pgMutation is the registry rule PG breaks on purpose: zero (no rule
// broken) in every build of this tree. make mutate-real builds the real
// parts with this file replaced (go build -overlay;
// pkg/worker/internal/mutatereal) by one that sets it, the same bend of the
// claim view the twin applies for the simulator (twinMutation), so a
// real-parts test can show that it notices. Nothing at run time reaches it.
var pgMutation twinMutation

// bent is v as a mutated registry decides on it. Only the decision sees
// it: the write's preconditions are the view as read, so a bent decision
// is written rather than refused as a conflict.
func (m twinMutation) bent(v claimView) claimView {
	m.bend(&v)
	return v
}
