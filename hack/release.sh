#!/usr/bin/env bash
# release.sh OUT: writes the release VERSION (env, vX.Y.Z) into OUT, offline:
#   install.yaml, install-namespaced.yaml  config/default and config/namespaced
#                                          with the operator image IMAGE_REPO:VERSION
#   shardkeeper-X.Y.Z.tgz                  the Helm chart, version X.Y.Z,
#                                          appVersion and image tag VERSION
#   kubectl-shardkeeper_VERSION_OS_ARCH.tar.gz
#                                          the kubectl plugin and LICENSE for
#                                          linux and darwin on amd64 and arm64
#   shardkeeper.yaml                       the krew manifest (plugins/shardkeeper.yaml
#                                          filled with those archives' sums)
#   checksums.txt                          SHA-256 of every file above
# `make release VERSION=v0.1.0` runs it; test/release checks each artifact.
# The images are `make oci-images VERSION=...` (or docker-build), pushed
# by the release's owner.
set -euo pipefail
if [[ $# -ne 1 || -z ${VERSION:-} ]]; then
	echo "usage: VERSION=vX.Y.Z [IMAGE_REPO=repo] $0 OUT" >&2
	exit 2
fi
out=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! [[ $VERSION =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: VERSION $VERSION is not a release tag like v1.2.3 (or v1.2.3-rc.1)" >&2
	exit 2
fi
if ! grep -q "^## \[${VERSION#v}\]\|^## ${VERSION}\b\|^## \[${VERSION}\]" CHANGELOG.md; then
	echo "release.sh: CHANGELOG.md has no entry for $VERSION" >&2
	exit 1
fi
image_repo=${IMAGE_REPO:-shardkeeper}
revision=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
chart_version=${VERSION#v}
# Archives get this time and root ownership, so the same sources give the
# same bytes (the commit's time when there is one).
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
tarflags=(--sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch")

mkdir -p "$out" bin
stage=$(mktemp -d "$root/bin/release.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# 1. The install manifests.
hack/install-manifest.sh "$image_repo:$VERSION" "$out/install.yaml"
hack/install-manifest.sh "$image_repo:$VERSION" "$out/install-namespaced.yaml" config/namespaced

# 2. The chart, its versions and default image set to the release's.
cp -r charts/shardkeeper "$stage/shardkeeper"
sed -i -e "s/^version: .*/version: $chart_version/" -e "s/^appVersion: .*/appVersion: $VERSION/" "$stage/shardkeeper/Chart.yaml"
sed -i -e "0,/^  repository: .*/s##  repository: $image_repo#" "$stage/shardkeeper/values.yaml"
tar -C "$stage" "${tarflags[@]}" -cf - shardkeeper | gzip -n >"$out/shardkeeper-$chart_version.tgz"
echo "release.sh: wrote $out/shardkeeper-$chart_version.tgz" >&2

# 3. The kubectl plugin per platform.
ldflags="-s -w -X github.com/shardkeeper/shardkeeper/internal/version.version=$VERSION -X github.com/shardkeeper/shardkeeper/internal/version.revision=$revision"
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${platform%/*} arch=${platform#*/}
	dir="$stage/plugin_${os}_${arch}"
	mkdir -p "$dir"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$dir/kubectl-shardkeeper" ./cmd/kubectl-shardkeeper
	cp LICENSE "$dir/LICENSE"
	archive="kubectl-shardkeeper_${VERSION}_${os}_${arch}.tar.gz"
	tar -C "$dir" "${tarflags[@]}" -cf - kubectl-shardkeeper LICENSE | gzip -n >"$out/$archive"
	echo "release.sh: wrote $out/$archive" >&2
done

# 4. The krew manifest, filled with the archives' sums and validated.
go run ./hack/krewmanifest -template plugins/shardkeeper.yaml -version "$VERSION" -dist "$out" >"$stage/shardkeeper.yaml"
mv "$stage/shardkeeper.yaml" "$out/shardkeeper.yaml"

# 5. The sums of everything above.
(
	cd "$out"
	sha256sum install.yaml install-namespaced.yaml "shardkeeper-$chart_version.tgz" kubectl-shardkeeper_"${VERSION}"_*.tar.gz shardkeeper.yaml >checksums.txt
)
echo "release.sh: wrote release $VERSION into $out" >&2
