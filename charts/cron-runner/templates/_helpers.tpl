{{/* Chart name, overridable. */}}
{{- define "cron-runner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name. Not truncated: CronJob names are checked
whole in "cron-runner.cronjobName", where truncating could make two tasks collide.
*/}}
{{- define "cron-runner.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cron-runner.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cron-runner.namespace" -}}
{{- .Release.Namespace }}
{{- end }}

{{/*
The labels the chart finds its own objects and pods by (NetworkPolicies, Services, monitors),
under a prefix of its own, so that an app's own app.kubernetes.io/* labels never collide with
them. The Deployment and StatefulSet selectors (cron-runner.selectorLabels) stay as they were:
a selector cannot change in place, and `helm upgrade` from an earlier release must work.
*/}}
{{- define "cron-runner.ownLabels" -}}
cron-runner.io/name: {{ include "cron-runner.name" . }}
cron-runner.io/instance: {{ .Release.Name }}
{{- end }}

{{/* cron-runner.ownLabels of one component (serve, worker, bundled-redis, a task). Call with (dict "root" $ "name" $component). */}}
{{- define "cron-runner.ownComponentLabels" -}}
{{ include "cron-runner.ownLabels" .root }}
cron-runner.io/component: {{ .name }}
{{- end }}

{{- define "cron-runner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cron-runner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cron-runner.labels" -}}
helm.sh/chart: {{ include "cron-runner.chart" . }}
{{ include "cron-runner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "cron-runner.ownLabels" . }}
{{- end }}

{{/* Components the chart itself uses; no task may take these names. */}}
{{- define "cron-runner.reservedComponents" -}}
{{- list "bundled-redis" "connection-test" "serve" "watchdog" "worker" | toJson }}
{{- end }}

{{/*
Labels of one task's objects and pods: the standard ones plus
app.kubernetes.io/component=<task>, which `kubectl logs -l` selects on.
Call with (dict "root" $ "name" $taskName).
*/}}
{{- define "cron-runner.taskLabels" -}}
{{ include "cron-runner.labels" .root }}
app.kubernetes.io/component: {{ .name }}
cron-runner.io/component: {{ .name }}
{{- end }}

{{- define "cron-runner.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "cron-runner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cron-runner.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cron-runner.redis.fullname" -}}
{{- printf "%s-redis" (include "cron-runner.fullname" .) }}
{{- end }}

{{- define "cron-runner.redis.selectorLabels" -}}
{{ include "cron-runner.selectorLabels" . }}
app.kubernetes.io/component: bundled-redis
{{- end }}

{{/* What the bundled Redis's Service and NetworkPolicy select its pod by. */}}
{{- define "cron-runner.redis.podLabels" -}}
{{ include "cron-runner.ownComponentLabels" (dict "root" . "name" "bundled-redis") }}
{{- end }}

{{/* The Secret and key the Redis password comes from; empty name when there is none. */}}
{{- define "cron-runner.redis.passwordSecret" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- dict "name" .Values.redis.auth.existingSecret "key" .Values.redis.auth.passwordKey | toJson }}
{{- else if .Values.redis.bundled.enabled }}
{{- dict "name" (include "cron-runner.redis.fullname" .) "key" "password" | toJson }}
{{- else }}
{{- dict "name" "" "key" "" | toJson }}
{{- end }}
{{- end }}

{{/* True when a Redis to connect to is configured. */}}
{{- define "cron-runner.redis.configured" -}}
{{- $r := .Values.redis }}
{{- if or $r.url $r.host $r.bundled.enabled (and $r.sentinel.enabled $r.sentinel.hosts) }}true{{ end }}
{{- end }}

{{/*
CRON_RUNNER_REDIS_URL, never with credentials. With Sentinel the host part
names the monitored primary (the runner asks the sentinels for its address);
only the scheme and db are used.
*/}}
{{- define "cron-runner.redis.url" -}}
{{- $r := .Values.redis }}
{{- $scheme := "redis" }}
{{- if $r.tls.enabled }}{{ $scheme = "rediss" }}{{ end }}
{{- if $r.url }}
{{- if or (regexMatch "^[a-z]+://[^/]*@" $r.url) (regexMatch "(?i)[?&][^=&#]*password=" $r.url) }}
{{- fail "redis.url must not carry credentials (user:pass@ or ?password=): put the password in a Secret and set redis.auth.existingSecret (and redis.auth.username for an ACL user)" }}
{{- end }}
{{- if and $r.tls.enabled (hasPrefix "redis://" $r.url) }}
{{- fail "redis.tls.enabled is true but redis.url starts with redis://: use rediss://" }}
{{- end }}
{{- $r.url }}
{{- else if $r.bundled.enabled }}
{{- if $r.tls.enabled }}
{{- fail "redis.tls.enabled cannot be combined with redis.bundled.enabled: the bundled Redis has no TLS" }}
{{- end }}
{{- printf "redis://%s.%s.svc:6379/%d" (include "cron-runner.redis.fullname" .) (include "cron-runner.namespace" .) (int64 $r.db) }}
{{- else if $r.sentinel.enabled }}
{{- if not $r.sentinel.hosts }}
{{- fail "redis.sentinel.enabled is true but redis.sentinel.hosts is empty: list the sentinels as host:port" }}
{{- end }}
{{- printf "%s://%s/%d" $scheme $r.sentinel.masterName (int64 $r.db) }}
{{- else if $r.host }}
{{- printf "%s://%s:%d/%d" $scheme $r.host (int64 $r.port) (int64 $r.db) }}
{{- else }}
{{- fail "no Redis configured: set redis.host (or redis.url, redis.sentinel.hosts), or redis.bundled.enabled=true to try the chart out" }}
{{- end }}
{{- end }}

{{/* The key scope and prefix as NOTES shows them: runner.env, where set, wins (mergeEnv). */}}
{{- define "cron-runner.scope" -}}
{{- $env := default dict .Values.runner.env }}
{{- if kindIs "string" $env.CRON_RUNNER_SCOPE }}{{ $env.CRON_RUNNER_SCOPE }}
{{- else }}{{ default (default (include "cron-runner.namespace" .) (include "cron-runner.subchartScope" .)) .Values.runner.scope }}{{ end }}
{{- end }}

{{/*
As a dependency of an app's own chart (values under its key), each app's release is a key
scope of its own, <namespace>.<release>: two apps' releases in one namespace may both have a
task "report", and they must not share its lease. Empty as a release of its own, whose scope
stays the namespace. runner.scope, when set, wins either way.
*/}}
{{- define "cron-runner.subchartScope" -}}
{{- if contains "/charts/" .Template.BasePath }}
{{- $scope := printf "%s.%s" (include "cron-runner.namespace" .) .Release.Name }}
{{- if gt (len $scope) 63 }}
{{- fail (printf "the key scope %q (namespace.release, as a dependency of another chart) is %d characters; at most 63 fit: set runner.scope" $scope (len $scope)) }}
{{- end }}
{{- $scope }}
{{- end }}
{{- end }}

{{- define "cron-runner.keyPrefix" -}}
{{- $env := default dict .Values.runner.env }}
{{- if kindIs "string" $env.CRON_RUNNER_KEY_PREFIX }}{{ $env.CRON_RUNNER_KEY_PREFIX }}
{{- else }}{{ default "cron-runner" .Values.runner.keyPrefix }}{{ end }}
{{- end }}

{{/* redis.conf of the bundled Redis. The password is passed on the command line from the Secret. */}}
{{- define "cron-runner.redis.conf" -}}
{{- $b := .Values.redis.bundled -}}
port 6379
dir /data
# Leases must survive a restart: log every write, fsync once a second.
appendonly yes
appendfsync everysec
# An evicting policy silently drops leases.
maxmemory-policy {{ $b.maxmemoryPolicy }}
{{- with $b.maxmemory }}
maxmemory {{ . }}
{{- end }}
{{- end }}

{{/*
The alert rules of the PrometheusRule, as YAML groups: every expression names only metrics
`cron-runner serve` exposes (tests/chart/test_serve.py checks them with promtool).
*/}}
{{- define "cron-runner.alertGroups" -}}
{{- $r := .Values.serve.prometheusRule }}
{{- $sel := printf "namespace=%q" (include "cron-runner.namespace" .) }}
- name: cron-runner
  rules:
    - alert: CronRunnerTaskOverdue
      expr: max by (namespace, task) (cron_runner_task_overdue{ {{- $sel -}} }) == 1
      for: {{ $r.overdueFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "cron-runner task {{ "{{" }} $labels.task {{ "}}" }} missed a scheduled slot"
        description: "A slot passed with no run; it stays reported until it runs or `cron-runner ack {{ "{{" }} $labels.task {{ "}}" }} SLOT`."
    - alert: CronRunnerTaskFailing
      expr: max by (namespace, task) (cron_runner_task_consecutive_failures{ {{- $sel -}} }) >= {{ $r.failingRuns }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "cron-runner task {{ "{{" }} $labels.task {{ "}}" }} failed {{ "{{" }} $value {{ "}}" }} times in a row"
    - alert: CronRunnerLeaseLost
      expr: sum by (namespace, task) (increase(cron_runner_task_runs_total{ {{- $sel -}} ,outcome="lease_lost"}[{{ $r.window }}])) > 0
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "cron-runner task {{ "{{" }} $labels.task {{ "}}" }} lost its lease during a run (exit 75)"
    - alert: CronRunnerRedisUnreachable
      expr: (max by (namespace) (cron_runner_up{ {{- $sel -}} }) == 0) or (sum by (namespace, task) (increase(cron_runner_task_runs_total{ {{- $sel -}} ,outcome="unavailable"}[{{ $r.window }}])) > 0)
      for: {{ $r.redisFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "cron-runner cannot reach Redis (runs exit 69 and do not run)"
    - alert: CronRunnerOverMaxRuntime
      expr: max by (namespace, task) (cron_runner_task_over_max_runtime{ {{- $sel -}} }) == 1
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "cron-runner task {{ "{{" }} $labels.task {{ "}}" }} has run longer than its max runtime"
    {{- if .Values.watchdog.enabled }}
    - alert: CronRunnerWatchdogMissing
      expr: max by (namespace) (cron_runner_watchdog_heartbeat_present{ {{- $sel -}} }) == 0
      for: {{ $r.watchdogFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "the cron-runner watchdog has not run within its heartbeat TTL"
    {{- end }}
    - alert: CronRunnerDeadLetters
      expr: max by (namespace, queue) (cron_runner_queue_dead_letters{ {{- $sel -}} }) > 0
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "queue {{ "{{" }} $labels.queue {{ "}}" }} has {{ "{{" }} $value {{ "}}" }} dead letters (cron-runner dlq list)"
    - alert: CronRunnerQueueLatencyHigh
      expr: histogram_quantile(0.99, sum by (namespace, task, le) (rate(cron_runner_queue_latency_seconds_bucket{ {{- $sel -}} }[{{ $r.window }}]))) > {{ $r.queueLatencyP99Seconds }}
      for: {{ $r.latencyFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: "task {{ "{{" }} $labels.task {{ "}}" }}: the p99 from enqueue to a worker's start is over {{ $r.queueLatencyP99Seconds }}s"
{{- end }}

{{/*
The ACL rule that confines the release's Redis user to its scope's keys: the scope's hash tag
`PREFIX:{SCOPE:` starts every key of its tasks and its index (docs/reliability.md, One ACL
user per scope; the rule is tested word for word there).
*/}}
{{- define "cron-runner.redis.scopeAcl" -}}
{{- $scope := include "cron-runner.scope" . }}
{{- $prefix := include "cron-runner.keyPrefix" . }}
{{- $user := default "cron-runner" .Values.redis.auth.username }}
{{- $commands := "+evalsha +eval +get +set +pexpire +pttl +incr +time +hmget +hget +del +xadd +hset +sadd +ping +smembers +hgetall +xrange +xrevrange +hsetnx +hincrby +srem +hdel" }}
{{- if and (not .Values.redis.bundled.enabled) (ne (int64 .Values.redis.db) 0) }}{{ $commands = printf "%s +select" $commands }}{{ end }}
{{- if .Values.redis.minReplicas }}{{ $commands = printf "%s +wait" $commands }}{{ end }}
{{- printf "ACL SETUSER %s on >PASSWORD resetkeys ~%s:{%s:* resetchannels -@all %s" $user $prefix $scope $commands }}
{{- end }}
