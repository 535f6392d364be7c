package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestResolvePrefersStampsAndFallsBackToBuildInfo(t *testing.T) {
	built := func(mainVersion string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: mainVersion}, Settings: settings}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	tests := []struct {
		name               string
		version, revision  string
		read               func() (*debug.BuildInfo, bool)
		wantVer, wantRev   string
		wantGoVersionFixed bool
	}{
		{"stamps win over build info", "v0.1.0", "deadbeef", built("v9.9.9", rev), "v0.1.0", "deadbeef", true},
		{"go build in a checkout gives the vcs revision", "", "", built("(devel)", rev), "(devel)", "abc123", true},
		{"local changes mark the revision dirty", "", "", built("", rev, dirty), "(devel)", "abc123-dirty", true},
		{"go install module@version gives the module version", "", "", built("v0.2.0"), "v0.2.0", "unknown", true},
		{"no build info at all still answers", "", "", none, "(devel)", "unknown", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolve(tt.version, tt.revision, tt.read)
			if got.Version != tt.wantVer || got.Revision != tt.wantRev {
				t.Fatalf("got %+v, want version %q revision %q", got, tt.wantVer, tt.wantRev)
			}
			if tt.wantGoVersionFixed && got.GoVersion != "go1.26.0" {
				t.Fatalf("go version %q, want the build info's", got.GoVersion)
			}
			if got.GoVersion == "" {
				t.Fatal("empty go version")
			}
		})
	}
}

func TestBuildInfoGaugeIsOneWithTheBuildLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector())
	i := Get()
	want := `# HELP shardkeeper_build_info Always 1; the labels say which shardkeeper build is running.
# TYPE shardkeeper_build_info gauge
shardkeeper_build_info{goversion="` + i.GoVersion + `",revision="` + i.Revision + `",version="` + i.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), BuildInfoName); err != nil {
		t.Fatal(err)
	}
}
