{{/* workerDefaults fields a group may override; the group's value replaces the default whole. */}}
{{- define "cron-runner.workerFields" -}}
{{- list "replicas" "queues" "processes" "threads" "terminationGracePeriodSeconds" "resources" "podDisruptionBudget" "env" "envFrom" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "podAnnotations" "podLabels" "extraVolumes" "extraVolumeMounts" | toJson }}
{{- end }}

{{/*
A worker group's effective settings as JSON (hasKey, so a group's 0 or [] survives).
Call with (dict "root" $ "group" $group).
*/}}
{{- define "cron-runner.workerSettings" -}}
{{- $w := dict }}
{{- range $field := include "cron-runner.workerFields" . | fromJsonArray }}
{{- if hasKey $.group $field }}
{{- $_ := set $w $field (index $.group $field) }}
{{- else }}
{{- $_ := set $w $field (index $.root.Values.workerDefaults $field) }}
{{- end }}
{{- end }}
{{- $w | toJson }}
{{- end }}

{{/*
The Deployment name of a worker group. Like a CronJob's, at most 52 characters: its pods add
a 16-character suffix and a pod's hostname holds 63 at most. Fail rather than truncate.
*/}}
{{- define "cron-runner.workerName" -}}
{{- $name := printf "%s-worker-%s" (include "cron-runner.fullname" .root) .name }}
{{- if gt (len $name) 52 }}
{{- fail (printf "worker group %q: its Deployment name %q is %d characters; at most 52 fit (pods add a 16-character suffix). Shorten the group name, or set fullnameOverride." .name $name (len $name)) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* Selector labels of one worker group's pods. Call with (dict "root" $ "name" $group). */}}
{{- define "cron-runner.workerSelectorLabels" -}}
{{ include "cron-runner.selectorLabels" .root }}
app.kubernetes.io/component: worker
cron-runner/worker-group: {{ .name }}
{{- end }}

{{/* Refuse a worker group the API server or the runner would refuse later, naming it. */}}
{{- define "cron-runner.validateWorker" -}}
{{- $name := .name }}
{{- $w := .worker }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "worker group %q: a group name must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)" $name) }}
{{- end }}
{{- if or (kindIs "invalid" $w.replicas) (lt (int64 $w.replicas) 0) }}
{{- fail (printf "worker group %q: replicas must be 0 or more" $name) }}
{{- end }}
{{- range $field := list "processes" "threads" }}
{{- $v := index $w $field }}
{{- if or (kindIs "invalid" $v) (lt (int64 $v) 1) }}
{{- fail (printf "worker group %q: %s must be at least 1" $name $field) }}
{{- end }}
{{- end }}
{{- range $q := default list $w.queues }}
{{- if not (regexMatch "^[A-Za-z_][A-Za-z0-9._-]{0,62}$" (toString $q)) }}
{{- fail (printf "worker group %q: queue %q is not valid: a letter or '_' first, then letters, digits, '.', '_' or '-'" $name (toString $q)) }}
{{- end }}
{{- end }}
{{- $grace := $w.terminationGracePeriodSeconds }}
{{- if or (kindIs "invalid" $grace) (lt (int64 $grace) 6) }}
{{- fail (printf "worker group %q: terminationGracePeriodSeconds must be at least 6: the worker gets 5 s less to let running jobs finish" $name) }}
{{- end }}
{{- $pdb := default dict $w.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.maxUnavailable)) (not (kindIs "invalid" $pdb.minAvailable)) }}
{{- fail (printf "worker group %q: podDisruptionBudget takes maxUnavailable or minAvailable, not both" $name) }}
{{- end }}
{{- end }}
