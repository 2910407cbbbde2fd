{{/* Names, labels and small values shared by every template of the PAI chart. */}}

{{- define "pai.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pai.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>", kept within the 63 characters of a DNS label. */}}
{{- define "pai.componentName" -}}
{{- printf "%s-%s" (include "pai.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pai.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pai.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pai
{{- end -}}

{{/* Selector of one component; `dict "root" $ "component" "rest"`. */}}
{{- define "pai.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pai.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pai.componentLabels" -}}
{{ include "pai.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference of a PAI service; `dict "root" $ "svc" <its values>`. */}}
{{- define "pai.image" -}}
{{- $tag := .svc.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s%s:%s" .root.Values.image.registry .svc.image.repository (toString $tag) -}}
{{- end -}}

{{/*
The URL every service connects to: the bundled NATS or the external one. With
several bundled NATS replicas, every pod by its stable DNS name, comma-separated
(Config.nats_url takes a list): a client whose server goes moves to the next.
*/}}
{{- define "pai.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- $name := include "pai.componentName" (dict "root" . "component" "nats") -}}
{{- $scheme := ternary "tls" "nats" (eq (include "pai.natsTls" .) "true") -}}
{{- if gt (int .Values.nats.replicas) 1 -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "%s://%s-%d.%s-headless.%s.svc:%v" $scheme $name $i $name $.Release.Namespace $.Values.nats.port) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- printf "%s://%s:%v" $scheme $name .Values.nats.port -}}
{{- end -}}
{{- else -}}
{{- required "nats.externalUrl is required when nats.enabled is false" .Values.nats.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* Copies of every stream and bucket the bootstrap Job makes: the bundled NATS's
replicas, or nats.externalReplicas for an external cluster. */}}
{{- define "pai.storeReplicas" -}}
{{- if .Values.nats.enabled -}}
{{- .Values.nats.replicas -}}
{{- else -}}
{{- .Values.nats.externalReplicas -}}
{{- end -}}
{{- end -}}

{{- define "pai.launcherServiceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pai.componentName" (dict "root" . "component" "launcher")) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pai.jobNamespace" -}}
{{- include "pai.jobsNamespaceName" . -}}
{{- end -}}

{{/*
The cluster config as the scheduler reads it: the `cluster` value as a mapping, or
as text (--set-file), or the example layout when it is empty. Hashed into a pod
annotation, so a change restarts the scheduler.
*/}}
{{- define "pai.clusterYaml" -}}
{{- $cluster := .Values.cluster -}}
{{- $text := "" -}}
{{- if kindIs "string" $cluster -}}
{{- $text = $cluster -}}
{{- else if $cluster -}}
{{- $text = toYaml $cluster -}}
{{- else -}}
{{- $text = .Files.Get "files/cluster-example.yaml" -}}
{{- end -}}
{{- $parsed := fromYaml $text -}}
{{- if or (hasKey $parsed "Error") (not (hasKey $parsed "physicalCluster")) (not (hasKey $parsed "virtualClusters")) -}}
{{- fail "cluster: a HiveD-format layout with physicalCluster and virtualClusters is required" -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/* The bundled PostgreSQL's Service and Secret (charts/postgresql names them alike). */}}
{{- define "pai.postgresqlName" -}}
{{- .Values.postgresql.fullnameOverride | default (printf "%s-postgresql" .Release.Name) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Where rest's job history lives, checked once: "secret" (history.existingSecret),
"dsn" (history.dsn, in the chart's Secret) or "bundled" (charts/postgresql).
*/}}
{{- define "pai.historySource" -}}
{{- $history := .Values.history -}}
{{- if .Values.config.history_dsn -}}
{{- fail "config.history_dsn: set history.dsn or history.existingSecret instead (the chart gives the DSN to rest alone, from a Secret)" -}}
{{- end -}}
{{- if and $history.dsn $history.existingSecret -}}
{{- fail "history: set history.dsn or history.existingSecret, not both" -}}
{{- end -}}
{{- $external := or $history.dsn $history.existingSecret -}}
{{- if and $external .Values.postgresql.enabled -}}
{{- fail "history: a database is given (history.dsn or history.existingSecret), so set postgresql.enabled=false; the bundled PostgreSQL would run unused" -}}
{{- end -}}
{{- if $history.existingSecret -}}
secret
{{- else if $history.dsn -}}
dsn
{{- else if .Values.postgresql.enabled -}}
bundled
{{- else -}}
{{- fail "history: rest needs a PostgreSQL for the job history: set history.dsn, history.existingSecret, or postgresql.enabled=true (docs/deploy.md, History database)" -}}
{{- end -}}
{{- end -}}

{{/* rest's PAI_HISTORY_DSN (config history_dsn), from a Secret whichever the source. */}}
{{- define "pai.historyEnv" -}}
{{- $source := include "pai.historySource" . -}}
{{- if eq $source "bundled" -}}
{{- $pg := .Values.postgresql -}}
{{- $host := printf "%s.%s.svc" (include "pai.postgresqlName" .) .Release.Namespace -}}
# The bundled PostgreSQL: Kubernetes puts the password from its Secret into the
# DSN ($(HISTORY_DB_PASSWORD): a variable set before it; letters and digits only).
- name: HISTORY_DB_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $pg.existingSecret | default (include "pai.postgresqlName" .) }}
      key: password
- name: PAI_HISTORY_DSN
  value: {{ printf "postgresql+asyncpg://%s:$(HISTORY_DB_PASSWORD)@%s:%v/%s" $pg.username $host $pg.port $pg.database | quote }}
{{- else -}}
- name: PAI_HISTORY_DSN
  valueFrom:
    secretKeyRef:
      {{- if eq $source "secret" }}
      name: {{ .Values.history.existingSecret }}
      key: {{ .Values.history.existingSecretKey }}
      {{- else }}
      name: {{ include "pai.componentName" (dict "root" . "component" "history") }}
      key: dsn
      {{- end }}
{{- end -}}
{{- end -}}

{{/* The Secret of the bus's logins (one secret per NATS user, and the route
password): the operator's (nats.existingSecret) or the one the release-secrets hook makes. */}}
{{- define "pai.busCredentialsSecret" -}}
{{- .Values.nats.existingSecret | default (include "pai.componentName" (dict "root" . "component" "bus-credentials")) -}}
{{- end -}}

{{- define "pai.jobSecretsKeySecret" -}}
{{- .Values.jobSecrets.existingSecret | default (include "pai.componentName" (dict "root" . "component" "job-secrets-key")) -}}
{{- end -}}

{{- define "pai.adminTokenSecret" -}}
{{- .Values.admin.existingSecret | default (include "pai.componentName" (dict "root" . "component" "admin-token")) -}}
{{- end -}}

{{/*
What the release-secrets hook makes (libs/common/release_secrets.py), one
"SECRET/KEY=KIND" a line; a Secret the operator gives (existingSecret) is not named.
No value is made at template time: `helm template` renders the same every time.
*/}}
{{- define "pai.generatedSecrets" -}}
{{- $specs := list -}}
{{- if not .Values.nats.existingSecret -}}
{{- $bus := include "pai.busCredentialsSecret" . -}}
{{- range $user := keys (.Files.Get "files/nats-permissions.json" | fromJson) | sortAlpha -}}
{{- $specs = append $specs (printf "%s/%s=random" $bus $user) -}}
{{- end -}}
{{- $specs = append $specs (printf "%s/route-password=random" $bus) -}}
{{- end -}}
{{- if not .Values.jobSecrets.existingSecret -}}
{{- $specs = append $specs (printf "%s/secrets.key=x25519:secrets.pub" (include "pai.jobSecretsKeySecret" .)) -}}
{{- end -}}
{{- if not .Values.admin.existingSecret -}}
{{- $specs = append $specs (printf "%s/%s=token:%s" (include "pai.adminTokenSecret" .) .Values.admin.existingSecretKey .Values.config.admin_user) -}}
{{- end -}}
{{- if and .Values.postgresql.enabled (not .Values.postgresql.existingSecret) -}}
{{- $specs = append $specs (printf "%s/password=random" (include "pai.postgresqlName" .)) -}}
{{- end -}}
{{- join "\n" $specs -}}
{{- end -}}

{{/* The namespace of job Pods: jobs.namespace, by default "<release namespace>-jobs". */}}
{{- define "pai.jobsNamespaceName" -}}
{{- .Values.jobs.namespace | default (printf "%s-jobs" .Release.Namespace) -}}
{{- end -}}

{{/* NATS URL scheme: tls:// when the bundled NATS requires TLS of its clients. */}}
{{- define "pai.natsTls" -}}
{{- if and .Values.nats.enabled .Values.nats.tls.enabled -}}true{{- end -}}
{{- end -}}

{{/* The NATS CA for clients (nats.tls): env, volume mount and volume of every NATS client pod. */}}
{{- define "pai.natsTlsEnv" -}}
{{- if eq (include "pai.natsTls" .) "true" }}
- name: PAI_NATS_TLS_CA_FILE
  value: {{ printf "/etc/pai/nats-tls/%s" .Values.nats.tls.caKey | quote }}
{{- end }}
{{- end -}}
{{- define "pai.natsTlsMount" -}}
{{- if eq (include "pai.natsTls" .) "true" }}
- name: nats-tls
  mountPath: /etc/pai/nats-tls
  readOnly: true
{{- end }}
{{- end -}}
{{- define "pai.natsTlsVolume" -}}
{{- if eq (include "pai.natsTls" .) "true" }}
- name: nats-tls
  secret:
    secretName: {{ .Values.nats.tls.secretName }}
    items:
      - key: {{ .Values.nats.tls.caKey }}
        path: {{ .Values.nats.tls.caKey }}
{{- end }}
{{- end -}}
