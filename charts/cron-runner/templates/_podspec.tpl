{{/*
The pod spec of every CronJob the chart renders (the tasks and the watchdog), in one place;
a Deployment's may use it too (no restartPolicy, optional topologySpreadConstraints).
Keys come out in one fixed order, and each volume and mount with its name first, so that a
change here shows as a change in manifests/ and nowhere else.

Call with a dict: "root" $, "restartPolicy", "terminationGracePeriodSeconds",
"serviceAccountName", "automountServiceAccountToken", "securityContext" (the pod's),
"priorityClassName", "nodeSelector", "tolerations", "affinity", "topologySpreadConstraints",
"initContainers" and "extraContainers" (the user's own, as given), "chartInitContainers" and
"containers" (the chart's, lists of container dicts, see cron-runner.container), "volumes".
*/}}
{{- define "cron-runner.podSpec" -}}
{{- with .restartPolicy }}
restartPolicy: {{ . }}
{{- end }}
terminationGracePeriodSeconds: {{ int64 .terminationGracePeriodSeconds }}
serviceAccountName: {{ .serviceAccountName }}
automountServiceAccountToken: {{ if .automountServiceAccountToken }}true{{ else }}false{{ end }}
enableServiceLinks: false
securityContext:
  {{- toYaml .securityContext | nindent 2 }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or .initContainers .chartInitContainers }}
initContainers:
  {{- with .initContainers }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- range .chartInitContainers }}
  {{- include "cron-runner.container" . | nindent 2 }}
  {{- end }}
{{- end }}
containers:
  {{- range .containers }}
  {{- include "cron-runner.container" . | nindent 2 }}
  {{- end }}
  {{- with .extraContainers }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
volumes:
  {{- include "cron-runner.namedList" .volumes | nindent 2 }}
{{- end }}

{{/*
One container as a list item, keys in a fixed order. A dict with "name", "image",
"imagePullPolicy", "command", "args", "workingDir", "env", "envFrom", "resources",
"securityContext", "volumeMounts"; empty ones are left out, but for env and securityContext.
*/}}
{{- define "cron-runner.container" -}}
- name: {{ .name }}
  image: {{ .image }}
  imagePullPolicy: {{ .imagePullPolicy }}
  {{- with .command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .workingDir }}
  workingDir: {{ . | quote }}
  {{- end }}
  {{- if hasKey . "env" }}
  env:
    {{- toYaml .env | nindent 4 }}
  {{- end }}
  {{- with .envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  {{- with .volumeMounts }}
  volumeMounts:
    {{- include "cron-runner.namedList" . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* A list of named objects (volumes, mounts), each with its name first. */}}
{{- define "cron-runner.namedList" -}}
{{- range . }}
- name: {{ .name }}
  {{- with omit . "name" }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
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
{{- $out | toJson }}
{{- end }}
