{{/* The chart name, or nameOverride (upstream's metacontroller.name). */}}
{{- define "metabus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every namespaced object's name: fullnameOverride, else the release
name if it contains the chart name, else <release>-<chart> (as upstream).
*/}}
{{- define "metabus.fullname" -}}
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

{{/* The namespace of every namespaced object. */}}
{{- define "metabus.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/*
Prefix of cluster-scoped names (ClusterRoles, ClusterRoleBindings): the
fullname, plus the namespace unless they are equal, so that the same release
name in two namespaces gives two sets. `helm install metabus -n metabus`
names them metabus-<service>, as deploy/rbac does.
*/}}
{{- define "metabus.clusterName" -}}
{{- $full := include "metabus.fullname" . }}
{{- $ns := include "metabus.namespace" . }}
{{- if eq $full $ns }}{{ $full }}{{ else }}{{ printf "%s-%s" $full $ns }}{{ end }}
{{- end }}

{{- define "metabus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of a component: (dict "root" $ "component" "watcher"). */}}
{{- define "metabus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "metabus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of a component's objects: (dict "root" $ "component" "watcher"). */}}
{{- define "metabus.labels" -}}
helm.sh/chart: {{ include "metabus.chart" .root }}
{{ include "metabus.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: metabus
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* Container image of metabus (services and the credential generator):
by digest when image.digest is set (as kustomize's images: digest, which
also drops the tag), otherwise by tag. */}}
{{- define "metabus.image" -}}
{{- if .Values.image.digest -}}
{{ include "metabus.imageRepository" . }}@{{ .Values.image.digest }}
{{- else -}}
{{ include "metabus.imageRepository" . }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/*
The image repository: image.repository, except upstream Metacontroller's
own image (upstream's values file sets it), which has no metabus binaries:
then metabus's, and NOTES.txt says so.
*/}}
{{- define "metabus.imageRepository" -}}
{{- if include "metabus.upstreamImage" . }}ghcr.io/metabus/metabus{{ else }}{{ .Values.image.repository }}{{ end }}
{{- end }}

{{/* Non-empty when image.repository is upstream Metacontroller's image. */}}
{{- define "metabus.upstreamImage" -}}
{{- if regexMatch "^((docker\\.io/)?metacontrollerio|ghcr\\.io/metacontroller)/metacontroller$" .Values.image.repository }}true{{ end }}
{{- end }}

{{/* The services' health port: upstream's probes.port where set, else healthPort. */}}
{{- define "metabus.healthPort" -}}
{{- (.Values.probes | default dict).port | default .Values.healthPort }}
{{- end }}

{{/*
Upstream Metacontroller chart values metabus accepts but cannot honour, one
"ignored: <key> (<why>)" line each, for NOTES.txt. Only values set to
something are listed: an empty one changes nothing.
*/}}
{{- define "metabus.ignoredUpstreamValues" -}}
{{- if .Values.command }}
ignored: command ({{ .Values.command }}: each metabus service runs its own binary, /usr/local/bin/metabus-<service>; commandArgs still go to all four)
{{- end }}
{{- with .Values.clusterRole }}
{{- if or .rules .aggregationRule }}
ignored: clusterRole (metabus gives each service its own ClusterRole, <service>.clusterRole; narrow the applier's writes with profile=hardened or applier.rbac.allResources=false and applier.rbac.extraRules)
{{- end }}
{{- end }}
{{- if (.Values.serviceAccount | default dict).name }}
ignored: serviceAccount.name ({{ .Values.serviceAccount.name }}: one account shared by the four services would undo their per-service RBAC; set <service>.serviceAccount.name)
{{- end }}
{{- if include "metabus.upstreamImage" . }}
ignored: image.repository ({{ .Values.image.repository }} is upstream Metacontroller's image, without metabus's binaries; ghcr.io/metabus/metabus is used)
{{- end }}
{{- if .Values.resources }}
{{- $own := list }}
{{- range $svc := list "watcher" "dispatcher" "applier" "revisions" }}
{{- if (index $.Values $svc | default dict).resources }}{{ $own = append $own $svc }}{{ end }}
{{- end }}
{{- if $own }}
ignored: resources (for {{ join ", " $own }}: each sets its own, <service>.resources, which applies)
{{- end }}
{{- end }}
{{- end }}

{{/* The profile, checked: upstream or hardened. */}}
{{- define "metabus.profile" -}}
{{- if not (has .Values.profile (list "upstream" "hardened")) }}
{{- fail (printf "profile: %q, want upstream or hardened" .Values.profile) }}
{{- end }}
{{- .Values.profile }}
{{- end }}

{{/*
The narrowing settings as the profile sets them, unless their own value
overrides it; YAML, read back with fromYaml:
  secretNamespaces, relatedResources, controllerResources, hookDestinations: lists
  applierAllResources, refuseInsecureCredentials: bool
*/}}
{{- define "metabus.policy" -}}
{{- $hardened := eq (include "metabus.profile" .) "hardened" }}
{{- $secretNamespaces := ternary (list) (list "*") $hardened }}
{{- with .Values.dispatcher.secretNamespaces }}{{ $secretNamespaces = . }}{{ end }}
{{- $related := ternary (list "*" "-core/secrets") (list "*") $hardened }}
{{- with .Values.dispatcher.relatedResources }}{{ $related = . }}{{ end }}
{{- $controllers := ternary (list "*" "-core/secrets") (list "*") $hardened }}
{{- with .Values.watcher.controllerResources }}{{ $controllers = . }}{{ end }}
{{- $destinations := ternary (list "-apiserver" "-loopback" "-link-local" "*") (list "*") $hardened }}
{{- with .Values.dispatcher.hookDestinations }}{{ $destinations = . }}{{ end }}
{{- $refuseInsecure := $hardened }}
{{- if kindIs "bool" .Values.dispatcher.refuseInsecureCredentials }}{{ $refuseInsecure = .Values.dispatcher.refuseInsecureCredentials }}{{ end }}
{{- $maxWeight := ternary 1 100 $hardened }}
{{- if kindIs "float64" .Values.watcher.maxControllerWeight }}{{ $maxWeight = .Values.watcher.maxControllerWeight | int }}{{ end }}
{{- if kindIs "int64" .Values.watcher.maxControllerWeight }}{{ $maxWeight = .Values.watcher.maxControllerWeight | int }}{{ end }}
{{- $resyncAfter := ternary 32 0 $hardened }}
{{- if kindIs "float64" .Values.dispatcher.resyncAfterBacklog }}{{ $resyncAfter = .Values.dispatcher.resyncAfterBacklog | int }}{{ end }}
{{- if kindIs "int64" .Values.dispatcher.resyncAfterBacklog }}{{ $resyncAfter = .Values.dispatcher.resyncAfterBacklog | int }}{{ end }}
{{- $maxHeld := ternary 64 256 $hardened }}
{{- if kindIs "float64" .Values.dispatcher.maxHeldPerController }}{{ $maxHeld = .Values.dispatcher.maxHeldPerController | int }}{{ end }}
{{- if kindIs "int64" .Values.dispatcher.maxHeldPerController }}{{ $maxHeld = .Values.dispatcher.maxHeldPerController | int }}{{ end }}
{{- $all := not $hardened }}
{{- if kindIs "bool" .Values.applier.rbac.allResources }}{{ $all = .Values.applier.rbac.allResources }}{{ end }}
{{- $nobody := ternary (printf "%s-nobody" (include "metabus.fullname" .)) "" $hardened }}
{{- $defaultSA := ternary (printf "%s/%s" (include "metabus.namespace" .) $nobody) "" $hardened }}
{{- $identity := .Values.applier.identity | default dict }}
{{- if kindIs "string" $identity.defaultServiceAccount }}{{ $defaultSA = $identity.defaultServiceAccount }}{{ $nobody = "" }}{{ end }}
secretNamespaces: {{ $secretNamespaces | toJson }}
relatedResources: {{ $related | toJson }}
controllerResources: {{ $controllers | toJson }}
hookDestinations: {{ $destinations | toJson }}
refuseInsecureCredentials: {{ $refuseInsecure }}
applierAllResources: {{ $all }}
maxControllerWeight: {{ $maxWeight }}
resyncAfterBacklog: {{ $resyncAfter }}
maxHeldPerController: {{ $maxHeld }}
defaultServiceAccount: {{ $defaultSA | quote }}
nobodyServiceAccount: {{ $nobody | quote }}
{{- end }}

{{/*
A service's values: the top-level ones, replaced by those its own section
sets; commandArgs and env concatenated. (dict "root" $ "svc" "watcher"),
YAML, read back with fromYaml.
*/}}
{{- define "metabus.serviceValues" -}}
{{- $own := index .root.Values .svc | default dict }}
{{- $v := dict }}
{{- range $k := list "replicas" "resources" "podAnnotations" "podSecurityContext" "securityContext" "nodeSelector" "tolerations" "affinity" "priorityClassName" "podDisruptionBudget" "service" "imagePullSecrets" }}
{{- if hasKey $own $k }}
{{- $_ := set $v $k (index $own $k) }}
{{- else }}
{{- $_ := set $v $k (index $.root.Values $k) }}
{{- end }}
{{- end }}
{{- $_ := set $v "commandArgs" (concat (.root.Values.commandArgs | default list) ($own.commandArgs | default list)) }}
{{- $_ = set $v "env" (concat (.root.Values.env | default list) ($own.env | default list)) }}
{{- $sa := $own.serviceAccount | default dict }}
{{- $_ = set $v "serviceAccountAnnotations" ($sa.annotations | default .root.Values.serviceAccount.annotations) }}
{{- $_ = set $v "clusterRole" ($own.clusterRole | default dict) }}
{{- toYaml $v }}
{{- end }}

{{/* The ServiceAccount a service runs as: (dict "root" $ "svc" "watcher"). */}}
{{- define "metabus.serviceAccountName" -}}
{{- $own := index .root.Values .svc | default dict }}
{{- $name := (($own.serviceAccount | default dict).name) }}
{{- if .root.Values.serviceAccount.create }}
{{- default (printf "%s-%s" (include "metabus.fullname" .root) .svc) $name }}
{{- else }}
{{- default "default" $name }}
{{- end }}
{{- end }}

{{/* NATS objects' name prefix. */}}
{{- define "metabus.natsName" -}}
{{- printf "%s-nats" (include "metabus.fullname" .) }}
{{- end }}

{{/* NATS URL of the services: tls:// when nats.tls.enabled, so a client never falls back to plaintext. */}}
{{- define "metabus.natsURL" -}}
{{ .Values.natsURL | default (printf "%s://%s.%s:4222" (ternary "tls" "nats" .Values.nats.tls.enabled) (include "metabus.natsName" .) (include "metabus.namespace" .)) }}
{{- end }}

{{/*
Where NATS TLS certificates come from: "generate" (the NATS pods' init
container makes them; "helm", the name of the install-time generation of
earlier versions, means the same) or "cert-manager".
*/}}
{{- define "metabus.natsTLSSource" -}}
{{- $src := .Values.nats.tls.certificates | default "generate" }}
{{- if eq $src "helm" }}generate
{{- else if has $src (list "generate" "cert-manager") }}{{ $src }}
{{- else }}{{ fail (printf "nats.tls.certificates: %q, want generate or cert-manager" $src) }}
{{- end }}
{{- end }}

{{/*
Arguments of the credential generator (`metabus credentials ensure`, the
NATS pods' init container): the Services its server certificate is for, or
--tls=false when it makes no certificate (TLS off, or cert-manager's).
*/}}
{{- define "metabus.credentialsArgs" -}}
{{- if and .Values.nats.tls.enabled (eq (include "metabus.natsTLSSource" .) "generate") }}
- --tls-service={{ include "metabus.natsName" . }}
- --tls-peers={{ include "metabus.natsName" . }}-headless
- --tls-validity={{ mul (int .Values.nats.tls.validityDays) 24 }}h
{{- else }}
- --tls=false
{{- end }}
{{- range .Values.nats.hookUsers }}
{{- if not .nkey }}
- --hook-user={{ .name }}
{{- end }}
{{- end }}
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

{{/*
The arguments the chart sets for one service besides the common ones:
(dict "root" $ "svc" "watcher").
*/}}
{{- define "metabus.serviceArgs" -}}
{{- $root := .root }}
{{- $policy := include "metabus.policy" $root | fromYaml }}
{{- if eq .svc "watcher" }}
{{- if $root.Values.watcher.leaderElection }}
- --leader-election
- --leader-election-namespace=$(POD_NAMESPACE)
{{- end }}
- --stream-replicas={{ $root.Values.nats.streamReplicas }}
{{- if $root.Values.nats.partitions }}
- --partitions={{ $root.Values.nats.partitions }}
{{- end }}
- --controller-resources={{ join "," $policy.controllerResources }}
- --max-controller-weight={{ $policy.maxControllerWeight }}
{{- with $policy.defaultServiceAccount }}
- --default-service-account={{ . }}
{{- end }}
{{- else if eq .svc "dispatcher" }}
- --secret-namespaces={{ join "," $policy.secretNamespaces }}
{{- with $root.Values.dispatcher.hookCredentialSecrets }}
- --hook-credential-secrets={{ join "," . }}
{{- end }}
- --related-resources={{ join "," $policy.relatedResources }}
- --hook-destinations={{ join "," $policy.hookDestinations }}
- --refuse-insecure-credentials={{ $policy.refuseInsecureCredentials }}
- --resync-after-backlog={{ $policy.resyncAfterBacklog }}
- --max-held-per-controller={{ $policy.maxHeldPerController }}
{{- with $root.Values.dispatcher.hookSubjectPrefix }}
- --hook-subject-prefix={{ . }}
{{- end }}
{{- else if eq .svc "applier" }}
{{- with $policy.defaultServiceAccount }}
- --default-service-account={{ . }}
{{- end }}
{{- if $root.Values.events.enabled }}
- --bus-events
- --bus-events-max-age={{ $root.Values.events.maxAge }}
- --bus-events-max-bytes={{ $root.Values.events.maxBytes | int64 }}
- --bus-events-replicas={{ $root.Values.nats.streamReplicas }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One service's Deployment: (dict "root" $ "svc" "watcher" "binary"
"metabus-watcher" "comment" "..."). Every service runs the same way; only
its binary, its arguments (metabus.serviceArgs) and values differ.
*/}}
{{- define "metabus.deployment" -}}
{{- $root := .root }}
{{- $svc := .svc }}
{{- $v := include "metabus.serviceValues" . | fromYaml }}
{{- $name := printf "%s-%s" (include "metabus.fullname" $root) $svc }}
{{- $sel := dict "root" $root "component" $svc }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ include "metabus.namespace" $root }}
  labels:
    {{- include "metabus.labels" $sel | nindent 4 }}
spec:
  replicas: {{ $v.replicas }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "metabus.selectorLabels" $sel | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
  template:
    metadata:
      labels:
        {{- include "metabus.labels" $sel | nindent 8 }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "metabus.serviceAccountName" . }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      # Longer than the consumers' AckWait (30s): in-flight work finishes on
      # scale-down instead of being redelivered later.
      terminationGracePeriodSeconds: 45
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $v.affinity }}
      affinity:
        {{- toYaml $v.affinity | nindent 8 }}
      {{- else }}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: ScheduleAnyway
        labelSelector:
          matchLabels:
            {{- include "metabus.selectorLabels" $sel | nindent 12 }}
      {{- end }}
      containers:
      - name: {{ $svc }}
        image: {{ include "metabus.image" $root | quote }}
        imagePullPolicy: {{ $root.Values.image.pullPolicy }}
        command: [{{ printf "/usr/local/bin/metabus-%s" $svc | quote }}]
        args:
        - --nats-url={{ include "metabus.natsURL" $root }}
        # Seed of this service's NATS user, generated at install.
        - --nats-nkey=/etc/metabus/nats/nkey.seed
        {{- include "metabus.natsTLSArgs" $root | nindent 8 }}
        - --metrics-address=:{{ $root.Values.metrics.port }}
        - --health-probe-bind-address=:{{ include "metabus.healthPort" $root }}
        {{- include "metabus.serviceArgs" . | nindent 8 }}
        {{- with $v.commandArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        env:
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        # The Go GC works harder as the heap approaches the memory limit
        # instead of being OOM-killed.
        - name: GOMEMLIMIT
          valueFrom:
            resourceFieldRef:
              resource: limits.memory
        {{- with $v.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        ports:
        - name: metrics
          containerPort: {{ $root.Values.metrics.port }}
        - name: health
          containerPort: {{ include "metabus.healthPort" $root }}
        livenessProbe:
          httpGet:
            path: /healthz
            port: health
          periodSeconds: 20
          timeoutSeconds: 5
          failureThreshold: 3
        readinessProbe:
          httpGet:
            path: /readyz
            port: health
          periodSeconds: 10
          timeoutSeconds: 5
        resources:
          {{- toYaml $v.resources | nindent 10 }}
        securityContext:
          {{- toYaml $v.securityContext | nindent 10 }}
        volumeMounts:
        - name: nats-nkey
          mountPath: /etc/metabus/nats
          readOnly: true
        {{- include "metabus.natsTLSMount" $root | nindent 8 }}
        - name: tmp
          mountPath: /tmp
      volumes:
      # Created at install by the NATS pods' init container
      # (`metabus credentials ensure`); the pod waits in ContainerCreating
      # until it exists.
      - name: nats-nkey
        secret:
          secretName: metabus-nats-{{ $svc }}
          defaultMode: 0440
      {{- include "metabus.natsTLSVolume" (dict "root" $root "service" $svc) | nindent 6 }}
      - name: tmp
        emptyDir:
          sizeLimit: 64Mi
{{- /*
The default is maxUnavailable: 1; Helm merges a user's minAvailable into it
rather than replacing it, and the API refuses both, so minAvailable wins.
*/}}
{{- $pdb := $v.podDisruptionBudget | default dict }}
{{- if hasKey $pdb "minAvailable" }}{{ $pdb = omit $pdb "maxUnavailable" }}{{ end }}
{{- if and $pdb (gt (int $v.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ include "metabus.namespace" $root }}
  labels:
    {{- include "metabus.labels" $sel | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "metabus.selectorLabels" $sel | nindent 6 }}
  {{- toYaml $pdb | nindent 2 }}
{{- end }}
{{- if and $v.service $v.service.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ include "metabus.namespace" $root }}
  labels:
    {{- include "metabus.labels" $sel | nindent 4 }}
spec:
  {{- with $v.service.ports }}
  ports:
    {{- toYaml . | nindent 2 }}
  {{- end }}
  selector:
    {{- include "metabus.selectorLabels" $sel | nindent 4 }}
{{- end }}
{{- if $root.Values.metrics.service.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}-metrics
  namespace: {{ include "metabus.namespace" $root }}
  labels:
    {{- include "metabus.labels" $sel | nindent 4 }}
    metabus.dev/metrics: "true"
spec:
  ports:
  - name: metrics
    port: {{ $root.Values.metrics.port }}
    targetPort: metrics
  selector:
    {{- include "metabus.selectorLabels" $sel | nindent 4 }}
{{- end }}
{{- end }}
