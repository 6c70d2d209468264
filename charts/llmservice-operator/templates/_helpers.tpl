{{/* Names, labels and small derived values: every template takes them from here. */}}

{{- define "llmservice-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-CHART, or RELEASE when it already contains the chart name; 63 characters max. */}}
{{- define "llmservice-operator.fullname" -}}
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

{{- define "llmservice-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmservice-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmservice-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmservice-operator.labels" -}}
helm.sh/chart: {{ include "llmservice-operator.chart" . }}
{{ include "llmservice-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: llmservice
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "llmservice-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmservice-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmservice-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "llmservice-operator.peeringName" -}}
{{- default (include "llmservice-operator.fullname" .) .Values.leaderElection.name }}
{{- end }}

{{/* Cluster-wide unless namespaces are listed. */}}
{{- define "llmservice-operator.clusterWide" -}}
{{- if empty .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
The rules the operator needs on namespaced resources, wherever it serves LLMServices.
Server-side apply creates a missing child with PATCH, which the API server authorizes as
both `patch` and `create`; kopf keeps its handler state in annotations (patch) and posts
Events (create); the status publisher patches llmservices/status; the autoscaler patches
llmservices/scale and reads pods (it scrapes their /metrics over plain HTTP, no RBAC).
*/}}
{{- define "llmservice-operator.namespacedRules" -}}
- apiGroups: [llmservice.dev]
  resources: [llmservices]
  verbs: [get, list, watch, patch]
- apiGroups: [llmservice.dev]
  resources: [llmservices/status]
  verbs: [patch]
- apiGroups: [llmservice.dev]
  resources: [llmservices/scale]
  verbs: [get, patch]
# delete: a vllm object that grows past one node swaps its Deployment for a LeaderWorkerSet.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Multi-node vLLM replicas (engine.kind vllm, docs/vllm.md): applied, watched for status,
# deleted when the object is back within one node (a Deployment again).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
# delete: spec.router turned off removes the pods' headless Service (docs/router.md).
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
# The router of an LLMService (docs/router.md): its ServiceAccount, Role and RoleBinding.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
# Not used by the operator itself: RBAC lets it grant only what it holds, and the
# router's Role grants watching the namespace's EndpointSlices.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# spec.gateway.inferencePool (docs/gateway.md): the InferencePool and InferenceObjective
# are applied when on, deleted when off; the operator never lists or watches them.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
- apiGroups: [inference.networking.x-k8s.io]
  resources: [inferenceobjectives]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The VRAM check reads an hf:// model's config.json from the Hub with the token of
# spec.model.hfTokenSecretRef: get by name only (no list or watch of Secrets).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, create, patch]
{{- end }}

{{/* kopf reads the CRD list at start (and watches it for new resources). */}}
{{- define "llmservice-operator.crdRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}

{{/* kopf peering: watch the peers, patch its own keep-alive into the object's status. */}}
{{- define "llmservice-operator.peeringVerbs" -}}
verbs: [list, watch, patch]
{{- end }}

{{/* maxGpuMemoryUtilization as a number in [0.5, 0.95] (`--set` passes it as a string). */}}
{{- define "llmservice-operator.maxGpuMemoryUtilization" -}}
{{- $u := float64 .Values.maxGpuMemoryUtilization }}
{{- if or (lt $u 0.5) (gt $u 0.95) }}
{{- fail (printf "maxGpuMemoryUtilization must lie in [0.5, 0.95] (got %v): never 1.0, activations need 5-10%% of the GPU" .Values.maxGpuMemoryUtilization) }}
{{- end }}
{{- $u }}
{{- end }}
