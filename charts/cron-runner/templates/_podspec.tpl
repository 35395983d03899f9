{{/*
The pod of every workload that runs the runner: the tasks' and the watchdog's CronJobs, the
serve and worker Deployments (as a PodTemplateSpec, cron-runner.podTemplate) and the helm test
Pod. What they share is written here once: the release's service account, pod and container
security contexts and image pull secrets, service links off, /tmp and the Redis secrets mounted
(cron-runner.volumes), runner.envFrom. A workload passes only what differs. Keys come out in one
fixed order, and each volume and mount with its name first, so that a change here shows as a
change in manifests/ and nowhere else.

The bundled Redis (redis-statefulset.yaml) is another kind of pod and writes its own: another
image and user (redis.bundled.uid), no service account, no runner environment, no /tmp sizeLimit
or Redis secrets; it would share only service links off and the pull secrets.

Call with a dict:
  root                            $
  container                       the runner's container, below
  terminationGracePeriodSeconds   when the workload sets one (the test Pod does not)
  restartPolicy                   a Job's
  serviceAccountName              else the release's
  automountServiceAccountToken, securityContext (the pod's)
                                  when given, even as null; else the release's
  priorityClassName, nodeSelector, tolerations, affinity, topologySpreadConstraints
  initContainers, extraContainers the user's own, as given
  chartInitContainers             the chart's, container dicts (cron-runner.container)
  volumes                         after /tmp and the Redis secrets
  extraPodSpec                    PodSpec fields the chart writes nothing for, as given
  tmp                             false: no /tmp emptyDir (the task keeps its image's /tmp)
  enableServiceLinks              true for a task that keeps them (default off)

The runner's container is a dict for cron-runner.container with "name", "args" and "env" (the
pod's cron-runner.env) at least. image, imagePullPolicy and command default to the release's
image and `cron-runner`; securityContext, when not given (null is given), to the release's;
"envFrom" goes after runner.envFrom, "volumeMounts" after /tmp and the Redis secrets.
*/}}
{{- define "cron-runner.podSpec" -}}
{{- $root := .root }}
{{- $c := .container }}
{{- $chartVolumes := include "cron-runner.volumes" $root | fromYamlArray }}
{{- $chartMounts := include "cron-runner.volumeMounts" $root | fromYamlArray }}
{{- /* A task whose image's own /tmp is writable (or which mounts its own) keeps it: the runner writes none. */}}
{{- if and (hasKey . "tmp") (not .tmp) }}
{{- $kept := list }}
{{- range $chartVolumes }}{{ if ne .name "tmp" }}{{ $kept = append $kept . }}{{ end }}{{ end }}
{{- $chartVolumes = $kept }}
{{- $kept = list }}
{{- range $chartMounts }}{{ if ne .name "tmp" }}{{ $kept = append $kept . }}{{ end }}{{ end }}
{{- $chartMounts = $kept }}
{{- end }}
{{- $volumes := concat $chartVolumes (default list .volumes) }}
{{- $container := dict
  "name" $c.name
  "image" (default (include "cron-runner.image" $root) $c.image)
  "imagePullPolicy" (default $root.Values.image.pullPolicy $c.imagePullPolicy)
  "command" (default (list "cron-runner") $c.command)
  "args" $c.args
  "workingDir" $c.workingDir
  "env" $c.env
  "envFrom" (concat (default list $root.Values.runner.envFrom) (default list $c.envFrom))
  "ports" $c.ports
  "livenessProbe" $c.livenessProbe
  "readinessProbe" $c.readinessProbe
  "resources" $c.resources
  "securityContext" (ternary $c.securityContext $root.Values.securityContext (hasKey $c "securityContext"))
  "volumeMounts" (concat $chartMounts (default list $c.volumeMounts))
  "extra" $c.extra }}
{{- with .restartPolicy }}
restartPolicy: {{ . }}
{{- end }}
{{- if hasKey . "terminationGracePeriodSeconds" }}
terminationGracePeriodSeconds: {{ int64 .terminationGracePeriodSeconds }}
{{- end }}
serviceAccountName: {{ default (include "cron-runner.serviceAccountName" $root) .serviceAccountName }}
automountServiceAccountToken: {{ if ternary .automountServiceAccountToken $root.Values.serviceAccount.automountServiceAccountToken (hasKey . "automountServiceAccountToken") }}true{{ else }}false{{ end }}
enableServiceLinks: {{ if .enableServiceLinks }}true{{ else }}false{{ end }}
securityContext:
  {{- toYaml (ternary .securityContext $root.Values.podSecurityContext (hasKey . "securityContext")) | nindent 2 }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
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
  {{- include "cron-runner.container" $container | nindent 2 }}
  {{- with .extraContainers }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $volumes }}
volumes:
  {{- include "cron-runner.namedList" . | trim | nindent 2 }}
{{- end }}
{{- with .extraPodSpec }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A PodTemplateSpec (a CronJob's or a Deployment's): the labels, with the workload's podLabels
under them (the chart's win: the NetworkPolicies select on them), its podAnnotations, and the
pod spec. Call with the dict of cron-runner.podSpec plus "labels", "podLabels", "podAnnotations".
*/}}
{{- define "cron-runner.podTemplate" -}}
metadata:
  labels:
    {{- toYaml (merge (dict) .labels (default dict .podLabels)) | nindent 4 }}
  {{- with .podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "cron-runner.podSpec" . | trim | nindent 2 }}
{{- end }}

{{/*
One container as a list item, keys in a fixed order. A dict with "name", "image",
"imagePullPolicy", "command", "args", "workingDir", "env", "envFrom", "ports", "livenessProbe",
"readinessProbe", "resources", "securityContext", "volumeMounts"; empty ones are left out, but
for env (when the key is there) and securityContext.
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
  {{- range $field := list "envFrom" "ports" "livenessProbe" "readinessProbe" "resources" }}
  {{- with index $ $field }}
  {{ $field }}:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  {{- with .volumeMounts }}
  volumeMounts:
    {{- include "cron-runner.namedList" . | trim | nindent 4 }}
  {{- end }}
  {{- with .extra }}
  {{- toYaml . | nindent 2 }}
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

{{/* The volumes of every pod that runs the runner: /tmp, and each Redis secret (cron-runner.redis.env names the files). */}}
{{- define "cron-runner.volumes" -}}
{{- $tls := .Values.redis.tls }}
- name: tmp
  emptyDir:
    {{- if .Values.tmp.sizeLimit }}
    sizeLimit: {{ .Values.tmp.sizeLimit }}
    {{- else }} {}
    {{- end }}
{{- $secret := include "cron-runner.redis.passwordSecret" . | fromJson }}
{{- if $secret.name }}
- name: redis-password
  secret:
    secretName: {{ $secret.name }}
    defaultMode: 0444
    items:
      - key: {{ $secret.key }}
        path: password
{{- end }}
{{- if and .Values.redis.sentinel.enabled .Values.redis.sentinel.existingSecret }}
- name: redis-sentinel-password
  secret:
    secretName: {{ .Values.redis.sentinel.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.redis.sentinel.passwordKey }}
        path: password
{{- end }}
{{- if $tls.enabled }}
- name: redis-tls
  secret:
    secretName: {{ $tls.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ $tls.caKey }}
        path: ca.crt
      {{- if and $tls.certKey $tls.keyKey }}
      - key: {{ $tls.certKey }}
        path: tls.crt
      - key: {{ $tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}

{{/* Where the runner's container mounts cron-runner.volumes. */}}
{{- define "cron-runner.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if (include "cron-runner.redis.passwordSecret" . | fromJson).name }}
- name: redis-password
  mountPath: /etc/cron-runner/redis-password
  readOnly: true
{{- end }}
{{- if and .Values.redis.sentinel.enabled .Values.redis.sentinel.existingSecret }}
- name: redis-sentinel-password
  mountPath: /etc/cron-runner/redis-sentinel-password
  readOnly: true
{{- end }}
{{- if .Values.redis.tls.enabled }}
- name: redis-tls
  mountPath: /etc/cron-runner/redis-tls
  readOnly: true
{{- end }}
{{- end }}
