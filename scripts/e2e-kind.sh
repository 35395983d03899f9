#!/usr/bin/env bash
# The user's path end to end, on a machine with Docker, kind, helm and kubectl (not this
# repository's CI machines, which have no Docker daemon; they run `make test-image`):
# build the image, load it into a throwaway kind cluster, install the chart with its
# bundled Redis, start three Jobs of one CronJob at once, and check that exactly one ran.
# KEEP=1 keeps the cluster for a look around.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-cron-runner-e2e}
NS=cron-system
RELEASE=e2e
CRONJOB=$RELEASE-cron-runner-report
JOBS=(manual-1 manual-2 manual-3)

docker build -t cron-runner:e2e .
kind create cluster --name "$CLUSTER" --wait 120s
trap '[[ ${KEEP:-0} == 1 ]] || kind delete cluster --name "$CLUSTER"' EXIT
kind load docker-image cron-runner:e2e --name "$CLUSTER"

# A schedule that never fires during the test: the Jobs are created by hand below. The
# task outlasts the Jobs' start-up spread, so all three contend for the lease.
helm install "$RELEASE" charts/cron-runner --namespace "$NS" --create-namespace --wait \
    --set image.repository=cron-runner --set image.tag=e2e --set image.pullPolicy=Never \
    --set redis.bundled.enabled=true \
    --set tasks.report.schedule='0 0 1 1 *' \
    --set-json 'tasks.report.command=["sh","-c","echo report body ran; sleep 20"]'

# What a duplicate trigger looks like: `kubectl create job --from`, three times at once.
for job in "${JOBS[@]}"; do
    kubectl -n "$NS" create job --from="cronjob/$CRONJOB" "$job" &
done
wait
kubectl -n "$NS" wait --for=condition=complete --timeout=180s "${JOBS[@]/#/job/}"

# One Job ran the task (outcome "ran"); the other two skipped it (outcome "skipped_held").
ran=0
for job in "${JOBS[@]}"; do
    logs=$(kubectl -n "$NS" logs "job/$job")
    printf '== kubectl logs job/%s\n%s\n' "$job" "$logs"
    ran=$((ran + $(grep -c 'report body ran' <<<"$logs" || true)))
done
echo "runs of the task body: $ran (want exactly 1)"
[[ $ran == 1 ]]
