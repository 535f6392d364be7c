#!/usr/bin/env bash
# testbin.sh builds the test bed's control-plane binaries (kube-apiserver,
# kube-controller-manager, etcd) from their Go modules and prints the
# directory to use as KUBEBUILDER_ASSETS.
#
# Binaries are cached outside the clone, keyed by version, so later runs and
# fresh clones reuse them:  ${SHARDKEEPER_CACHE:-$XDG_CACHE_HOME/shardkeeper}/testbin/<key>
# The first build takes several minutes on 2 cores.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version() { (cd "$root/hack/tools/$1" && go list -m -f '{{.Version}}' "$2"); }
kube_version="$(version kube k8s.io/kubernetes)"
etcd_version="$(version etcd go.etcd.io/etcd/server/v3)"
cache="${SHARDKEEPER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkeeper}"
dir="$cache/testbin/kube-${kube_version}_etcd-${etcd_version}_$(go env GOOS)-$(go env GOARCH)"

build() { # build <module dir> <package> <output name>
	local out="$dir/$3"
	[[ -x "$out" ]] && return 0
	echo "testbin: building $3 into $dir (first time only)" >&2
	mkdir -p "$dir"
	(cd "$root/hack/tools/$1" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp" "$2")
	mv "$out.tmp" "$out"
}

build etcd . etcd
build kube ./kube-apiserver kube-apiserver
build kube ./kube-controller-manager kube-controller-manager
echo "$dir"
