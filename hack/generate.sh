#!/usr/bin/env bash
# generate.sh regenerates deepcopy code, the CRD and the RBAC role from the
# markers in api/ and controllers/. With an argument DIR it writes them under
# DIR instead (DIR/object, DIR/crd, DIR/rbac), which the staleness test uses.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ $# -eq 1 ]]; then
	obj="output:object:dir=$1/object" crd="output:crd:dir=$1/crd" rbac="output:rbac:dir=$1/rbac"
else
	obj="output:object:dir=api/v1alpha1" crd="output:crd:dir=config/crd/bases" rbac="output:rbac:dir=config/rbac"
fi
hack/controller-gen.sh \
	object:headerFile=hack/boilerplate.go.txt paths=./api/... "$obj" \
	crd paths=./api/... "$crd" \
	rbac:roleName=shardkeeper-manager paths=./controllers/... "$rbac"
