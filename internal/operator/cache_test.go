package operator

import (
	"fmt"
	"strings"
	"testing"
)

// Secrets are read uncached unless the benchmark's comparison asks for the
// earlier full Secret informer; Pods are never cached.
func TestOnlyTheBenchmarkKnobCachesSecrets(t *testing.T) {
	kinds := func(o Options) string {
		var out []string
		for _, obj := range uncachedReads(o) {
			out = append(out, fmt.Sprintf("%T", obj))
		}
		return strings.Join(out, ",")
	}
	if got := kinds(Options{}); got != "*v1.Secret,*v1.Pod" {
		t.Fatalf("default: uncached reads %s, want Secrets and Pods", got)
	}
	if got := kinds(Options{FullSecretCache: true}); got != "*v1.Pod" {
		t.Fatalf("--full-secret-cache: uncached reads %s, want Pods only", got)
	}
}
