package main

import "github.com/shardkeeper/shardkeeper/pkg/worker"

// sinkGuard is the condition every sink write is made under: the claim's
// write guard. make mutate-real builds the worker with this file replaced
// (go build -overlay; pkg/worker/internal/mutatereal) by one whose guard
// always holds, so a real-parts test can show that it notices. Nothing at
// run time reaches it.
const sinkGuard = worker.GuardSQL
