package verify

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImageBinariesLinkNoNATSServer fails when a binary that ships (the
// operator and the worker, in the images; the kubectl plugin, in the
// release archives) would link a package of a module it has no use for at
// run time: the NATS server (it only talks to one; every nats-server
// advisory would flag the images, and it doubled the operator image) or
// Helm (only the chart's test renders charts).
//
// It reads `go list -deps`, the packages the linker is given: a superset
// of what `go version -m` reports for the built binary, so passing here
// means the binaries cannot carry them.
func TestImageBinariesLinkNoNATSServer(t *testing.T) {
	root := repoRoot(t)
	forbidden := []string{"github.com/nats-io/nats-server/", "helm.sh/helm/"}
	for _, pkg := range []string{".", "./cmd/shardkeeper-worker", "./cmd/kubectl-shardkeeper"} {
		t.Run(pkg, func(t *testing.T) {
			cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pkg)
			cmd.Dir = root
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", pkg, err)
			}
			deps := map[string]bool{}
			importers := map[string][]string{}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				fields := strings.Fields(line)
				deps[fields[0]] = true
				for _, imp := range fields[1:] {
					importers[imp] = append(importers[imp], fields[0])
				}
			}
			if len(deps) < 50 {
				t.Fatalf("go list -deps %s listed %d packages: too few for the real binary, the check is broken", pkg, len(deps))
			}
			for _, f := range forbidden {
				var linked int
				for dep := range deps {
					if !strings.HasPrefix(dep, f) {
						continue
					}
					linked++
					// Name only the edges into the module: where to cut.
					if from := outside(importers[dep], f); len(from) > 0 {
						t.Errorf("%s links %s, imported by %v", pkg, dep, from)
					}
				}
				if linked > 0 {
					t.Errorf("%s links %d packages of %s", pkg, linked, f)
				}
			}
		})
	}
}

// outside keeps the importers that are not themselves in the forbidden
// module, which are where the import path must be cut.
func outside(importers []string, module string) []string {
	var keep []string
	for _, imp := range importers {
		if !strings.HasPrefix(imp, module) {
			keep = append(keep, imp)
		}
	}
	return keep
}
