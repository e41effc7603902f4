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
{{- .Values.exporters.service }}
{{- end }}

{{/* The gRPC port's client authentication (grpc.clientAuth): the adapter's flag. */}}
{{- define "gpu-metrics-adapter.grpcClientAuthArg" -}}
{{- if eq .Values.grpc.clientAuth "mutualTLS" }}
{{- printf "--grpc-client-ca-file=%s" .Values.grpc.clientCAFile }}
{{- else if eq .Values.grpc.clientAuth "plaintext" }}
{{- print "--grpc-insecure" }}
{{- end }}
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

{{/* tls.source=selfSigned: a CA, the serving certificate and KEDA's client certificate,
made once per release. The Secrets', when both exist (upgrades keep them; `helm
template` has no cluster and makes new ones), else all new ones (the CA's key is not
kept, so a missing client certificate means a new CA), kept in .Values for the rest of
this render so the Secrets and every APIService's caBundle agree.
JSON: {"ca", "cert", "key", "clientCert", "clientKey"}. */}}
{{- define "gpu-metrics-adapter.selfSigned" -}}
{{- if not (hasKey .Values.tls.selfSigned "generated") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "gpu-metrics-adapter.tlsSecret" .) }}
{{- $client := lookup "v1" "Secret" .Release.Namespace (include "gpu-metrics-adapter.kedaClientSecret" .) }}
{{- if and $secret (hasKey ($secret.data | default dict) "ca.crt") $client (hasKey ($client.data | default dict) "tls.crt") }}
{{- $_ := set .Values.tls.selfSigned "generated" (dict "ca" (index $secret.data "ca.crt" | b64dec) "cert" (index $secret.data "tls.crt" | b64dec) "key" (index $secret.data "tls.key" | b64dec) "clientCert" (index $client.data "tls.crt" | b64dec) "clientKey" (index $client.data "tls.key" | b64dec)) }}
{{- else }}
{{- $host := include "gpu-metrics-adapter.serviceHost" . }}
{{- $days := int .Values.tls.selfSigned.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "gpu-metrics-adapter.fullname" .)) $days }}
{{- $cert := genSignedCert $host nil (list $host (printf "%s.cluster.local" $host)) $days $ca }}
{{- $clientCert := genSignedCert "keda" nil nil $days $ca }}
{{- $_ := set .Values.tls.selfSigned "generated" (dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key "clientCert" $clientCert.Cert "clientKey" $clientCert.Key) }}
{{- end }}
{{- end }}
{{- toJson .Values.tls.selfSigned.generated }}
{{- end }}

{{/* The Secret with KEDA's client certificate for the gRPC port (tls.crt, tls.key,
ca.crt), which the chart issues with tls.source cert-manager or selfSigned. */}}
{{- define "gpu-metrics-adapter.kedaClientSecret" -}}
{{- printf "%s-keda-client" (include "gpu-metrics-adapter.fullname" .) }}
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
