{{/*
The environment of every pod that runs the runner (the tasks, the workers, the watchdog, serve,
the helm test), as a JSON list of EnvVars: what they all share, with the pod's own entries in
the slots between, then runner.env and the pod's own env maps over it. In this order:

  beforeIdentity  a task's Job and slot, from the downward API
  CRON_RUNNER_HOLDER, CRON_RUNNER_SCOPE, CRON_RUNNER_CLUSTER_NAME: who the pod is
  beforeLogging   a task's schedule, time zone, lease TTL and grace; a worker's grace and TTL
  CRON_RUNNER_LOG_FORMAT, CRON_RUNNER_LOG_LEVEL
  beforeKeys      a worker's processes, threads and queues
  CRON_RUNNER_KEY_PREFIX, CRON_RUNNER_CONNECT_TIMEOUT, when set
  beforeRedis     a task's or a worker's optional settings
  CRON_RUNNER_REDIS_*: where Redis is and how to authenticate (cron-runner.redis.env)
  afterRedis      a task's OTEL_*, which refer to CRON_RUNNER_HOLDER and CRON_RUNNER_JOB_NAME
                  (the kubelet expands $(VAR) only from variables defined before)

A slot is a list of EnvVars, set as given, and of [name value] pairs, set when the value is (not
null, "", 0 or false: pass a string where 0 means something). The slots keep each pod's variables
where the chart has always written them, so a pod template does not change with this layout.
Call with (dict "root" $ SLOT LIST... "maps" (list MAP...)).
*/}}
{{- define "cron-runner.env" -}}
{{- $runner := .root.Values.runner }}
{{- /* Clusters that share a Redis run a task once only if prefix, scope and task key match:
     the scope is runner.scope, else the namespace; the holder is the pod's name, behind the
     cluster's name when runner.clusterName is set. */}}
{{- $identity := list (dict "name" "CRON_RUNNER_HOLDER" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) }}
{{- $subchartScope := include "cron-runner.subchartScope" .root }}
{{- if $runner.scope }}
{{- $identity = append $identity (dict "name" "CRON_RUNNER_SCOPE" "value" (toString $runner.scope)) }}
{{- else if $subchartScope }}
{{- $identity = append $identity (dict "name" "CRON_RUNNER_SCOPE" "value" $subchartScope) }}
{{- else }}
{{- $identity = append $identity (dict "name" "CRON_RUNNER_SCOPE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) }}
{{- end }}
{{- if $runner.clusterName }}
{{- $identity = append $identity (dict "name" "CRON_RUNNER_CLUSTER_NAME" "value" (toString $runner.clusterName)) }}
{{- end }}
{{- $parts := list
  .beforeIdentity
  $identity
  .beforeLogging
  (list
    (dict "name" "CRON_RUNNER_LOG_FORMAT" "value" (toString $runner.logFormat))
    (dict "name" "CRON_RUNNER_LOG_LEVEL" "value" (toString $runner.logLevel)))
  .beforeKeys
  (list
    (list "CRON_RUNNER_KEY_PREFIX" $runner.keyPrefix)
    (list "CRON_RUNNER_CONNECT_TIMEOUT" $runner.connectTimeout))
  .beforeRedis
  (include "cron-runner.redis.env" .root | fromYamlArray)
  .afterRedis }}
{{- $env := list }}
{{- range $part := $parts }}
{{- range $entry := default list $part }}
{{- if kindIs "map" $entry }}
{{- $env = append $env $entry }}
{{- else if index $entry 1 }}
{{- $env = append $env (dict "name" (index $entry 0) "value" (toString (index $entry 1))) }}
{{- end }}
{{- end }}
{{- end }}
{{- include "cron-runner.mergeEnv" (dict "env" $env "maps" (concat (list $runner.env) (default list .maps))) }}
{{- end }}

{{/*
The chart's env list with the user's env maps over it, as a JSON list: the maps apply in
order (runner.env, then a task's or workers group's env), and a name set in them replaces the
chart's entry. Every pod that runs the runner gets runner.env this way (cron-runner.env), so a
scope or credential set once there reaches tasks, workers, the watchdog and the test pod alike.
Takes (dict "env" LIST "maps" (list MAP...)).
*/}}
{{- define "cron-runner.mergeEnv" -}}
{{- $user := dict }}
{{- range $m := .maps }}{{ range $k, $v := default dict $m }}{{ $_ := set $user $k $v }}{{ end }}{{ end }}
{{- $out := list }}
{{- range $e := .env }}
{{- if not (hasKey $user $e.name) }}{{ $out = append $out $e }}{{ end }}
{{- end }}
{{- concat $out (include "cron-runner.envList" $user | fromJsonArray) | toJson }}
{{- end }}

{{/*
An env map as a JSON list of EnvVars, sorted by name: a scalar becomes
`value`, an object (e.g. {valueFrom: ...}) is the entry itself, null is dropped.
*/}}
{{- define "cron-runner.envList" -}}
{{- $out := list }}
{{- range $name := keys . | sortAlpha }}
{{- $v := index $ $name }}
{{- if kindIs "map" $v }}
{{- $out = append $out (merge (dict "name" $name) $v) }}
{{- else if not (kindIs "invalid" $v) }}
{{- $out = append $out (dict "name" $name "value" (toString $v)) }}
{{- end }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/* The Redis part of the environment contract, as YAML; the files it names are mounted by cron-runner.volumes. */}}
{{- define "cron-runner.redis.env" -}}
{{- $r := .Values.redis }}
- name: CRON_RUNNER_REDIS_URL
  value: {{ include "cron-runner.redis.url" . | quote }}
{{- if $r.auth.username }}
- name: CRON_RUNNER_REDIS_USERNAME
  value: {{ $r.auth.username | quote }}
{{- end }}
{{- $secret := include "cron-runner.redis.passwordSecret" . | fromJson }}
{{- if $secret.name }}
{{- /* A file, not a variable: nothing for the task's environment or `ps e` to show. */}}
- name: CRON_RUNNER_REDIS_PASSWORD_FILE
  value: /etc/cron-runner/redis-password/password
{{- end }}
{{- if $r.tls.enabled }}
{{- if not $r.tls.existingSecret }}
{{- fail "redis.tls.enabled is true but redis.tls.existingSecret is empty: name the Secret that holds the CA bundle" }}
{{- end }}
- name: CRON_RUNNER_REDIS_TLS_CA_FILE
  value: /etc/cron-runner/redis-tls/ca.crt
{{- if and $r.tls.certKey $r.tls.keyKey }}
- name: CRON_RUNNER_REDIS_TLS_CERT_FILE
  value: /etc/cron-runner/redis-tls/tls.crt
- name: CRON_RUNNER_REDIS_TLS_KEY_FILE
  value: /etc/cron-runner/redis-tls/tls.key
{{- end }}
{{- end }}
{{- if $r.sentinel.enabled }}
- name: CRON_RUNNER_REDIS_SENTINELS
  value: {{ join "," $r.sentinel.hosts | quote }}
- name: CRON_RUNNER_REDIS_SENTINEL_MASTER
  value: {{ $r.sentinel.masterName | quote }}
{{- if $r.sentinel.existingSecret }}
- name: CRON_RUNNER_REDIS_SENTINEL_PASSWORD_FILE
  value: /etc/cron-runner/redis-sentinel-password/password
{{- end }}
{{- end }}
{{- if $r.cluster.enabled }}
- name: CRON_RUNNER_REDIS_CLUSTER
  value: "true"
{{- end }}
{{- if $r.minReplicas }}
- name: CRON_RUNNER_REDIS_MIN_REPLICAS
  value: {{ int64 $r.minReplicas | quote }}
{{- end }}
{{- end }}

{{/*
OTEL_* for a task, as a JSON list, when telemetry is configured. The resource
attributes refer to the downward-API variables defined before them.
Call with (dict "root" $ "cronjob" $cronjobName).
*/}}
{{- define "cron-runner.otelEnv" -}}
{{- $t := .root.Values.telemetry }}
{{- $env := list }}
{{- if or $t.endpoint $t.env }}
{{- if $t.endpoint }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_ENDPOINT" "value" (toString $t.endpoint)) }}
{{- end }}
{{- if $t.protocol }}
{{- $env = append $env (dict "name" "OTEL_EXPORTER_OTLP_PROTOCOL" "value" (toString $t.protocol)) }}
{{- end }}
{{- if $t.serviceName }}
{{- $env = append $env (dict "name" "OTEL_SERVICE_NAME" "value" (toString $t.serviceName)) }}
{{- end }}
{{- $attrs := list (printf "k8s.namespace.name=%s" (include "cron-runner.namespace" .root)) "k8s.pod.name=$(CRON_RUNNER_HOLDER)" (printf "k8s.cronjob.name=%s" .cronjob) "k8s.job.name=$(CRON_RUNNER_JOB_NAME)" }}
{{- range $k := keys (default dict $t.resourceAttributes) | sortAlpha }}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString (index $t.resourceAttributes $k))) }}
{{- end }}
{{- $env = append $env (dict "name" "OTEL_RESOURCE_ATTRIBUTES" "value" (join "," $attrs)) }}
{{- $env = concat $env (include "cron-runner.envList" (default dict $t.env) | fromJsonArray) }}
{{- end }}
{{- $env | toJson }}
{{- end }}
