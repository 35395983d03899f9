{{/*
The CronJob name of a task. The CronJob controller names each Job
<cronjob>-<minutes since epoch> (11 more characters) and the pod label
batch.kubernetes.io/job-name, which the runner reads its slot from, holds at
most 63: so a CronJob name may have at most 52. Fail instead of truncating,
which could give two tasks the same name.
*/}}
{{- define "cron-runner.cronjobName" -}}
{{- $name := printf "%s-%s" (include "cron-runner.fullname" .root) .name }}
{{- /* A task adopted from an existing CronJob may keep its name (dashboards, alerts). */}}
{{- $task := index (default dict .root.Values.tasks) .name }}
{{- if and (kindIs "map" $task) $task.cronJobName }}
{{- $name = toString $task.cronJobName }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "task %q: cronJobName %q is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)" .name $name) }}
{{- end }}
{{- end }}
{{- if gt (len $name) 52 }}
{{- fail (printf "task %q: its CronJob name %q is %d characters; Kubernetes allows at most 52 (each Job appends an 11-character timestamp). Shorten the task name, or set fullnameOverride." .name $name (len $name)) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* jobDefaults fields a task may override; the task's value replaces the default whole. */}}
{{- define "cron-runner.jobFields" -}}
{{- concat (list "concurrencyPolicy" "startingDeadlineSeconds" "successfulJobsHistoryLimit" "failedJobsHistoryLimit" "backoffLimit" "activeDeadlineSeconds" "ttlSecondsAfterFinished" "restartPolicy" "podFailurePolicy" "terminationGracePeriodSeconds" "resources" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "podAnnotations" "podLabels" "extraVolumes" "extraVolumeMounts" "runner" "image" "initContainers" "extraContainers") (include "cron-runner.policyFields" . | fromJsonArray) | toJson }}
{{- end }}

{{/*
A task's effective job settings as JSON: each jobDefaults field, unless the
task sets it. hasKey rather than `default`, so a task's 0 or false survives.
Call with (dict "root" $ "task" $task).
*/}}
{{- define "cron-runner.jobSettings" -}}
{{- $job := dict }}
{{- range $field := include "cron-runner.jobFields" . | fromJsonArray }}
{{- if hasKey $.task $field }}
{{- $_ := set $job $field (index $.task $field) }}
{{- else }}
{{- $_ := set $job $field (index $.root.Values.jobDefaults $field) }}
{{- end }}
{{- end }}
{{- $job | toJson }}
{{- end }}

{{/* Refuse a task the API server or the runner would refuse later, naming the task. */}}
{{- define "cron-runner.validateTask" -}}
{{- $name := .name }}
{{- $task := .task }}
{{- $job := .job }}
{{- /* extraPodSpec and extraContainerSpec carry what the chart writes nothing for: a field it
     writes itself would come out twice. */}}
{{- if kindIs "map" $task }}
{{- range $field, $written := dict
  "extraPodSpec" (list "restartPolicy" "terminationGracePeriodSeconds" "serviceAccountName" "serviceAccount" "automountServiceAccountToken" "enableServiceLinks" "securityContext" "priorityClassName" "imagePullSecrets" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "initContainers" "containers" "volumes")
  "extraContainerSpec" (list "name" "image" "imagePullPolicy" "command" "args" "workingDir" "env" "envFrom" "ports" "livenessProbe" "readinessProbe" "resources" "securityContext" "volumeMounts") }}
{{- range $key := keys (default dict (index $task $field)) | sortAlpha }}
{{- if has $key $written }}
{{- fail (printf "task %q: %s.%s: the chart writes this field itself; set the task's own setting for it instead" $name $field $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "task %q: a task name must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)" $name) }}
{{- end }}
{{- if has $name (include "cron-runner.reservedComponents" .root | fromJsonArray) }}
{{- fail (printf "task %q: this name is reserved: the chart's own pods use it (%s, as app.kubernetes.io/component); choose another key: a registered task of that name still runs, e.g. tasks.%s-job with task: %s" $name (include "cron-runner.reservedComponents" .root | fromJsonArray | join ", ") $name $name) }}
{{- end }}
{{- if not (kindIs "map" $task) }}
{{- fail (printf "task %q: expected a map with at least schedule and task or command" $name) }}
{{- end }}
{{- if not $task.schedule }}
{{- fail (printf "task %q: schedule is required (a 5-field cron expression such as \"0 2 * * *\")" $name) }}
{{- end }}
{{- with include "cron-runner.scheduleError" $task.schedule }}
{{- fail (printf "task %q: schedule %q would be refused by Kubernetes: %s (the CronJob schedule language: docs/design.md)" $name (toString $task.schedule) .) }}
{{- end }}
{{- $hasTask := not (empty $task.task) }}
{{- $hasCommand := not (empty $task.command) }}
{{- if and $hasTask $hasCommand }}
{{- fail (printf "task %q: set either task (a registered task name) or command (a list), not both" $name) }}
{{- end }}
{{- $inject := include "cron-runner.inject" $job }}
{{- if not (has $inject (list "none" "initContainer")) }}
{{- fail (printf "task %q: runner.inject %q is not valid: expected none (the runner image runs the task) or initContainer (the runner is copied into the task's own image)" $name $inject) }}
{{- end }}
{{- $image := default dict $job.image }}
{{- if not (kindIs "map" $image) }}
{{- fail (printf "task %q: image must be a map: {repository: php, tag: 8.3-cli}" $name) }}
{{- end }}
{{- if and (or $image.tag $image.digest $image.entrypoint $image.cmd) (not $image.repository) }}
{{- fail (printf "task %q: image.repository is required when image is set" $name) }}
{{- end }}
{{- range $key := list "entrypoint" "cmd" }}
{{- if and (index $image $key) (not (kindIs "slice" (index $image $key))) }}
{{- fail (printf "task %q: image.%s must be a list, e.g. [docker-php-entrypoint]" $name $key) }}
{{- end }}
{{- end }}
{{- if eq $inject "initContainer" }}
{{- if $hasTask }}
{{- fail (printf "task %q: runner.inject initContainer runs a command in the task's own image; a registered Python task (task) needs the runner image: set command, or runner.inject: none" $name) }}
{{- end }}
{{- if not $image.repository }}
{{- fail (printf "task %q: runner.inject initContainer needs the task's own image: set image.repository (and image.tag)" $name) }}
{{- end }}
{{- if not (include "cron-runner.taskCommand" (dict "task" $task "image" $image) | fromJsonArray) }}
{{- fail (printf "task %q: nothing to run: set command, or the image's own image.entrypoint and image.cmd (Kubernetes cannot read them from the image)" $name) }}
{{- end }}
{{- else }}
{{- if not (or $hasTask $hasCommand) }}
{{- fail (printf "task %q: set task (a registered task name) or command (a list)" $name) }}
{{- end }}
{{- if or $image.entrypoint $image.cmd }}
{{- fail (printf "task %q: image.entrypoint and image.cmd are for runner.inject initContainer; without it, the runner image runs command" $name) }}
{{- end }}
{{- end }}
{{- if and $hasTask $task.args }}
{{- fail (printf "task %q: args go with command only; `cron-runner run` takes no arguments for a registered task (pass settings through env)" $name) }}
{{- end }}
{{- if and $hasCommand (eq (toString (default .root.Values.runner.mode $task.mode)) "enqueue") }}
{{- fail (printf "task %q: mode enqueue needs task (a registered task name): workers run registered tasks, not commands; set mode: run for this task" $name) }}
{{- end }}
{{- $queueKeys := list }}
{{- range $key := list "queue" "retries" "timeLimit" "rateLimit" }}
{{- if hasKey $task $key }}{{ $queueKeys = append $queueKeys $key }}{{ end }}
{{- end }}
{{- if and $queueKeys (ne (toString (default .root.Values.runner.mode $task.mode)) "enqueue") }}
{{- fail (printf "task %q: %s: for queue mode only (the workers retry, time and rate-limit the run); set mode: enqueue, or remove them" $name (join ", " $queueKeys)) }}
{{- end }}
{{- if and $task.queue (not (regexMatch "^[A-Za-z_][A-Za-z0-9._-]{0,62}$" (toString $task.queue))) }}
{{- fail (printf "task %q: queue %q is not valid: expected a letter or '_' first, then letters, digits, '.', '_' or '-', at most 63 characters" $name (toString $task.queue)) }}
{{- end }}
{{- if and (hasKey $task "retries") (not (kindIs "map" $task.retries)) }}
{{- fail (printf "task %q: retries must be a map: {max: 3, minBackoff: 15s, maxBackoff: 1h}" $name) }}
{{- end }}
{{- range $var := list "CRON_RUNNER_SHUTDOWN_GRACE" "CRON_RUNNER_JOB_NAME" "CRON_RUNNER_CRONJOB_NAME" "CRON_RUNNER_SCHEDULED_TIMESTAMP" }}
{{- if or (hasKey (default dict $.root.Values.runner.env) $var) (hasKey (default dict $task.env) $var) }}
{{- fail (printf "task %q: %s is set by the chart and may not be overridden in env: the shutdown grace follows terminationGracePeriodSeconds (minus 5s), and the Job names give the slot" $name $var) }}
{{- end }}
{{- end }}
{{- if and $hasCommand (not (kindIs "slice" $task.command)) }}
{{- fail (printf "task %q: command must be a list, e.g. [php, artisan, report:send]" $name) }}
{{- end }}
{{- $grace := $job.terminationGracePeriodSeconds }}
{{- if or (kindIs "invalid" $grace) (lt (int64 $grace) 6) }}
{{- fail (printf "task %q: terminationGracePeriodSeconds must be at least 6: the runner gets 5 s less to stop the task and release its lease" $name) }}
{{- end }}
{{- if and $job.podFailurePolicy (ne (toString $job.restartPolicy) "Never") }}
{{- fail (printf "task %q: podFailurePolicy needs restartPolicy Never; set podFailurePolicy: null to use %s" $name (toString $job.restartPolicy)) }}
{{- end }}
{{- $_ := include "cron-runner.policies" . }}
{{- end }}

{{/*
Why the API server would refuse a CronJob schedule, or nothing: robfig/cron v3.0.1's
cron.ParseStandard (which it calls), plus its refusal of TZ in a schedule. The same rules as
runner/schedule/cron.py (docs/design.md, The schedule language); tests/chart/test_schedules.py
checks the two agree. Numbers beyond 999 (a step beyond 19 digits) are treated as refused;
@every durations are checked for their form, not for overflow past 2562047h (292 years).
*/}}
{{- define "cron-runner.scheduleError" -}}
{{- $s := toString . }}
{{- $errors := list }}
{{- $macros := list "@yearly" "@annually" "@monthly" "@weekly" "@daily" "@midnight" "@hourly" }}
{{- $duration := "^[-+]?(0|(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$" }}
{{- $fields := list }}
{{- range regexSplit "[\\t\\n\\v\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+" $s -1 }}
{{- if . }}{{ $fields = append $fields . }}{{ end }}
{{- end }}
{{- if contains "TZ" $s }}
{{- $errors = append $errors "a time zone (TZ= or CRON_TZ=) inside the schedule is refused by Kubernetes; set timeZone instead" }}
{{- else if hasPrefix "@" $s }}
{{- if hasPrefix "@every " $s }}
{{- if not (regexMatch $duration (trimPrefix "@every " $s)) }}
{{- $errors = append $errors (printf "%q is not a Go duration such as 90s or 1h30m" (trimPrefix "@every " $s)) }}
{{- end }}
{{- else if not (has $s $macros) }}
{{- $errors = append $errors (printf "unknown macro %q: expected one of %s (lower case, no spaces) or @every <duration>" $s (join ", " $macros)) }}
{{- end }}
{{- else if ne (len $fields) 5 }}
{{- $errors = append $errors (printf "it has %d fields: expected 5 (minute hour day-of-month month day-of-week)" (len $fields)) }}
{{- else }}
{{- $months := dict "jan" 1 "feb" 2 "mar" 3 "apr" 4 "may" 5 "jun" 6 "jul" 7 "aug" 8 "sep" 9 "oct" 10 "nov" 11 "dec" 12 }}
{{- $dows := dict "sun" 0 "mon" 1 "tue" 2 "wed" 3 "thu" 4 "fri" 5 "sat" 6 }}
{{- $bounds := list (list "minute" 0 59 dict) (list "hour" 0 23 dict) (list "day-of-month" 1 31 dict) (list "month" 1 12 $months) (list "day-of-week" 0 6 $dows) }}
{{- range $i, $field := $fields }}
{{- $b := index $bounds $i }}
{{- $name := index $b 0 }}{{ $low := index $b 1 }}{{ $high := index $b 2 }}{{ $names := index $b 3 }}
{{- range $item := splitList "," $field }}
{{- if $item }}
{{- $rs := splitList "/" $item }}
{{- $lh := splitList "-" (index $rs 0) }}
{{- $start := $low }}{{ $end := $high }}{{ $bad := "" }}
{{- if gt (len $rs) 2 }}
{{- $bad = "too many slashes" }}
{{- else if not (has (index $lh 0) (list "*" "?")) }}
{{- if gt (len $lh) 2 }}
{{- $bad = "too many hyphens" }}
{{- else }}
{{- $values := list }}
{{- range $v := $lh }}
{{- if hasKey $names (lower $v) }}
{{- $values = append $values (index $names (lower $v)) }}
{{- else if regexMatch "^\\+?0*[0-9]{1,3}$" $v }}
{{- $values = append $values (atoi $v) }}
{{- else }}
{{- $bad = printf "%q is not a number%s" $v (ternary " or a name" "" (gt (len $names) 0)) }}
{{- end }}
{{- end }}
{{- if not $bad }}
{{- $start = first $values }}{{ $end = last $values }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $bad) (eq (len $rs) 2) }}
{{- if not (regexMatch "^\\+?0*[1-9][0-9]{0,18}$" (index $rs 1)) }}
{{- $bad = printf "the step %q is not a positive number" (index $rs 1) }}
{{- else if eq (len $lh) 1 }}
{{- $end = $high }}
{{- end }}
{{- end }}
{{- if and (not $bad) (or (lt (int $start) (int $low)) (gt (int $end) (int $high))) }}
{{- $bad = printf "out of range %d-%d" (int $low) (int $high) }}
{{- else if and (not $bad) (gt (int $start) (int $end)) }}
{{- $bad = "the range runs backwards" }}
{{- end }}
{{- if $bad }}
{{- $errors = append $errors (printf "%s field %q: %s" $name $field $bad) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $errors }}{{ first $errors }}{{ end }}
{{- end }}

{{/* A task's runner.inject: "none" (the runner image is the container) or "initContainer". */}}
{{- define "cron-runner.inject" -}}
{{- default "none" (default dict .runner).inject }}
{{- end }}

{{/* A task's own image (its `image` map) as a reference: repository[:tag][@digest]. */}}
{{- define "cron-runner.taskImage" -}}
{{- .repository }}{{ with .tag }}:{{ . }}{{ end }}{{ with .digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
The command a task's runner execs, as a JSON list, the way a container runtime builds one:
`command` + `args` when the task sets a command; else the image's entrypoint + (`args`, or
else the image's cmd). Kubernetes cannot read an image's entrypoint and cmd, so a task that
relies on them gives them as `image.entrypoint` and `image.cmd`.
Call with (dict "task" $task "image" $image).
*/}}
{{- define "cron-runner.taskCommand" -}}
{{- if .task.command }}
{{- concat .task.command (default list .task.args) | toJson }}
{{- else }}
{{- concat (default list .image.entrypoint) (default (default list .image.cmd) .task.args) | toJson }}
{{- end }}
{{- end }}

{{/*
How a task's pod and container security contexts loosen the chart's restricted defaults, as a
JSON list of "field: value" strings; empty when they keep them. A different non-root user
(an app image's own, such as www-data) is not a loosening.
Call with (dict "root" $ "task" $task).
*/}}
{{- define "cron-runner.loosened" -}}
{{- $pod := ternary (default dict .task.podSecurityContext) .root.Values.podSecurityContext (hasKey .task "podSecurityContext") }}
{{- $c := ternary (default dict .task.securityContext) .root.Values.securityContext (hasKey .task "securityContext") }}
{{- $out := list }}
{{- if not (or (eq (toJson $pod.runAsNonRoot) "true") (eq (toJson $c.runAsNonRoot) "true")) }}
{{- $out = append $out "runAsNonRoot is not true" }}
{{- end }}
{{- if or (eq (toJson $pod.runAsUser) "0") (eq (toJson $c.runAsUser) "0") }}
{{- $out = append $out "runAsUser: 0" }}
{{- end }}
{{- $seccomp := default (default dict $pod.seccompProfile).type (default dict $c.seccompProfile).type }}
{{- if not (has (toString $seccomp) (list "RuntimeDefault" "Localhost")) }}
{{- $out = append $out (printf "seccompProfile.type: %s" (default "unset" $seccomp)) }}
{{- end }}
{{- if ne (toJson $c.allowPrivilegeEscalation) "false" }}
{{- $out = append $out "securityContext.allowPrivilegeEscalation is not false" }}
{{- end }}
{{- if ne (toJson $c.readOnlyRootFilesystem) "true" }}
{{- $out = append $out "securityContext.readOnlyRootFilesystem is not true" }}
{{- end }}
{{- if eq (toJson $c.privileged) "true" }}
{{- $out = append $out "securityContext.privileged: true" }}
{{- end }}
{{- $caps := default dict $c.capabilities }}
{{- if not (has "ALL" (default list $caps.drop)) }}
{{- $out = append $out "securityContext.capabilities.drop lacks ALL" }}
{{- end }}
{{- with $caps.add }}
{{- $out = append $out (printf "securityContext.capabilities.add: %s" (join "," .)) }}
{{- end }}
{{- $extra := default dict .task.extraPodSpec }}
{{- range $field := list "hostNetwork" "hostPID" "hostIPC" }}
{{- if eq (toJson (index $extra $field)) "true" }}
{{- $out = append $out (printf "extraPodSpec.%s: true" $field) }}
{{- end }}
{{- end }}
{{- $out | toJson }}
{{- end }}
