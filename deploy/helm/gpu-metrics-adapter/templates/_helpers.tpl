{{/* The chart's name, or nameOverride. */}}
{{- define "gpu-metrics-adapter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name where it already contains the chart's name
(`helm install gpu-metrics-adapter …` gives the names deploy/base uses), else RELEASE-NAME. */}}
{{- define "gpu-metrics-adapter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "gpu-metrics-adapter.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-metrics-adapter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-metrics-adapter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels but its component: deploy/base's (name, part-of) and Helm's
own. Each template adds app.kubernetes.io/component. */}}
{{- define "gpu-metrics-adapter.labels" -}}
{{ include "gpu-metrics-adapter.selectorLabels" . }}
app.kubernetes.io/part-of: gpu-exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "gpu-metrics-adapter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-metrics-adapter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* NAMESPACE/NAME of the exporters' Service (--exporter-service). */}}
{{- define "gpu-metrics-adapter.exporterService" -}}
{{- default (printf "%s/gpu-exporter" .Release.Namespace) .Values.exporters.service }}
{{- end }}

{{/* The Secret with the serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "gpu-metrics-adapter.tlsSecret" -}}
{{- if eq .Values.tls.source "existingSecret" }}
{{- required "tls.existingSecret.name is required with tls.source=existingSecret" .Values.tls.existingSecret.name }}
{{- else }}
{{- printf "%s-tls" (include "gpu-metrics-adapter.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS names the serving certificate must carry: the aggregator connects to
SERVICE.NAMESPACE.svc, KEDA to its scalerAddress. */}}
{{- define "gpu-metrics-adapter.serviceHost" -}}
{{- printf "%s.%s.svc" (include "gpu-metrics-adapter.fullname" .) .Release.Namespace }}
{{- end }}

{{/* tls.source=selfSigned: a CA and serving certificate made once per release. The
Secret's, when it exists (upgrades keep them; `helm template` has no cluster and makes
new ones), else new ones, kept in .Values for the rest of this render so the Secret and
every APIService's caBundle agree. JSON: {"ca", "cert", "key"}. */}}
{{- define "gpu-metrics-adapter.selfSigned" -}}
{{- if not (hasKey .Values.tls.selfSigned "generated") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "gpu-metrics-adapter.tlsSecret" .) }}
{{- if and $secret (hasKey ($secret.data | default dict) "ca.crt") }}
{{- $_ := set .Values.tls.selfSigned "generated" (dict "ca" (index $secret.data "ca.crt" | b64dec) "cert" (index $secret.data "tls.crt" | b64dec) "key" (index $secret.data "tls.key" | b64dec)) }}
{{- else }}
{{- $host := include "gpu-metrics-adapter.serviceHost" . }}
{{- $days := int .Values.tls.selfSigned.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "gpu-metrics-adapter.fullname" .)) $days }}
{{- $cert := genSignedCert $host nil (list $host (printf "%s.cluster.local" $host)) $days $ca }}
{{- $_ := set .Values.tls.selfSigned "generated" (dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key) }}
{{- end }}
{{- end }}
{{- toJson .Values.tls.selfSigned.generated }}
{{- end }}

{{/* The APIServices' caBundle (base64 PEM), where Helm knows the CA; with cert-manager
its cainjector fills it. */}}
{{- define "gpu-metrics-adapter.caBundle" -}}
{{- if eq .Values.tls.source "static" }}
{{- required "tls.static.ca is required with tls.source=static (--set-file tls.static.ca=ca.crt)" .Values.tls.static.ca | b64enc }}
{{- else if eq .Values.tls.source "existingSecret" }}
{{- required "tls.existingSecret.ca is required with tls.source=existingSecret: the PEM CA of its certificate" .Values.tls.existingSecret.ca | b64enc }}
{{- else if eq .Values.tls.source "selfSigned" }}
{{- (include "gpu-metrics-adapter.selfSigned" . | fromJson).ca | b64enc }}
{{- end }}
{{- end }}
