{{/* Labels of one component: (dict "root" $ "component" "watcher"). */}}
{{- define "metabus.labels" -}}
app.kubernetes.io/name: {{ if eq .component "nats" }}nats{{ else }}metabus-{{ .component }}{{ end }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: metabus
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ .root.Chart.Name }}-{{ .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Container image of the services. */}}
{{- define "metabus.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* NATS URL of the services: tls:// when nats.tls.enabled, so a client never falls back to plaintext. */}}
{{- define "metabus.natsURL" -}}
{{ .Values.natsURL | default (printf "%s://nats.%s:4222" (ternary "tls" "nats" .Values.nats.tls.enabled) .Release.Namespace) }}
{{- end }}

{{/* A service's NATS client TLS flags (nats.tls.enabled): its certificate, key and the CA. */}}
{{- define "metabus.natsTLSArgs" -}}
{{- if .Values.nats.tls.enabled }}
- --nats-ca=/etc/metabus/nats-tls/ca.crt
- --nats-cert=/etc/metabus/nats-tls/tls.crt
- --nats-key=/etc/metabus/nats-tls/tls.key
{{- end }}
{{- end }}

{{/* The mount of a service's NATS client certificate. */}}
{{- define "metabus.natsTLSMount" -}}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /etc/metabus/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The volume of a service's NATS client certificate: (dict "root" $ "service" "watcher"). */}}
{{- define "metabus.natsTLSVolume" -}}
{{- if .root.Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: metabus-nats-{{ .service }}-tls
    defaultMode: 0440
{{- end }}
{{- end }}
