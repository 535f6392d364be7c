// Package version says which build of shardkeeper is running: the version
// and VCS revision stamped at link time (the Makefile's -X ldflags), with
// the module build information Go records in every binary as the fallback
// for `go build` and `go run` without them. The operator, the reference
// worker and kubectl-shardkeeper print it for --version and the first two
// export it as the shardkeeper_build_info gauge, so a fleet on a mixed
// rollout shows which pods run which build.
//
// It owns the build identity only; where each binary serves its metrics
// stays with that binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time by the Makefile:
//
//	-X github.com/shardkeeper/shardkeeper/internal/version.version=v0.1.0
//	-X github.com/shardkeeper/shardkeeper/internal/version.revision=<commit>
//
// They are variables, not constants, because -X can only set variables.
var (
	version  string
	revision string
)

// Info is the build identity of the running binary.
type Info struct {
	// Version is a release tag (v0.1.0), a `git describe` string, or
	// "(devel)" for an unstamped build of the main module.
	Version string `json:"version"`
	// Revision is the VCS commit, suffixed "-dirty" when the tree had
	// local changes, or "unknown".
	Revision string `json:"revision"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goVersion"`
}

// Get returns the running binary's build identity.
func Get() Info {
	return resolve(version, revision, debug.ReadBuildInfo)
}

// resolve prefers the link-time stamps and falls back, field by field, to
// the build information: `go build` in a git checkout records
// vcs.revision and vcs.modified, and `go install module@version` records
// the module version.
func resolve(stampedVersion, stampedRevision string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stampedVersion, Revision: stampedRevision, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = "(devel)"
		if ok && bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
	}
	if info.Revision == "" {
		info.Revision = "unknown"
		if ok {
			info.Revision = vcsRevision(bi)
		}
	}
	return info
}

func vcsRevision(bi *debug.BuildInfo) string {
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return "unknown"
	case dirty:
		return rev + "-dirty"
	default:
		return rev
	}
}

// String is the one line --version prints: "<program> <version>
// (revision <revision>, <go version>)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}

// Print writes the --version line for program to stdout.
func Print(program string) {
	fmt.Printf("%s %s\n", program, Get())
}

// BuildInfoName is the name of the gauge NewCollector exports.
const BuildInfoName = "shardkeeper_build_info"

// NewCollector returns a gauge, always 1, labelled with the build identity:
// shardkeeper_build_info{version,revision,goversion}. Each call returns a
// new collector so that every registry gets its own.
func NewCollector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        BuildInfoName,
		Help:        "Always 1; the labels say which shardkeeper build is running.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}
