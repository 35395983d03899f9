{{/*
A duration as the runner reads one (runner/config/settings.py, parse_duration): a number of
seconds, or a number with ms, s, m or h. As JSON {"text", "seconds", "error"}: text is what
goes in the variable ("" when unset), error why it is not a duration. YAML numbers arrive as
float64: a whole one is written without an exponent (600, not 6e+02).
*/}}
{{- define "cron-runner.duration" -}}
{{- $out := dict "text" "" "seconds" 0.0 "error" "" }}
{{- if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- if lt (float64 .) 0.0 }}
{{- $_ := set $out "error" "it is negative" }}
{{- else }}
{{- $_ := set $out "text" (ternary (toString (int64 .)) (toString .) (eq (float64 .) (floor .))) }}
{{- $_ := set $out "seconds" (float64 .) }}
{{- end }}
{{- else if and (not (kindIs "invalid" .)) (ne (toString .) "") }}
{{- $s := toString . }}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)?$" $s }}
{{- $unit := regexReplaceAll "^[0-9.]+" $s "" }}
{{- $_ := set $out "text" $s }}
{{- $_ := set $out "seconds" (mulf (float64 (trimSuffix $unit $s)) (index (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "" 1.0) $unit)) }}
{{- else }}
{{- $_ := set $out "error" (ternary "it is negative" "it is not a duration" (hasPrefix "-" $s)) }}
{{- end }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/* A duration for people: a bare number is seconds. */}}
{{- define "cron-runner.showDuration" -}}
{{- . }}{{ if regexMatch "^[0-9.]+$" (toString .) }}s{{ end }}
{{- end }}

{{/* The policy fields of jobDefaults and a task (besides concurrencyPolicy, which they decide). */}}
{{- define "cron-runner.policyFields" -}}
{{- list "overlap" "overlapWait" "catchup" "catchupWindow" "pauseOnFailures" "rateLimit" | toJson }}
{{- end }}

{{/*
A task's scheduling policies (docs/design.md, Scheduling policies), checked, as JSON:
overlap, overlapWait, catchup, catchupWindow, pauseOnFailures and rateLimit as the runner's
variables get them ("" when unset: the task's own @task(...), else the runner's default), the
CronJob's concurrencyPolicy, and env, the [name value] pairs of what is set. A task's value
replaces jobDefaults' (cron-runner.jobSettings); rateLimit goes to enqueue tasks only.
Refuses, naming the task, what the runner would refuse (exit 78) or what would defeat the
policy in this cluster: a concurrencyPolicy that contradicts overlap.
Call with (dict "root" $ "name" $name "task" $task "job" $job).
*/}}
{{- define "cron-runner.policies" -}}
{{- $name := .name }}
{{- $task := default dict .task }}
{{- $job := .job }}
{{- $enqueue := eq (toString (default .root.Values.runner.mode $task.mode)) "enqueue" }}
{{- $from := dict }}
{{- range $field := concat (list "concurrencyPolicy") (include "cron-runner.policyFields" . | fromJsonArray) }}
{{- $_ := set $from $field (ternary "" " (from jobDefaults)" (hasKey $task $field)) }}
{{- end }}
{{- $durationForm := "a number of seconds, or a number with ms, s, m or h (90, 90s, 10m, 6h)" }}

{{- $overlap := "" }}
{{- if not (empty $job.overlap) }}
{{- $overlap = toString $job.overlap }}
{{- $overlaps := list "skip" "buffer-one" "replace" "allow-other-slots" }}
{{- if not (has $overlap $overlaps) }}
{{- fail (printf "task %q: overlap %q%s is not valid: expected %s" $name $overlap $from.overlap (join ", " $overlaps)) }}
{{- end }}
{{- end }}

{{- $wait := include "cron-runner.duration" $job.overlapWait | fromJson }}
{{- if $wait.error }}
{{- fail (printf "task %q: overlapWait %s%s is not valid (%s): expected %s" $name (toJson $job.overlapWait) $from.overlapWait $wait.error $durationForm) }}
{{- end }}
{{- if and $wait.text (eq $wait.seconds 0.0) }}
{{- fail (printf "task %q: overlapWait %q%s must be above 0: how long buffer-one or replace waits for the running slot; leave it empty for the runner's default" $name $wait.text $from.overlapWait) }}
{{- end }}

{{- $catchup := "" }}
{{- if not (empty $job.catchup) }}
{{- $catchup = toString $job.catchup }}
{{- $catchups := list "none" "latest" "all" }}
{{- if not (has $catchup $catchups) }}
{{- fail (printf "task %q: catchup %q%s is not valid: expected %s" $name $catchup $from.catchup (join ", " $catchups)) }}
{{- end }}
{{- end }}
{{- $window := include "cron-runner.duration" $job.catchupWindow | fromJson }}
{{- if $window.error }}
{{- fail (printf "task %q: catchupWindow %s%s is not valid (%s): expected %s" $name (toJson $job.catchupWindow) $from.catchupWindow $window.error $durationForm) }}
{{- end }}
{{- if has $catchup (list "latest" "all") }}
{{- if eq $window.seconds 0.0 }}
{{- fail (printf "task %q: catchup %s%s needs a catchupWindow above 0: how far back a run looks for missed slots (e.g. 6h)" $name $catchup $from.catchup) }}
{{- end }}
{{- if eq $overlap "allow-other-slots" }}
{{- fail (printf "task %q: catchup %s%s and overlap allow-other-slots%s cannot go together: missed slots run under the task's one lease, and allow-other-slots gives each slot its own (the runner refuses it too, exit 78); set catchup: none, or another overlap" $name $catchup $from.catchup $from.overlap) }}
{{- end }}
{{- end }}
{{- /* The runner refuses markers kept no longer than the window (it needs the window plus the
     schedule's shortest gap): a slot whose marker expired would look unrun and run again. */}}
{{- if gt $window.seconds 0.0 }}
{{- $retention := .root.Values.runner.slotRetention }}
{{- $retentionFrom := "runner.slotRetention" }}
{{- range $where, $env := dict "runner.env" .root.Values.runner.env "the task's env" $task.env }}
{{- $v := index (default dict $env) "CRON_RUNNER_SLOT_RETENTION" }}
{{- if not (kindIs "map" $v) }}
{{- if not (empty $v) }}{{ $retention = $v }}{{ $retentionFrom = printf "CRON_RUNNER_SLOT_RETENTION in %s" $where }}{{ end }}
{{- end }}
{{- end }}
{{- $kept := include "cron-runner.duration" $retention | fromJson }}
{{- if and $kept.text (not $kept.error) (le $kept.seconds $window.seconds) }}
{{- fail (printf "task %q: catchupWindow %s reaches back further than slot markers are kept (%s: %s), so a missed slot could not be told from one that ran; keep them for the window plus the schedule's shortest gap, or leave it empty: the runner then keeps them that long" $name $window.text $retentionFrom $kept.text) }}
{{- end }}
{{- end }}

{{- $pause := "" }}
{{- $p := $job.pauseOnFailures }}
{{- if or (kindIs "float64" $p) (kindIs "int" $p) (kindIs "int64" $p) }}
{{- if and (ge (float64 $p) 0.0) (eq (float64 $p) (floor $p)) }}{{ $pause = toString (int64 $p) }}{{ end }}
{{- else if and (kindIs "string" $p) (regexMatch "^[0-9]+$" $p) }}
{{- $pause = $p }}
{{- end }}
{{- if and (not $pause) (not (kindIs "invalid" $p)) (ne (toString $p) "") }}
{{- fail (printf "task %q: pauseOnFailures %s%s is not valid: expected a whole number, 0 or more: the failed runs in a row after which the task is paused everywhere (0: never)" $name (toJson $p) $from.pauseOnFailures) }}
{{- end }}

{{- $rate := "" }}
{{- if and $enqueue (not (empty $job.rateLimit)) }}
{{- $rate = toString $job.rateLimit }}
{{- $per := include "cron-runner.duration" (regexReplaceAll "^[^/]*/" $rate "") | fromJson }}
{{- if or (not (regexMatch "^[1-9][0-9]*/[0-9]+(\\.[0-9]+)?(ms|s|m|h)?$" $rate)) (eq $per.seconds 0.0) }}
{{- fail (printf "task %q: rateLimit %q%s is not valid: expected N/DURATION, at most N starts in any DURATION across every worker (N above 0, DURATION %s above 0), e.g. 10/1m" $name $rate $from.rateLimit $durationForm) }}
{{- end }}
{{- end }}

{{- /* The CronJob's own overlap control, for pods of this cluster: it must let the runner's
     policy happen (the Redis lease applies it across clusters and servers). */}}
{{- $derived := dict "skip" "Forbid" "buffer-one" "Allow" "replace" "Replace" "allow-other-slots" "Allow" }}
{{- $policy := toString (default "" $job.concurrencyPolicy) }}
{{- if not $policy }}
{{- $policy = index $derived (default "skip" $overlap) }}
{{- else if $overlap }}
{{- $contradicts := dict
  "skip/Replace" "Kubernetes stops the running slot's pod, and the new slot's runner finds the lease still held and skips: neither slot finishes"
  "buffer-one/Forbid" "Kubernetes does not start the next slot's Job while one runs in this cluster, so no slot waits to run after it"
  "buffer-one/Replace" "Kubernetes stops the running slot instead of letting the next one wait for it"
  "replace/Forbid" "Kubernetes does not start the newer slot's Job while one runs in this cluster, so nothing replaces it"
  "allow-other-slots/Forbid" "Kubernetes does not start another slot's Job while one runs in this cluster, so slots never run side by side"
  "allow-other-slots/Replace" "Kubernetes stops the running slot when the next one starts, so slots never run side by side" }}
{{- with index $contradicts (printf "%s/%s" $overlap $policy) }}
{{- fail (printf "task %q: concurrencyPolicy %s%s contradicts overlap %s%s: %s; set the task's concurrencyPolicy to %s, or to \"\" to follow overlap" $name $policy $from.concurrencyPolicy $overlap $from.overlap . (index $derived $overlap)) }}
{{- end }}
{{- end }}

{{- $env := list }}
{{- range $pair := list
  (list "CRON_RUNNER_OVERLAP" $overlap)
  (list "CRON_RUNNER_OVERLAP_WAIT" $wait.text)
  (list "CRON_RUNNER_CATCHUP" $catchup)
  (list "CRON_RUNNER_CATCHUP_WINDOW" $window.text)
  (list "CRON_RUNNER_PAUSE_ON_FAILURES" $pause)
  (list "CRON_RUNNER_RATE_LIMIT" $rate) }}
{{- if index $pair 1 }}{{ $env = append $env $pair }}{{ end }}
{{- end }}
{{- dict
  "overlap" $overlap "overlapWait" $wait.text "catchup" $catchup "catchupWindow" $window.text
  "pauseOnFailures" $pause "rateLimit" $rate "concurrencyPolicy" $policy "env" $env | toJson }}
{{- end }}
