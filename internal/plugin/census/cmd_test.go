package census

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plugintest"
)

var env *plugintest.Env

func TestMain(m *testing.M) { plugintest.Main(m, &env) }

func withCensus(below bool) func(*topologyv1.ShardTopology) {
	return func(o *topologyv1.ShardTopology) {
		now := metav1.NewTime(time.Now().Add(-10 * time.Second).Truncate(time.Second))
		c := &topologyv1.CensusStatus{ObservedAt: &now, ServerCount: 3, MinVersion: "2.14.9", Servers: []topologyv1.CensusServer{
			{Name: "nats-0", Version: "2.14.9", Cluster: "ingest", Role: "meta-leader"},
			{Name: "nats-1", Version: "2.14.9", Cluster: "ingest", Role: "member"},
			{Name: "nats-2", Version: "2.14.9", Cluster: "ingest", Role: "member"},
		}}
		if below {
			c.MinVersion, c.BelowFloor = "2.12.15", []string{"nats-2"}
			c.Servers[2].Version, c.Servers[2].BelowFloor = "2.12.15", true
		}
		o.Status.Census = c
	}
}

// NAME reads the operator's last census from status: no NATS credentials
// needed where the command runs.
func TestCensusOfATopologyReadsStatus(t *testing.T) {
	tests := []struct {
		name     string
		topo     func(*topologyv1.ShardTopology)
		args     []string
		wantCode int
		want     []string
	}{
		{"every server at the floor", withCensus(false), nil, 0, []string{"floor 2.14.0, lowest 2.14.9: floor met", "nats-0   2.14.9    ingest    meta-leader   ok"}},
		{"a server below the floor exits 1 and is named", withCensus(true), nil, plugin.ExitError, []string{"FLOOR NOT MET, below: nats-2", "nats-2   2.12.15   ingest    member        BELOW FLOOR"}},
		{"-o yaml is status.census", withCensus(false), []string{"-o", "yaml"}, 0, []string{"serverCount: 3", "role: meta-leader"}},
		{"no census yet is an error naming the likely cause", nil, nil, plugin.ExitError, nil},
		{"NAME and --server together are a usage error", withCensus(false), []string{"--server", "nats://127.0.0.1:1"}, plugin.ExitUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.Topology(t, ns, tt.topo)
			r := env.Run(NewCmd, append([]string{"census", "ingest", "-n", ns}, tt.args...)...)
			if r.Code() != tt.wantCode {
				t.Fatalf("exit %d (%v), want %d\n%s", r.Code(), r.Error, tt.wantCode, r.Out)
			}
			for _, want := range tt.want {
				if !strings.Contains(r.Out, want) {
					t.Errorf("output lacks %q:\n%s", want, r.Out)
				}
			}
		})
	}
}
