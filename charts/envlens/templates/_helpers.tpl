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

{{/* The configuration file: `config`, with `gitlab.token_file` when `gitlabToken` names a Secret. */}}
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
{{- toYaml $config }}
{{- end }}
