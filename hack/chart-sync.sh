#!/usr/bin/env bash
# chart-sync.sh: copies into charts/shardkeeper/files the parts of config/
# the chart renders as they are: the CRD, the manager role generated from
# the reconciler's markers, the Prometheus Operator objects and the Grafana
# dashboard. `make generate` runs it; test/helmchart
# TestChartFilesAreCopiesOfConfig fails when a copy is stale.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
files="$root/charts/shardkeeper/files"
mkdir -p "$files"
while read -r from to; do
	cp "$root/$from" "$files/$to"
done <<'LIST'
config/crd/bases/topology.shardkeeper.dev_shardtopologies.yaml crd.yaml
config/rbac/role.yaml manager-role.yaml
config/prometheus/monitor.yaml servicemonitor.yaml
config/prometheus/podmonitor.yaml podmonitor.yaml
config/prometheus/rules.yaml prometheusrule.yaml
config/grafana/shardkeeper-dashboard.json shardkeeper-dashboard.json
LIST
