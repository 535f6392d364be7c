// Package release tests `make release` (hack/release.sh): it writes a
// release into a temporary directory, offline, and checks each artifact:
// the install manifests pinned to the version, the packaged chart, the
// plugin archives for every platform with the right binaries, the
// checksums and the krew manifest. It also checks that the tree names one
// version everywhere a user reads one (CHANGELOG.md, config/, the chart).
package release
