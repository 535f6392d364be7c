{{/*
Labels Helm adds to every object's metadata, beside those the objects of
config/ carry. The comparison test strips exactly these keys.
*/}}
{{- define "shardkeeper.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The operator image reference. */}}
{{- define "shardkeeper.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
An object read from files/ (a copy of config/, kept equal by
hack/chart-sync.sh, checked by test/helmchart), with the release's namespace when
namespaced and Helm's labels added. Call with (list $ "files/x.yaml" namespaced).
*/}}
{{- define "shardkeeper.fileObject" -}}
{{- $root := index . 0 -}}
{{- $obj := $root.Files.Get (index . 1) | fromYaml -}}
{{- if index . 2 -}}
{{- $_ := set $obj.metadata "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $labels := merge (default dict $obj.metadata.labels) (include "shardkeeper.helmLabels" $root | fromYaml) -}}
{{- $_ := set $obj.metadata "labels" $labels -}}
{{ toYaml $obj }}
{{- end }}
