{{/* Chart name. */}}
{{- define "vmss-autoscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: vmss-autoscaler for a release of that name. */}}
{{- define "vmss-autoscaler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "vmss-autoscaler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "vmss-autoscaler.labels" -}}
helm.sh/chart: {{ include "vmss-autoscaler.chart" . }}
app.kubernetes.io/name: {{ include "vmss-autoscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vmss-autoscaler
{{- end }}

{{/* Selector of the autoscaler's pods. */}}
{{- define "vmss-autoscaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vmss-autoscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: autoscaler
{{- end }}

{{/* Selector of the preflight agent's pods; $mode is "pending" or "periodic". */}}
{{- define "vmss-autoscaler.preflightSelectorLabels" -}}
app.kubernetes.io/name: {{ include "vmss-autoscaler.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: preflight-{{ .mode }}
{{- end }}

{{- define "vmss-autoscaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vmss-autoscaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "vmss-autoscaler.preflightServiceAccountName" -}}
{{- if .Values.preflight.serviceAccount.create }}
{{- default (printf "%s-preflight" (include "vmss-autoscaler.fullname" .)) .Values.preflight.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.preflight.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image: repository[:tag][@digest] from a map with repository, tag, digest; tag defaults to appVersion. */}}
{{- define "vmss-autoscaler.imageRef" -}}
{{- $img := .image }}
{{- $repo := required "image.repository is required" $img.repository }}
{{- if $img.digest }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "vmss-autoscaler.image" -}}
{{- include "vmss-autoscaler.imageRef" (dict "image" .Values.image "root" .) }}
{{- end }}

{{/* The preflight agent's image: preflight.image.* where set, else image.*. */}}
{{- define "vmss-autoscaler.preflightImage" -}}
{{- $p := .Values.preflight.image }}
{{- if $p.repository }}
{{- include "vmss-autoscaler.imageRef" (dict "image" $p "root" .) }}
{{- else }}
{{- include "vmss-autoscaler.image" . }}
{{- end }}
{{- end }}

{{/*
A flag's value in .Values.config, or the binary's default for it. Used where
the chart must agree with the binary on a name (status ConfigMap, Lease,
priority expander ConfigMap, balloon PriorityClass and namespace, labels).
Call: include "vmss-autoscaler.flag" (list . "flag-name" "default").
*/}}
{{- define "vmss-autoscaler.flag" -}}
{{- $root := index . 0 }}
{{- $v := index $root.Values.config (index . 1) }}
{{- if or (kindIs "invalid" $v) (eq (toString $v) "") }}
{{- index . 2 }}
{{- else }}
{{- $v }}
{{- end }}
{{- end }}

{{/* The balloon Deployments' namespace: --balloon-namespace (binary default kube-system). */}}
{{- define "vmss-autoscaler.balloonNamespace" -}}
{{- include "vmss-autoscaler.flag" (list . "balloon-namespace" "kube-system") }}
{{- end }}

{{/* The preflight label key (--preflight-label). */}}
{{- define "vmss-autoscaler.preflightLabel" -}}
{{- include "vmss-autoscaler.flag" (list . "preflight-label" "vmss-autoscaler.io/preflight") }}
{{- end }}

{{/* The preflight taint's key: the part of --preflight-taint before "=" or ":". */}}
{{- define "vmss-autoscaler.preflightTaintKey" -}}
{{- $t := include "vmss-autoscaler.flag" (list . "preflight-taint" "vmss-autoscaler.io/preflight=pending:NoSchedule") }}
{{- regexReplaceAll "[=:].*$" $t "" }}
{{- end }}

{{/* The job label of the scraped series. */}}
{{- define "vmss-autoscaler.job" -}}
{{- default (include "vmss-autoscaler.fullname" .) .Values.prometheusRule.job }}
{{- end }}

{{/*
The flags ConfigMap's config.yaml: .Values.config without the keys whose
value is null, "" or an empty list (so the binary's defaults apply), in
sorted order. false and 0 are kept.
*/}}
{{- define "vmss-autoscaler.configYAML" -}}
{{- $out := dict }}
{{- range $k, $v := .Values.config }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "slice" $v) (eq (len $v) 0))) }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- if $out }}
{{- toYaml $out }}
{{- else }}
{{- "{}" }}
{{- end }}
{{- end }}
