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

{{/* The balloon Deployments' namespace: --balloon-namespace (binary default vmss-autoscaler-balloons). */}}
{{- define "vmss-autoscaler.balloonNamespace" -}}
{{- include "vmss-autoscaler.flag" (list . "balloon-namespace" "vmss-autoscaler-balloons") }}
{{- end }}

{{/* The preflight label key (--preflight-label). */}}
{{- define "vmss-autoscaler.preflightLabel" -}}
{{- include "vmss-autoscaler.flag" (list . "preflight-label" "vmss-autoscaler.io/preflight") }}
{{- end }}

{{/* The preflight taint's effect: the part of --preflight-taint after ":". */}}
{{- define "vmss-autoscaler.preflightTaintEffect" -}}
{{- $t := include "vmss-autoscaler.flag" (list . "preflight-taint" "vmss-autoscaler.io/preflight=pending:NoSchedule") }}
{{- regexReplaceAll "^[^:]*:" $t "" }}
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
The flags the binary takes on the command line only (config.go,
commandLineOnly): identity, endpoints, credentials' files, images, leader
election, the APIs it needs RBAC for, where logs go. It
refuses them in the flags ConfigMap, which its editors write, not the
Deployment's: the chart passes these keys of .Values.config as arguments
(commandLineOnlyArgs). charts/chart_test.go checks this list against the
binary's --help.
*/}}
{{- define "vmss-autoscaler.commandLineOnlyKeys" -}}
azure-arm-endpoint azure-authority-host azure-token-audience azure-ca-file azure-token-file azure-client-secret-file azure-auth azure-tenant-id azure-client-id azure-subscription-id kubeconfig balloon-image balloon-max-replicas leader-elect leader-elect-lease-duration leader-elect-renew-deadline leader-elect-retry-period leader-elect-resource-name enable-provisioning-requests enable-capacity-buffers log_dir log_file log_file_max_size logtostderr alsologtostderr one_output stderrthreshold
{{- end }}

{{/* The command-line-only keys of .Values.config whose value is set (not null, "" or []), as arguments: a YAML list. */}}
{{- define "vmss-autoscaler.commandLineOnlyArgs" -}}
{{- $cli := splitList " " (include "vmss-autoscaler.commandLineOnlyKeys" .) }}
{{- $args := list }}
{{- range $k, $v := .Values.config }}
{{- if and (has (trimPrefix "--" $k) $cli) (not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "slice" $v) (eq (len $v) 0)))) }}
{{- range $x := ternary $v (list $v) (kindIs "slice" $v) }}
{{- $args = append $args (printf "--%s=%v" (trimPrefix "--" $k) $x) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
The flags ConfigMap's config.yaml: .Values.config without the keys whose
value is null, "" or an empty list (so the binary's defaults apply) and
without the command-line-only keys (arguments: commandLineOnlyArgs), in
sorted order. false and 0 are kept.
*/}}
{{- define "vmss-autoscaler.configYAML" -}}
{{- $cli := splitList " " (include "vmss-autoscaler.commandLineOnlyKeys" .) }}
{{- $out := dict }}
{{- range $k, $v := .Values.config }}
{{- if not (or (has (trimPrefix "--" $k) $cli) (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "slice" $v) (eq (len $v) 0))) }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- if $out }}
{{- toYaml $out }}
{{- else }}
{{- "{}" }}
{{- end }}
{{- end }}

{{/*
The preflight check library (values preflight.library, README "Preflight
check library"): the enabled entries as checks, each built from its few
parameters. Call with (dict "lib" .Values.preflight.library "slow" false)
for the quick ones (GPU count and model, ECC, XID, InfiniBand: about a
second each) or "slow" true for DCGM diagnostics and the NCCL all-reduce.
Output: a YAML list of checks (possibly []). Every rule here is tested
against fixtures of the real tools' output in preflight/agent (library_test.go).
*/}}
{{- define "vmss-autoscaler.preflightLibrary" -}}
{{- $lib := .lib }}
{{- $out := list }}
{{- if not .slow }}
{{- with $lib.gpus }}{{ if .enabled }}
{{- /* "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0": one line per GPU. */}}
{{- $out = append $out (dict "name" "gpus" "timeout" .timeout
      "command" (list "nvidia-smi" "--query-gpu=index,name,pci.bus_id" "--format=csv,noheader")
      "match" (printf "^\\s*\\d+, %s, " (regexQuoteMeta .model)) "minMatches" (int .count)
      "mustNotMatch" "Unable to determine the device handle|\\[GPU requires reset\\]|\\[Unknown Error\\]") }}
{{- end }}{{ end }}
{{- with $lib.ecc }}{{ if .enabled }}
{{- /* "0, Enabled, 0": ECC on and no uncorrectable error since the driver loaded, on every GPU. */}}
{{- $out = append $out (dict "name" "ecc" "timeout" .timeout
      "command" (list "nvidia-smi" "--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total" "--format=csv,noheader,nounits")
      "match" "^\\s*\\d+, Enabled, (\\S+)\\s*$" "minMatches" (int $lib.gpus.count) "max" 0) }}
{{- end }}{{ end }}
{{- with $lib.xid }}{{ if .enabled }}
{{- /* "NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.", and the driver's multi-line "fallen off the bus" without an XID. */}}
{{- $xids := list }}{{ range .xids }}{{ $xids = append $xids (toString (int .)) }}{{ end }}
{{- $out = append $out (dict "name" "xid" "timeout" .timeout "command" (list "dmesg")
      "mustNotMatch" (printf "NVRM: Xid \\(PCI:[0-9A-Fa-f:.]+\\): (?:%s)\\b|NVRM: .*fallen off the bus" (join "|" $xids))) }}
{{- end }}{{ end }}
{{- with $lib.infiniband }}{{ if .enabled }}
{{- /* ibstat: per port "State: Active" and "Rate: 400"; a port Down, Initializing (no subnet manager) or Armed fails. */}}
{{- $out = append $out (dict "name" "infiniband" "timeout" .timeout "command" (list "ibstat")
      "match" (printf "^\\s*Rate: %d\\s*$" (int .rate)) "minMatches" (int .ports)
      "mustNotMatch" "^\\s*State: (?:Down|Initializing|Armed)\\s*$") }}
{{- end }}{{ end }}
{{- else }}
{{- with $lib.dcgm }}{{ if .enabled }}
{{- /* dcgmi diag's table: "| memory | Fail", "|  | GPU3: Fail" (DCGM 4), "| PCIe | Fail - All" (DCGM 3). */}}
{{- $timeout := .timeout }}
{{- if not $timeout }}{{ $timeout = index (dict "1" "2m" "2" "10m" "3" "45m" "4" "3h") (toString (int .level)) }}{{ end }}
{{- $out = append $out (dict "name" "dcgm" "timeout" (required "preflight.library.dcgm.level: must be 1, 2, 3 or 4" $timeout)
      "command" (list "dcgmi" "diag" "-r" (toString (int .level)))
      "match" "^Successfully ran diagnostic for group" "mustNotMatch" "\\|\\s*(?:GPU ?\\d+: )?Fail\\b") }}
{{- end }}{{ end }}
{{- with $lib.allReduce }}{{ if .enabled }}
{{- /* nccl-tests: "# Avg bus bandwidth    : 401.2" (GB/s); "# Out of bounds values : 3 FAILED" when results were wrong. */}}
{{- $out = append $out (dict "name" "all-reduce" "timeout" .timeout
      "command" (list "all_reduce_perf" "-b" .minBytes "-e" .maxBytes "-f" "2" "-g" (toString (int $lib.gpus.count)))
      "match" "^# Avg bus bandwidth\\s*:\\s*([0-9.]+)" "min" .minBusBandwidth
      "mustNotMatch" "^# Out of bounds values\\s*:\\s*[1-9]"
      "retries" (int .retries) "retryDelay" "10s") }}
{{- end }}{{ end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
A preflight checks.yaml: the quick library checks, then the given checks
(preflight.checks or preflight.periodic.checks), then the slow library
checks. Call with (dict "root" . "checks" <checks values> "quick" bool "slow" bool).
*/}}
{{- define "vmss-autoscaler.preflightChecksYAML" -}}
{{- $lib := .root.Values.preflight.library }}
{{- $all := list }}
{{- if .quick }}{{ $all = concat $all (include "vmss-autoscaler.preflightLibrary" (dict "lib" $lib "slow" false) | fromYamlArray) }}{{ end }}
{{- $all = concat $all (default list .checks.checks) }}
{{- if .slow }}{{ $all = concat $all (include "vmss-autoscaler.preflightLibrary" (dict "lib" $lib "slow" true) | fromYamlArray) }}{{ end }}
{{- if not $all }}{{ fail "preflight: no check at all: enable a preflight.library entry or list checks" }}{{ end }}
{{- $cfg := omit .checks "checks" }}
{{- $_ := set $cfg "checks" $all }}
{{- toYaml $cfg }}
{{- end }}

{{/*
Fails the render when the balloon namespace would widen what the
autoscaler's token may do (the binary refuses the same at start): the
autoscaler may create, update and delete Deployments there, so it must be
neither kube-system (a Deployment there may run as any of its
ServiceAccounts: cluster-admin) nor the release namespace (its own
ServiceAccount), and Pod Security admission must enforce "restricted" there
(the chart labels the namespace it creates; one made by hand is asserted
with balloons.namespacePodSecurityEnforced). Outputs nothing.
*/}}
{{- define "vmss-autoscaler.balloonNamespaceChecks" -}}
{{- $ns := include "vmss-autoscaler.balloonNamespace" . }}
{{- $label := "pod-security.kubernetes.io/enforce=restricted" }}
{{- if eq $ns "kube-system" }}
{{- fail "config.balloon-namespace: must not be kube-system: the autoscaler may create and update Deployments in the balloon namespace, and a Deployment in kube-system may run as any ServiceAccount there (cluster-admin). Use a namespace of its own (default vmss-autoscaler-balloons)" }}
{{- end }}
{{- if eq $ns .Release.Namespace }}
{{- fail (printf "config.balloon-namespace: must not be the release namespace %s: the autoscaler may create and update Deployments in the balloon namespace, and a Deployment there may run as the autoscaler's own ServiceAccount. Use a namespace of its own (default vmss-autoscaler-balloons)" $ns) }}
{{- end }}
{{- if .Values.balloons.createNamespace }}
{{- if ne .Values.balloons.podSecurity "restricted" }}
{{- fail (printf "balloons.podSecurity: must be restricted, got %s: whoever holds the autoscaler's token may create Deployments in config.balloon-namespace (%s), and Pod Security restricted keeps their pods unprivileged; the binary refuses a balloon namespace without %s" .Values.balloons.podSecurity $ns $label) }}
{{- end }}
{{- else if not .Values.balloons.namespacePodSecurityEnforced }}
{{- fail (printf "balloons.createNamespace is false, so the chart cannot label config.balloon-namespace (%s) with %s. Label it yourself (kubectl label namespace %s %s) and set balloons.namespacePodSecurityEnforced: true; the binary refuses to start on a balloon namespace without that label" $ns $label $ns $label) }}
{{- end }}
{{- end }}
