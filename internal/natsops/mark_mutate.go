package natsops

// markCountsPending is MarkOf's rule that a mark is exact only when the
// consumer's pending rows are as many as the holder holds: true in every
// build of this tree. make mutate-real builds the real parts with this
// file replaced (go build -overlay; pkg/worker/internal/mutatereal) by one
// that turns it off, the simulator's mark-past-pending-rows, so a
// real-parts test can show that it notices. Nothing at run time reaches
// it.
const markCountsPending = true
