package version

import (
	"strings"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

// version needs no cluster: it answers even with kubectl's flags pointing
// at one.
func TestVersionPrintsTheBuildIdentity(t *testing.T) {
	r := env.Run(NewCmd, "version")
	if r.Error != nil || !strings.HasPrefix(r.Out, "kubectl-shardkeeper ") || !strings.Contains(r.Out, "revision") {
		t.Fatalf("version %v: %q", r.Error, r.Out)
	}
}
