{{/* The chart's name, and the release's full name (at most 63 characters, as DNS labels). */}}
{{- define "envlens.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "envlens.fullname" -}}
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

{{- define "envlens.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "envlens.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "envlens.selectorLabels" -}}
app.kubernetes.io/name: {{ include "envlens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "envlens.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "envlens.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the chart generates for the shared secrets not taken from an existing one. */}}
{{- define "envlens.secretsName" -}}
{{- printf "%s-secrets" (include "envlens.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The database Secret, or a failure that says what to do: `envlens serve` without a database URL
starts an embedded PostgreSQL inside the container, whose data would die with the pod.
*/}}
{{- define "envlens.databaseSecret" -}}
{{- if not .Values.database.existingSecret }}
{{- fail "database.existingSecret is required: name a Secret holding the URL of an existing PostgreSQL (key `url`, or database.key), e.g. `kubectl create secret generic envlens-database --from-literal=url=postgres://envlens:PASSWORD@HOST:5432/envlens`, then `--set database.existingSecret=envlens-database`. envlens' embedded PostgreSQL keeps its data inside the pod and is not for Kubernetes." }}
{{- end }}
{{- .Values.database.existingSecret }}
{{- end }}

{{/* Where the configuration file and the secret files are mounted. */}}
{{- define "envlens.configDir" -}}/etc/envlens/config{{- end }}
{{- define "envlens.secretsDir" -}}/etc/envlens/secrets{{- end }}

{{/* The configuration file: `config`, with `gitlab.token_file` when `gitlabToken` names a Secret
and an `in_cluster` entry in `kubernetes.agents` for each of `inClusterAgents`. */}}
{{- define "envlens.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.gitlabToken.existingSecret }}
{{- $gitlab := get $config "gitlab" | default dict }}
{{- if not (get $gitlab "url") }}
{{- fail "gitlabToken.existingSecret needs config.gitlab.url: the GitLab the token is for" }}
{{- end }}
{{- $_ := set $gitlab "token_file" (printf "%s/gitlab-token" (include "envlens.secretsDir" .)) }}
{{- $_ := set $config "gitlab" $gitlab }}
{{- end }}
{{- $inCluster := include "envlens.inClusterAgents" . | fromJsonArray }}
{{- if $inCluster }}
{{- $kubernetes := get $config "kubernetes" | default dict }}
{{- $_ := set $kubernetes "agents" (concat (get $kubernetes "agents" | default list) $inCluster) }}
{{- $_ := set $config "kubernetes" $kubernetes }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The core group's kinds the ClusterRole reads, as JSON: what a resource group lists (every
namespaced kind but Secrets and the create-only Bindings) and what the proxy serves the
browser besides (namespaces). Never `secrets`, never a proxy subresource.
*/}}
{{- define "envlens.coreResources" -}}
{{- list "configmaps" "endpoints" "events" "limitranges" "namespaces" "persistentvolumeclaims" "pods" "podtemplates" "replicationcontrollers" "resourcequotas" "serviceaccounts" "services" | toJson }}
{{- end }}

{{/*
The API groups other than the core one that the ClusterRole reads, as a sorted JSON list: the
groups of .Capabilities.APIVersions (`apps/v1`, `apps/v1/Deployment`, ...; the core group's
`v1` and `v1/Pod` left out: its kinds are named above) and rbac.apiGroups. `*` is refused:
it would name the core group, Secrets included.
*/}}
{{- define "envlens.apiGroups" -}}
{{- $groups := dict }}
{{- range .Capabilities.APIVersions }}
{{- $parts := splitList "/" . }}
{{- if and (gt (len $parts) 1) (ne (first $parts) "v1") }}
{{- $_ := set $groups (first $parts) true }}
{{- end }}
{{- end }}
{{- range .Values.rbac.apiGroups }}
{{- if or (not (kindIs "string" .)) (eq . "") (contains "*" .) (contains "/" .) }}
{{- fail (printf "rbac.apiGroups: %v is not an API group name (e.g. example.com; `*` and the core group \"\" cannot be granted whole)" .) }}
{{- end }}
{{- $_ := set $groups . true }}
{{- end }}
{{- keys $groups | sortAlpha | toJson }}
{{- end }}

{{/*
rbac.secrets.namespaces, checked, as a JSON list: namespace names (DNS labels), never the
release's own namespace, where envlens' own secrets live (SPEC 13).
*/}}
{{- define "envlens.secretNamespaces" -}}
{{- $namespaces := .Values.rbac.secrets.namespaces | default list }}
{{- if not (kindIs "slice" $namespaces) }}
{{- fail "rbac.secrets.namespaces must be a list of namespaces" }}
{{- end }}
{{- range $namespaces }}
{{- if not (and (kindIs "string" .) (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" .)) }}
{{- fail (printf "rbac.secrets.namespaces: %v is not a namespace name" .) }}
{{- end }}
{{- if eq . $.Release.Namespace }}
{{- fail (printf "rbac.secrets.namespaces must not hold the release's own namespace %s: envlens' session and internal secrets live there, and whoever may use an `access_as: {agent: {}}` agent could read them" .) }}
{{- end }}
{{- end }}
{{- $namespaces | uniq | toJson }}
{{- end }}

{{/* The agents served with the pod's own service account, as `kubernetes.agents` entries. */}}
{{- define "envlens.inClusterAgents" -}}
{{- $entries := list }}
{{- range .Values.inClusterAgents }}
{{- if not (or (kindIs "string" .) (kindIs "int" .) (kindIs "int64" .) (kindIs "float64" .)) }}
{{- fail (printf "inClusterAgents: %v is neither an agent id nor `<project path>:<agent name>`" .) }}
{{- end }}
{{- $entries = append $entries (dict "agent" . "in_cluster" true) }}
{{- end }}
{{- toJson $entries }}
{{- end }}
