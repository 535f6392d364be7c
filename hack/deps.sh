#!/usr/bin/env bash
# deps.sh installs what the tests and the demo need from the machine's
# package manager (PostgreSQL server binaries, from Debian's packages) when it
# is missing. Everything else is built from the Go module proxy by
# hack/testbin.sh and hack/nats-servers.sh, which the tests call themselves.
set -euo pipefail

have_postgres() { compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; }

if ! have_postgres || ! id postgres >/dev/null 2>&1; then
	echo "deps.sh: installing PostgreSQL from Debian's packages" >&2
	sudo=""
	[[ $(id -u) -eq 0 ]] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
fi
have_postgres || { echo "deps.sh: PostgreSQL server binaries still missing" >&2; exit 1; }
