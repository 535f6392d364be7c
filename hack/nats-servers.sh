#!/usr/bin/env bash
# nats-servers.sh builds the nats-server binaries the mixed-version NATS tests
# run as separate processes, one folder per version, and prints the path of
# each binary, one a line, in the order of the versions asked for.
#
#   hack/nats-servers.sh [version ...]     (default: v2.15.2 v2.14.9 v2.12.15)
#
# Binaries are cached outside the clone, keyed by version, so
# later runs and fresh clones reuse them:
#   ${SHARDKEEPER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkeeper}/nats-server/<version>/nats-server
# Each first build takes a minute or more on 2 cores. There is no 2.13
# release: a real mixed cluster is 2.12 with 2.14.
set -euo pipefail

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(v2.15.2 v2.14.9 v2.12.15)
cache="${SHARDKEEPER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkeeper}"
mkdir -p "$cache/nats-server"
# Test packages run in parallel and may all ask at once: build each version
# once, one build at a time.
if command -v flock >/dev/null; then
	exec 9>"$cache/nats-server/.lock"
	flock 9
fi

for v in "${versions[@]}"; do
	[[ "$v" == v* ]] || v="v$v"
	dir="$cache/nats-server/$v"
	bin="$dir/nats-server"
	if [[ ! -x "$bin" ]]; then
		echo "nats-servers: building nats-server $v into $dir (first time only)" >&2
		mkdir -p "$dir"
		# Build into a scratch folder and move, so an interrupted build never
		# leaves a half-written binary where a test would pick it up.
		tmp="$(mktemp -d "$dir/.build.XXXXXX")"
		# Outside any module, "go install pkg@version" builds the release as
		# its own go.mod pins it.
		(cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath "github.com/nats-io/nats-server/v2@$v")
		mv "$tmp/nats-server" "$bin"
		rmdir "$tmp"
	fi
	echo "$bin"
done
