// Package e2e runs the operator's main job end to end against real parts:
// envtest's kube-apiserver and etcd with kube-controller-manager's
// StatefulSet controller, a test kubelet running one reference worker
// process per pod, a 3-server NATS cluster, PostgreSQL, and a publisher of
// uniquely numbered rows. The same scenarios run under the operator
// (sequenced) and under the practice it replaces (independent: every pod
// hashes with capped rendezvous over the fixed slots of its replica
// count), and the test prints the history checker's verdicts side by
// side: they are judged from what the workers recorded doing (package
// pkg/history), the registry's claim history and the sink's every write,
// not from what the workers say they hold.
package e2e
