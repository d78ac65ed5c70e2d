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

{{/* NATS URL of the services. */}}
{{- define "metabus.natsURL" -}}
{{ .Values.natsURL | default (printf "nats://nats.%s:4222" .Release.Namespace) }}
{{- end }}
