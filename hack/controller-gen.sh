#!/usr/bin/env bash
# controller-gen.sh runs controller-gen at the pinned version, installing it
# into the cache outside the clone on first use. Arguments pass through.
set -euo pipefail
version=v0.23.0
cache="${SHARDKEEPER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkeeper}"
bin="$cache/bin/controller-gen-$version"
if [[ ! -x "$bin/controller-gen" ]]; then
	echo "controller-gen.sh: installing controller-gen $version into $bin" >&2
	GOBIN="$bin" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$version"
fi
exec "$bin/controller-gen" "$@"
