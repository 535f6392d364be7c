// Package e2e runs the operator's main job end to end against real parts:
// envtest's kube-apiserver and etcd with kube-controller-manager's
// StatefulSet controller, a test kubelet running one reference worker
// process per pod, a 3-server NATS cluster, PostgreSQL, and a publisher of
// uniquely numbered rows. The same scenario runs under the operator
// (sequenced) and under the common practice it replaces (independent), and
// the test prints both side by side.
package e2e
