{{/* Names, labels and the values computed once for every template. */}}

{{- define "triton-embed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; objects add "-triton", "-gateway", ... (at most 63 characters). */}}
{{- define "triton-embed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "triton-embed.triton.name" -}}{{ include "triton-embed.fullname" . }}-triton{{- end -}}
{{- define "triton-embed.gateway.name" -}}{{ include "triton-embed.fullname" . }}-gateway{{- end -}}

{{- define "triton-embed.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "triton-embed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "triton-embed.selectorLabels" (list . "triton") */}}
{{- define "triton-embed.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "triton-embed.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "triton-embed.componentLabels" -}}
{{ include "triton-embed.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The image: "<appVersion>-gpu" or "-cpu" unless image.tag is set. */}}
{{- define "triton-embed.image" -}}
{{- $flavour := ternary "gpu" "cpu" (gt (int .Values.triton.gpusPerPod) 0) -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavour) -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* Embedder stubs of one pod: instancesPerGpu on each GPU, or instancesPerGpu on a CPU pod. */}}
{{- define "triton-embed.embedderStubs" -}}
{{- mul (int .Values.triton.instancesPerGpu) (max 1 (int .Values.triton.gpusPerPod)) -}}
{{- end -}}

{{/* /dev/shm sizeLimit (values.yaml, triton.sharedMemory): (1 + 2 x stubs) x region + headroom. */}}
{{- define "triton-embed.shmSizeLimit" -}}
{{- $shm := .Values.triton.sharedMemory -}}
{{- if $shm.sizeLimit -}}
{{- $shm.sizeLimit -}}
{{- else -}}
{{- $stubs := int (include "triton-embed.embedderStubs" .) -}}
{{- printf "%dMi" (add (mul (add 1 (mul 2 $stubs)) (int $shm.regionMiB)) (int $shm.headroomMiB)) -}}
{{- end -}}
{{- end -}}

{{/* The Triton model config variant: configs/gpu.pbtxt on GPU pods, config.pbtxt on CPU pods. */}}
{{- define "triton-embed.modelConfigName" -}}
{{- if gt (int .Values.triton.gpusPerPod) 0 -}}gpu{{- end -}}
{{- end -}}

{{- define "triton-embed.modelRepositorySource" -}}
{{- if eq .Values.modelRepository.source "volume" -}}
{{- printf "/mnt/model-repository/%s" (.Values.modelRepository.path | trimPrefix "/") | trimSuffix "/" -}}
{{- else -}}
{{- .Values.modelRepository.path | default (printf "%s/model_repository" .Values.image.projectDir) -}}
{{- end -}}
{{- end -}}

{{- define "triton-embed.adminKeySecretName" -}}
{{- .Values.triton.adminKey.existingSecret | default (printf "%s-admin-key" (include "triton-embed.fullname" .)) -}}
{{- end -}}

{{- define "triton-embed.gatewayApiKeySecretName" -}}
{{- .Values.gateway.apiKey.existingSecret | default (printf "%s-gateway-api-key" (include "triton-embed.fullname" .)) -}}
{{- end -}}

{{- define "triton-embed.gatewayTenantsSecretName" -}}
{{- .Values.gateway.tenants.existingSecret | default (printf "%s-gateway-tenants" (include "triton-embed.fullname" .)) -}}
{{- end -}}

{{/* A Secret's value: the one already in the cluster (kept across upgrades), else random. */}}
{{- define "triton-embed.keepOrGenerate" -}}
{{- $root := index . 0 -}}{{- $name := index . 1 -}}{{- $key := index . 2 -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace $name -}}
{{- if and $existing (hasKey ($existing.data | default dict) $key) -}}
{{- index $existing.data $key -}}
{{- else -}}
{{- randAlphaNum 43 | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Guaranteed QoS: requests == limits, whole CPUs. include (dict "cpu" 1 "memory" "1Gi" "gpus" 0) */}}
{{- define "triton-embed.guaranteedResources" -}}
{{- $r := dict "cpu" (toString (int .cpu)) "memory" .memory -}}
{{- if gt (int (.gpus | default 0)) 0 -}}
{{- $_ := set $r "nvidia.com/gpu" (toString (int .gpus)) -}}
{{- end -}}
requests:
{{- range $k, $v := $r }}
  {{ $k }}: {{ $v | quote }}
{{- end }}
limits:
{{- range $k, $v := $r }}
  {{ $k }}: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* Container security: non-root, no privilege escalation, no capabilities. */}}
{{- define "triton-embed.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: {{ .Values.triton.readOnlyRootFilesystem }}
runAsNonRoot: true
runAsUser: {{ .Values.triton.runAsUser }}
runAsGroup: {{ .Values.triton.runAsGroup }}
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "triton-embed.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.triton.runAsUser }}
runAsGroup: {{ .Values.triton.runAsGroup }}
fsGroup: {{ .Values.triton.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The prometheus-adapter rules, as the adapter's config.yaml lists them. */}}
{{- define "triton-embed.adapterRules" -}}
{{- toYaml .Values.autoscaling.prometheusAdapter.rules -}}
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "triton-embed.validate" -}}
{{- if and .Values.autoscaling.enabled .Values.autoscaling.keda.enabled -}}
{{- fail "autoscaling.enabled and autoscaling.keda.enabled are exclusive: KEDA makes its own HPA for the Triton Deployment; enable one of them" -}}
{{- end -}}
{{- if and (or .Values.autoscaling.enabled .Values.autoscaling.keda.enabled) (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if and .Values.gateway.enabled .Values.gateway.autoscaling.enabled (gt (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas)) -}}
{{- fail (printf "gateway.autoscaling.minReplicas (%d) is above gateway.autoscaling.maxReplicas (%d)" (int .Values.gateway.autoscaling.minReplicas) (int .Values.gateway.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if and (eq .Values.modelRepository.source "volume") (empty .Values.modelRepository.volume) -}}
{{- fail "modelRepository.source is volume but modelRepository.volume is empty: give a volume source, e.g. persistentVolumeClaim: {claimName: triton-models}" -}}
{{- end -}}
{{- if .Values.autoscaling.enabled -}}
{{- $produced := list -}}
{{- range .Values.autoscaling.prometheusAdapter.rules -}}{{- $produced = append $produced .name.as -}}{{- end -}}
{{- range .Values.autoscaling.metrics -}}
{{- if not (has .name $produced) -}}
{{- fail (printf "autoscaling.metrics: %s is not produced by autoscaling.prometheusAdapter.rules (they produce %s)" .name (join ", " $produced)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
