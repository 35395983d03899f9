#!/usr/bin/env bash
# Starts a single-node Kubernetes from the binaries scripts/k8s-build.sh made: etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler, as plain background processes on
# free ports of 127.0.0.1, then the node (scripts/k8s-node.sh: containerd, kubelet, kube-proxy,
# CoreDNS), with their state, logs and pid files under .k8s/. Writes .k8s/kubeconfig and puts
# kubectl and helm in .k8s/bin/. Run scripts/k8s-down.sh to stop it.
#
# For a throwaway VM or a CI machine only (docs/kubernetes-dev.md).
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"

run=$K8S_STATE/run
pki=$K8S_STATE/pki
logs=$K8S_STATE/logs
kubeconfig=$K8S_STATE/kubeconfig

if [[ -f $kubeconfig ]] && "$K8S_STATE/bin/kubectl" --kubeconfig "$kubeconfig" \
    --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
    k8s_log "already running: export KUBECONFIG=$kubeconfig PATH=$K8S_STATE/bin:\$PATH"
    exit 0
fi

"$K8S_REPO/scripts/k8s-build.sh" all

started=0
cleanup() {
    if [[ $started == 1 ]]; then
        k8s_log "start failed; stopping what was started (logs kept in $logs)"
        "$K8S_REPO/scripts/k8s-down.sh" --keep-logs || true
    fi
}
trap cleanup EXIT

# A leftover from a run that was not stopped: stop it first, so no process outlives its files.
"$K8S_REPO/scripts/k8s-down.sh" --keep-logs >/dev/null 2>&1 || true
rm -rf "$run" "$K8S_STATE/etcd"
mkdir -p "$run" "$logs" "$K8S_STATE/bin"
"$K8S_REPO/scripts/k8s-pki.sh" "$pki"

ln -sf "$K8S_BIN/kubectl" "$K8S_STATE/bin/kubectl"
ln -sf "$HELM_BIN/helm" "$K8S_STATE/bin/helm"

# Free ports, chosen by the kernel; kept in run/ports.env for the other scripts and tests.
read -r etcd_client etcd_peer apiserver kcm scheduler < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
cat >"$run/ports.env" <<PORTS
ETCD_PORT=$etcd_client
APISERVER_PORT=$apiserver
CONTROLLER_MANAGER_PORT=$kcm
SCHEDULER_PORT=$scheduler
PORTS

# write_kubeconfig FILE USER
write_kubeconfig() {
    cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: cron-runner-dev
  cluster:
    server: https://127.0.0.1:$apiserver
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: cron-runner-dev
  context: {cluster: cron-runner-dev, user: $2}
current-context: cron-runner-dev
KUBECONFIG
    chmod 600 "$1"
}
write_kubeconfig "$run/controller-manager.kubeconfig" controller-manager
write_kubeconfig "$run/scheduler.kubeconfig" scheduler

# start NAME BINARY ARGS...: in its own session, so that k8s-down can stop it and its children.
start() {
    local name=$1
    shift
    started=1
    setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
    echo $! >"$run/$name.pid"
    k8s_log "$name: pid $!, log $logs/$name.log"
}

start etcd "$ETCD_BIN/etcd" --name dev --data-dir "$K8S_STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "dev=http://127.0.0.1:$etcd_peer" \
    --listen-metrics-urls "" --log-level warn

# Bound to 127.0.0.1 only. The `kubernetes` Service gets no endpoints (a loopback address is
# refused there, and pods could not reach it anyway): nothing in the cluster needs it yet. It
# reaches the kubelet (logs, exec) at the node's InternalIP.
start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$apiserver" \
    --endpoint-reconciler-type none \
    --etcd-servers "http://127.0.0.1:$etcd_client" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC --allow-privileged=true

write_kubeconfig "$kubeconfig" admin
kubectl=("$K8S_STATE/bin/kubectl" --kubeconfig "$kubeconfig")

# wait_for WHAT SECONDS COMMAND...
wait_for() {
    local what=$1 seconds=$2 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || k8s_die "$what not ready after ${seconds}s; see $logs/"
        sleep 1
    done
}
wait_for "kube-apiserver" 120 "${kubectl[@]}" --request-timeout=5s get --raw /readyz

start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --bind-address 127.0.0.1 --secure-port "$kcm" \
    --kubeconfig "$run/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$run/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$run/controller-manager.kubeconfig" \
    --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --service-cluster-ip-range 10.96.0.0/16

start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --bind-address 127.0.0.1 --secure-port "$scheduler" \
    --kubeconfig "$run/scheduler.kubeconfig" \
    --authentication-kubeconfig "$run/scheduler.kubeconfig" \
    --authorization-kubeconfig "$run/scheduler.kubeconfig" \
    --leader-elect=false

# The controller-manager is working once its service-account controller has given the default
# namespace its account; pods of every namespace need theirs.
wait_for "kube-controller-manager" 120 "${kubectl[@]}" get serviceaccount default -n default
for name in etcd kube-apiserver kube-controller-manager kube-scheduler; do
    kill -0 "$(cat "$run/$name.pid")" 2>/dev/null || k8s_die "$name exited; see $logs/$name.log"
done
"$K8S_REPO/scripts/k8s-node.sh"
started=0
k8s_log "up: export KUBECONFIG=$kubeconfig PATH=$K8S_STATE/bin:\$PATH"
