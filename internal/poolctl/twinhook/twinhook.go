// Package twinhook lets the member simulator (pkg/worker/internal/sim)
// break one rule of the registry's in-memory twin on purpose, to show that
// its checks catch the broken rule (make mutate). Package poolctl sets
// Mutate when it is initialised; nothing else in the module calls it, and
// PostgreSQL has no such hook.
package twinhook

// Mutate applies the named mutation to a *poolctl.Twin (typed any to
// avoid an import cycle). The names are "adopt-while-lease-live",
// "no-grace" and "barrier-hidden-while-pending".
var Mutate func(twin any, mutation string) error
