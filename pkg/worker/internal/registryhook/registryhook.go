// Package registryhook lets code inside this module hand pkg/worker a
// registry it built itself (a test's fault-injecting wrapper, say) without
// pkg/worker's public API naming the internal registry package. Package
// worker sets Wrap when it is initialised.
package registryhook

import "github.com/shardkeeper/shardkeeper/internal/poolctl"

// Wrap returns a *worker.Registry backed by r (typed any to avoid an
// import cycle).
var Wrap func(r poolctl.Registry) any
