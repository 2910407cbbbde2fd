{{/* Names and labels of the bundled PostgreSQL. */}}

{{/* "<release>-postgresql": the PAI chart derives the same name (pai.postgresqlName). */}}
{{- define "postgresql.fullname" -}}
{{- .Values.fullnameOverride | default (printf "%s-postgresql" .Release.Name) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "postgresql.secretName" -}}
{{- .Values.existingSecret | default (include "postgresql.fullname" .) -}}
{{- end -}}

{{- define "postgresql.selectorLabels" -}}
app.kubernetes.io/name: postgresql
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: history-database
{{- end -}}

{{- define "postgresql.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "postgresql.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pai
{{- end -}}
