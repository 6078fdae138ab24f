{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "mcp-era-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name when it already contains the chart name.
*/}}
{{- define "mcp-era-proxy.fullname" -}}
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

{{- define "mcp-era-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "mcp-era-proxy.labels" -}}
helm.sh/chart: {{ include "mcp-era-proxy.chart" . }}
{{ include "mcp-era-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | trunc 63 | quote }}
app.kubernetes.io/component: {{ .Values.mode }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable for the life of the release (a Deployment's selector is immutable).
*/}}
{{- define "mcp-era-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcp-era-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mcp-era-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcp-era-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: repository@digest when a digest is given, else repository:tag (tag defaults to
the appVersion).
*/}}
{{- define "mcp-era-proxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The Secret holding the session HMAC key ("" when the proxy draws a random key per process).
*/}}
{{- define "mcp-era-proxy.secretName" -}}
{{- if .Values.sessionSecret.existingSecret }}
{{- .Values.sessionSecret.existingSecret }}
{{- else if .Values.sessionSecret.create }}
{{- printf "%s-session" (include "mcp-era-proxy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
"true" when a shared store is configured (its URL from store.existingSecret), else "".
*/}}
{{- define "mcp-era-proxy.hasStore" -}}
{{- if .Values.store.existingSecret }}true{{ end }}
{{- end }}

{{/*
The proxy's worker processes per pod (config.workers, 1 unless set): worker i listens on the admin
and internal ports + i.
*/}}
{{- define "mcp-era-proxy.workers" -}}
{{- dig "workers" 1 (.Values.config | default dict) | int }}
{{- end }}

{{/*
"host:port" for the proxy's listen addresses; IPv6 hosts in brackets.
*/}}
{{- define "mcp-era-proxy.address" -}}
{{- $host := index . 0 }}
{{- if contains ":" $host }}{{ $host = printf "[%s]" $host }}{{ end }}
{{- printf "%s:%d" $host (int (index . 1)) }}
{{- end }}

{{/*
Host header values the proxy accepts unless config.security.allowed_hosts is given: the Service's
DNS names (short, namespaced, cluster FQDN), loopback names (kubectl port-forward), the ingress
hosts and the HTTPRoute's hostnames. A YAML list.
*/}}
{{- define "mcp-era-proxy.allowedHosts" -}}
{{- $svc := include "mcp-era-proxy.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost" "127.0.0.1" "::1" }}
{{- if .Values.ingress.enabled }}
{{- range .Values.ingress.hosts }}
{{- if and .host (not (has .host $hosts)) }}
{{- $hosts = append $hosts .host }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.httpRoute.enabled }}
{{- range .Values.httpRoute.hostnames }}
{{- if not (has . $hosts) }}
{{- $hosts = append $hosts . }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $hosts }}
{{- end }}

{{/*
The proxy's configuration: `config` from the values, plus what the chart computes for the keys the
values leave unset (scripts/check_chart_config.py composes it the same way and runs the proxy's
--check-config on it).
*/}}
{{- define "mcp-era-proxy.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $_ := set $cfg "listen" (include "mcp-era-proxy.address" (list .Values.listenAddress .Values.containerPorts.http)) }}
{{- $_ := set $cfg "admin_listen" (include "mcp-era-proxy.address" (list .Values.listenAddress .Values.containerPorts.admin)) }}
{{- $security := get $cfg "security" | default dict }}
{{- if not (hasKey $security "allowed_hosts") }}
{{- $_ := set $security "allowed_hosts" (include "mcp-era-proxy.allowedHosts" . | fromYamlArray) }}
{{- end }}
{{- $_ := set $cfg "security" $security }}
{{- $shutdown := get $cfg "shutdown" | default dict }}
{{- if not (hasKey $shutdown "grace_s") }}
{{- $_ := set $shutdown "grace_s" 20 }}
{{- end }}
{{- $_ := set $cfg "shutdown" $shutdown }}
{{- if include "mcp-era-proxy.hasStore" . }}
{{- $store := get $cfg "store" | default dict }}
{{- if not (hasKey $store "namespace") }}
{{- $_ := set $store "namespace" .Values.store.namespace }}
{{- end }}
{{- if not (hasKey $store "timeout_ms") }}
{{- $_ := set $store "timeout_ms" (int .Values.store.timeoutMs) }}
{{- end }}
{{- $_ := set $cfg "store" $store }}
{{- end }}
{{- $auth := get $cfg "auth" | default dict }}
{{- $authValues := dict "mode" .Values.auth.mode "public_url" (include "mcp-era-proxy.publicUrl" .) "issuers" .Values.auth.issuers "audience" .Values.auth.audience "jwks_url" .Values.auth.jwksUrl "required_scopes" .Values.auth.requiredScopes "client_in_identity" .Values.auth.clientInIdentity "metadata_max_age_s" .Values.auth.metadataMaxAgeS }}
{{- range $key, $value := $authValues }}
{{- if and (not (hasKey $auth $key)) (or (kindIs "bool" $value) (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value) (not (empty $value))) }}
{{- $_ := set $auth $key $value }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "auth" $auth }}
{{- if eq .Values.mode "sidecar" }}
{{- $upstream := get $cfg "upstream" | default dict }}
{{- $_ := set $upstream "url" (printf "http://127.0.0.1:%d%s" (int .Values.sidecar.upstreamPort) .Values.sidecar.upstreamPath) }}
{{- /* Named after the release, not 127.0.0.1:<port> (the proxy's default), unless config names it */}}
{{- if not (get $upstream "name") }}
{{- $_ := set $upstream "name" (include "mcp-era-proxy.fullname" .) }}
{{- end }}
{{- $_ := set $cfg "upstream" $upstream }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The public URL of the MCP endpoint (config auth.public_url): auth.publicUrl, else the first ingress
host (https when ingress.tls names it), else the first HTTPRoute hostname (https), with config.path;
empty when there is neither (the proxy then derives it from each request).
*/}}
{{- define "mcp-era-proxy.publicUrl" -}}
{{- $path := dig "path" "/mcp" (.Values.config | default dict) }}
{{- if .Values.auth.publicUrl }}
{{- .Values.auth.publicUrl }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts (first .Values.ingress.hosts).host }}
{{- $host := (first .Values.ingress.hosts).host }}
{{- $tls := false }}
{{- range .Values.ingress.tls }}
{{- if has $host (.hosts | default list) }}
{{- $tls = true }}
{{- end }}
{{- end }}
{{- printf "%s://%s%s" (ternary "https" "http" $tls) $host $path }}
{{- else if and .Values.httpRoute.enabled .Values.httpRoute.hostnames }}
{{- printf "https://%s%s" (first .Values.httpRoute.hostnames) $path }}
{{- end }}
{{- end }}

{{/*
The OAuth discovery prefixes routed beside the MCP path (docs/operate/authorization.md, "OAuth discovery").
*/}}
{{- define "mcp-era-proxy.wellKnownPaths" -}}
{{- toYaml (list "/.well-known/oauth-protected-resource" "/.well-known/oauth-authorization-server" "/.well-known/openid-configuration") }}
{{- end }}

{{/*
The proxy's shutdown.grace_s (its default, 20, unless config sets it).
*/}}
{{- define "mcp-era-proxy.graceSeconds" -}}
{{- dig "shutdown" "grace_s" 20 (.Values.config | default dict) }}
{{- end }}

{{/*
The proxy's limits the alerts compare with (its defaults unless config sets them): legacy sessions
(sessions.max_sessions) and parked calls (input.max_parked), each per worker.
*/}}
{{- define "mcp-era-proxy.maxSessions" -}}
{{- dig "sessions" "max_sessions" 50000 (.Values.config | default dict) }}
{{- end }}
{{- define "mcp-era-proxy.maxParked" -}}
{{- dig "input" "max_parked" 1000 (.Values.config | default dict) }}
{{- end }}

{{/*
The label matchers of the alerts' queries: prometheusRule.selector, else the namespace and job
(the Service's name) the chart's ServiceMonitor gives its targets.
*/}}
{{- define "mcp-era-proxy.ruleSelector" -}}
{{- .Values.prometheusRule.selector | default (printf "namespace=%q,job=%q" .Release.Namespace (include "mcp-era-proxy.fullname" .)) }}
{{- end }}

{{/*
Fails rendering on value combinations that would deploy something broken. Included by the
ConfigMap and the Deployment.
*/}}
{{- define "mcp-era-proxy.validate" -}}
{{- $errors := list }}
{{- $cfg := .Values.config | default dict }}
{{- $upstream := get $cfg "upstream" | default dict }}
{{- $hasUrl := not (empty (get $upstream "url")) }}
{{- $hasCommand := not (empty (get $upstream "command")) }}
{{- $hasSse := not (empty (get $upstream "sse_url")) }}
{{- $upstreams := len (without (list $hasUrl $hasCommand $hasSse) false) }}
{{- if eq .Values.mode "standalone" }}
  {{- if eq $upstreams 0 }}
  {{- $errors = append $errors "mode standalone needs an upstream: set config.upstream.url (e.g. http://legacy-server:3000/mcp), config.upstream.command (a stdio server, in an image that has it) or config.upstream.sse_url (a 2024-11-05 HTTP+SSE server)" }}
  {{- end }}
  {{- if gt $upstreams 1 }}
  {{- $errors = append $errors "set only one of config.upstream.url, config.upstream.command and config.upstream.sse_url" }}
  {{- end }}
  {{- if .Values.sidecar.workload.containers }}
  {{- $errors = append $errors "sidecar.workload.containers is set but mode is standalone: set mode: sidecar, or remove the workload" }}
  {{- end }}
{{- else if eq .Values.mode "sidecar" }}
  {{- if gt $upstreams 0 }}
  {{- $errors = append $errors "mode sidecar computes config.upstream.url (http://127.0.0.1:<sidecar.upstreamPort><sidecar.upstreamPath>): remove config.upstream.url / command / sse_url" }}
  {{- end }}
  {{- if not .Values.sidecar.workload.containers }}
  {{- $errors = append $errors "mode sidecar needs the app's containers in sidecar.workload.containers" }}
  {{- end }}
  {{- $ports := list (int .Values.containerPorts.http) (int .Values.containerPorts.admin) }}
  {{- if include "mcp-era-proxy.hasStore" . }}
  {{- $ports = append $ports (int .Values.replicas.internalPort) }}
  {{- end }}
  {{- if has (int .Values.sidecar.upstreamPort) $ports }}
  {{- $errors = append $errors (printf "sidecar.upstreamPort %d is one of the proxy's containerPorts" (int .Values.sidecar.upstreamPort)) }}
  {{- end }}
  {{- range .Values.sidecar.workload.containers }}
    {{- if eq (.name | default "") "mcp-era-proxy" }}
    {{- $errors = append $errors "sidecar.workload.containers: the name mcp-era-proxy is the proxy container's" }}
    {{- end }}
    {{- range .ports }}
      {{- if has (int .containerPort) $ports }}
      {{- $errors = append $errors (printf "sidecar.workload.containers: port %d is also a proxy port (containerPorts)" (int .containerPort)) }}
      {{- end }}
      {{- if has (.name | default "") (list "mcp" "mcp-admin" "mcp-internal") }}
      {{- $errors = append $errors (printf "sidecar.workload.containers: port name %s is the proxy's" .name) }}
      {{- end }}
    {{- end }}
  {{- end }}
{{- end }}
{{- range concat .Values.sidecar.workload.volumes .Values.extraVolumes }}
  {{- if has (.name | default "") (list "mcp-era-proxy-config" "mcp-era-proxy-tmp") }}
  {{- $errors = append $errors (printf "volume name %s is the chart's own" .name) }}
  {{- end }}
{{- end }}
{{- if eq (int .Values.containerPorts.http) (int .Values.containerPorts.admin) }}
{{- $errors = append $errors "containerPorts.http and containerPorts.admin must differ" }}
{{- end }}
{{- range $key := list "listen" "admin_listen" }}
  {{- if hasKey $cfg $key }}
  {{- $errors = append $errors (printf "config.%s is computed by the chart: set listenAddress / containerPorts instead" $key) }}
  {{- end }}
{{- end }}
{{- if hasKey (get $cfg "security" | default dict) "secret" }}
{{- $errors = append $errors "config.security.secret would land in a ConfigMap: use sessionSecret.existingSecret (or sessionSecret.value)" }}
{{- end }}
{{- if hasKey (get $cfg "security" | default dict) "previous_secrets" }}
{{- $errors = append $errors "config.security.previous_secrets would land in a ConfigMap: put them in the session Secret, as a JSON list under sessionSecret.previousKey" }}
{{- end }}
{{- if hasKey (get $cfg "store" | default dict) "url" }}
{{- $errors = append $errors "config.store.url would land in a ConfigMap (with its password): put the URL in a Secret and set store.existingSecret" }}
{{- end }}
{{- range $key := list "internal_listen" "advertise" }}
  {{- if hasKey (get $cfg "replicas" | default dict) $key }}
  {{- $errors = append $errors (printf "config.replicas.%s is computed by the chart (the pod IP and replicas.internalPort): set replicas.internalPort instead" $key) }}
  {{- end }}
{{- end }}
{{- $hasStore := include "mcp-era-proxy.hasStore" . }}
{{- $hasSecret := include "mcp-era-proxy.secretName" . }}
{{- if and $hasStore (not $hasSecret) }}
{{- $errors = append $errors "store.existingSecret needs a sessionSecret (existingSecret, or create): every replica must sign and open the same session ids and tokens" }}
{{- end }}
{{- if and (or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled) (not $hasStore) (not $hasSecret) }}
{{- $errors = append $errors "replicaCount > 1 and autoscaling need a shared store (store.existingSecret) or, with session affinity, a sessionSecret: without either, each replica signs session ids with a key of its own" }}
{{- end }}
{{- if and $hasStore (has (int .Values.replicas.internalPort) (list (int .Values.containerPorts.http) (int .Values.containerPorts.admin))) }}
{{- $errors = append $errors (printf "replicas.internalPort %d is one of containerPorts" (int .Values.replicas.internalPort)) }}
{{- end }}
{{- if and .Values.sessionSecret.create (not .Values.sessionSecret.existingSecret) .Values.sessionSecret.value (lt (len .Values.sessionSecret.value) 16) }}
{{- $errors = append $errors "sessionSecret.value must have 16 characters or more" }}
{{- end }}
{{- $grace := include "mcp-era-proxy.graceSeconds" . | float64 }}
{{- $needed := addf $grace .Values.preStopSleepSeconds }}
{{- $stdioStop := 0.0 }}
{{- if and (eq .Values.mode "standalone") $hasCommand }}
{{- /* A stdio server then gets upstream.shutdown_grace_s after stdin closes and again after SIGTERM. */}}
{{- $stdioStop = mulf 2 (dig "shutdown_grace_s" 5 $upstream | float64) }}
{{- end }}
{{- $needed = addf $needed $stdioStop }}
{{- /* After the drain the proxy closes its upstreams and the store: 10 s for that. */}}
{{- $needed = addf $needed 10 }}
{{- if lt (float64 .Values.terminationGracePeriodSeconds) $needed }}
{{- $errors = append $errors (printf "terminationGracePeriodSeconds (%v) must be at least preStopSleepSeconds + shutdown.grace_s + 10%s = %v: in-flight calls would be killed" .Values.terminationGracePeriodSeconds (ternary " + 2 x upstream.shutdown_grace_s (stdio)" "" (gt $stdioStop 0.0)) $needed) }}
{{- end }}
{{- $probeTimeout := dig "readiness" "probe_timeout_s" 3 $cfg | float64 }}
{{- range $name := list "startup" "readiness" }}
  {{- $probe := get $.Values.probes $name }}
  {{- if and $probe.enabled (le (float64 $probe.timeoutSeconds) $probeTimeout) }}
  {{- $errors = append $errors (printf "probes.%s.timeoutSeconds (%v) must exceed config.readiness.probe_timeout_s (%v): /readyz may take that long to probe the upstream" $name $probe.timeoutSeconds $probeTimeout) }}
  {{- end }}
{{- end }}
{{- if .Values.ingress.enabled }}
  {{- range .Values.ingress.hosts }}
    {{- if and (hasPrefix "*" (.host | default "")) (not (hasKey (get $cfg "security" | default dict) "allowed_hosts")) }}
    {{- $errors = append $errors (printf "ingress host %s is a wildcard, which the computed security.allowed_hosts cannot express: set config.security.allowed_hosts" .host) }}
    {{- end }}
  {{- end }}
{{- end }}
{{- $authCfg := get $cfg "auth" | default dict }}
{{- if and (eq (get $authCfg "mode" | default .Values.auth.mode) "resource_server") (not (get $authCfg "issuers" | default .Values.auth.issuers)) }}
{{- $errors = append $errors "auth.mode resource_server needs auth.issuers: the authorization servers whose tokens the proxy accepts" }}
{{- end }}
{{- if and (include "mcp-era-proxy.hasStore" .) (get $authCfg "issuers" | default .Values.auth.issuers) (not (get $authCfg "public_url" | default (include "mcp-era-proxy.publicUrl" .))) (not (get $authCfg "audience" | default .Values.auth.audience)) }}
{{- $errors = append $errors "auth.issuers with replicas (store.existingSecret) needs auth.publicUrl, an ingress or HTTPRoute host, or auth.audience: every replica must verify tokens for the same audience" }}
{{- end }}
{{- if .Values.httpRoute.enabled }}
  {{- if not .Values.httpRoute.parentRefs }}
  {{- $errors = append $errors "httpRoute.parentRefs must name the Gateway the route attaches to" }}
  {{- end }}
  {{- range .Values.httpRoute.hostnames }}
    {{- if and (hasPrefix "*" .) (not (hasKey (get $cfg "security" | default dict) "allowed_hosts")) }}
    {{- $errors = append $errors (printf "httpRoute hostname %s is a wildcard, which the computed security.allowed_hosts cannot express: set config.security.allowed_hosts" .) }}
    {{- end }}
  {{- end }}
{{- end }}
{{- if .Values.podDisruptionBudget.enabled }}
  {{- $min := toString .Values.podDisruptionBudget.minAvailable }}
  {{- $max := toString .Values.podDisruptionBudget.maxUnavailable }}
  {{- if eq (empty $min) (empty $max) }}
  {{- $errors = append $errors "podDisruptionBudget: set exactly one of minAvailable and maxUnavailable" }}
  {{- end }}
  {{- $replicas := ternary (int .Values.autoscaling.minReplicas) (int .Values.replicaCount) .Values.autoscaling.enabled }}
  {{- if and (not (empty $min)) (not (hasSuffix "%" $min)) (ge (atoi $min) $replicas) }}
  {{- $errors = append $errors (printf "podDisruptionBudget.minAvailable %s with %d replica(s) would block every node drain" $min $replicas) }}
  {{- end }}
  {{- if has $max (list "0" "0%") }}
  {{- $errors = append $errors "podDisruptionBudget.maxUnavailable 0 would block every node drain" }}
  {{- end }}
{{- end }}
{{- if .Values.autoscaling.enabled }}
  {{- if and (not .Values.autoscaling.targetCPUUtilizationPercentage) (not .Values.autoscaling.targetMemoryUtilizationPercentage) }}
  {{- $errors = append $errors "autoscaling: set targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" }}
  {{- end }}
  {{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
  {{- $errors = append $errors "autoscaling.minReplicas exceeds maxReplicas" }}
  {{- end }}
{{- end }}
{{- if $errors }}
{{- fail (printf "\n\nmcp-era-proxy: invalid values:\n  - %s\n" (join "\n  - " $errors)) }}
{{- end }}
{{- end }}

{{/*
The proxy container (both modes).
*/}}
{{- define "mcp-era-proxy.container" -}}
- name: mcp-era-proxy
  image: {{ include "mcp-era-proxy.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - --config
    - /etc/mcp-era-proxy/config.yaml
    {{- range .Values.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  ports:
    - name: mcp
      containerPort: {{ .Values.containerPorts.http }}
      protocol: TCP
    - name: mcp-admin
      containerPort: {{ .Values.containerPorts.admin }}
      protocol: TCP
    {{- $store := include "mcp-era-proxy.hasStore" . }}
    {{- if $store }}
    - name: mcp-internal
      containerPort: {{ .Values.replicas.internalPort }}
      protocol: TCP
    {{- end }}
  {{- $secret := include "mcp-era-proxy.secretName" . }}
  {{- if or $secret .Values.extraEnv $store }}
  env:
    {{- if $secret }}
    - name: MCP_ERA_PROXY_SECURITY__SECRET
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ .Values.sessionSecret.key }}
    {{- with .Values.sessionSecret.previousKey }}
    - name: MCP_ERA_PROXY_SECURITY__PREVIOUS_SECRETS
      valueFrom:
        secretKeyRef:
          name: {{ $secret }}
          key: {{ . }}
          optional: true
    {{- end }}
    {{- end }}
    {{- if $store }}
    - name: MCP_ERA_PROXY_STORE__URL
      valueFrom:
        secretKeyRef:
          name: {{ .Values.store.existingSecret }}
          key: {{ .Values.store.secretKey }}
    # Other replicas reach this pod's internal listener at its IP; never through the Service.
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    {{- $v6 := contains ":" .Values.listenAddress }}
    - name: MCP_ERA_PROXY_REPLICAS__INTERNAL_LISTEN
      value: {{ include "mcp-era-proxy.address" (list .Values.listenAddress .Values.replicas.internalPort) | quote }}
    - name: MCP_ERA_PROXY_REPLICAS__ADVERTISE
      value: {{ printf (ternary "[$(POD_IP)]:%d" "$(POD_IP):%d" $v6) (int .Values.replicas.internalPort) | quote }}
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- with .Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.probes.startup }}
  {{- if .enabled }}
  startupProbe:
    httpGet:
      path: /readyz
      port: mcp-admin
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.probes.readiness }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: mcp-admin
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
    successThreshold: {{ .successThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.probes.liveness }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: mcp-admin
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- if gt (int .Values.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", "{{ int .Values.preStopSleepSeconds }}"]
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: mcp-era-proxy-config
      mountPath: /etc/mcp-era-proxy
      readOnly: true
    - name: mcp-era-proxy-tmp
      mountPath: /tmp
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
