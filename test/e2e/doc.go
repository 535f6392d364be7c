// Package e2e runs the operator's main job end to end against real parts:
// envtest's kube-apiserver and etcd with kube-controller-manager's
// StatefulSet controller, a test kubelet running one reference worker
// process per pod, a 3-server NATS cluster, PostgreSQL, and a publisher of
// uniquely numbered rows, each of a key and numbered in its key's sequence. The same scenarios run under the operator
// (sequenced) and under the practice it replaces (independent: every pod
// hashes with capped rendezvous over the fixed slots of its replica
// count), and the test prints the history checker's verdicts side by
// side: they are judged from what the workers recorded doing (package
// pkg/history), the registry's claim history and the sink's every write,
// not from what the workers say they hold.
//
// What users install is what runs: the worker StatefulSet and the
// ShardTopology come from config/samples (only image, env values and
// timings adapted to the bed), and the operator runs as its own
// ServiceAccount with a TokenRequest token, bound only by the rendered
// config/rbac, so a permission the role lacks fails the scenario.
// TestOperatorImageRunsTheRolloutUnderItsOwnRBAC builds the images with
// `make docker-build` and runs the operator, and one worker pod, as Docker
// containers (it fails when `docker info` does);
// TestInstallManifestIsAcceptedByTheAPIServer has the API server validate
// dist/install.yaml, config/namespaced and config/samples.
// TestKeyOrderAcrossAChangeOfNOrV changes V (and, without a barrier, N)
// under SubjectTransform with a backlog in the old units and asserts what
// the per-key order check finds (cross-unit inversions without an
// ordering barrier, none with one).
package e2e
