// Package chaos runs the faults that matter end to end, on the same real
// parts as test/e2e: the operator as a separate process (built from
// main.go, leader election on, under its own RBAC), envtest's
// kube-apiserver and etcd with kube-controller-manager's StatefulSet
// controller, the test kubelet running one reference worker process per
// pod, a 3-server NATS cluster of separate nats-server 2.14.9 processes,
// PostgreSQL behind a fault proxy (the operator's DSN Secret and the
// workers' REGISTRY_DSN point at the proxy; the test's own evidence reads
// go direct), and a publisher of uniquely numbered rows.
//
// Faults are injected by real means: signals to worker, operator,
// nats-server and postgres processes, and the proxy refusing and cutting
// connections. Each scenario runs under live traffic and ends with the
// history checker's verdict (package internal/historycheck), judged from
// what every process the kubelet started recorded doing, the registry's
// claim, lease and fence history and every sink write, plus the
// scenario's own assertions and a check that its fault took effect, and
// prints one line of a summary table.
//
// By default the scenarios marked for CI run (the subset `make test`
// affords); SHARDKEEPER_CHAOS=all (what `make chaos` sets) runs every
// scenario, and SHARDKEEPER_CHAOS=1,5b,12 runs the named ones.
package chaos
