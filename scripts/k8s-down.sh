#!/usr/bin/env bash
# Stops what scripts/k8s-up.sh (and the node, when one was started) left running, and leaves
# nothing behind: no processes, containerd shims, mounts, network namespaces or bridges.
# Idempotent. The certificates in .k8s/pki are kept for the next start.
#
#   scripts/k8s-down.sh [--keep-logs]
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"

run=$K8S_STATE/run
keep_logs=0
[[ ${1:-} == --keep-logs ]] && keep_logs=1

# stop NAME: the process of run/NAME.pid and its session, TERM then KILL after 15 s. The pid is
# trusted only while it still leads its own session, as the process k8s-up started with setsid
# does: a pid reused by an unrelated program would not.
stop() {
    local name=$1 pidfile=$run/$1.pid pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if [[ $pid =~ ^[0-9]+$ ]] && [[ $(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ') == "$pid" ]]; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 150); do
            ps -o pid= -s "$pid" >/dev/null 2>&1 || break
            sleep 0.1
        done
        if ps -o pid= -s "$pid" >/dev/null 2>&1; then
            k8s_log "$name: still running after 15 s, killing"
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
        k8s_log "$name: stopped"
    fi
    rm -f "$pidfile"
}

# The node first (its pods talk to the API server while they stop), then the control plane.
for name in coredns kube-proxy kubelet; do
    stop "$name"
done

# The containers' processes outlive their shims (they are reparented to init): kill every
# process in the pods' cgroups (the kubelet's cgroupfs driver puts them under kubepods/), then
# remove those cgroups, so no container and no network namespace it holds is left.
kubepods=(/sys/fs/cgroup/*/kubepods)
if [[ -f $run/node.env && -d ${kubepods[0]} ]]; then
    for _ in $(seq 50); do
        pids=$(find "${kubepods[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
        [[ -n $pids ]] || break
        # shellcheck disable=SC2086 # one pid a word
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    done
fi

for name in containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop "$name"
done

# containerd shims start their own sessions: find ours by the state directory in their command line.
if [[ -d $run/containerd ]]; then
    for pid in $(pgrep -f "containerd-shim.*$run/containerd" || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
fi

# Mounts under the state directory (container rootfs, pod volumes), deepest first.
if [[ -d $K8S_STATE ]]; then
    awk -v s="$K8S_STATE/" 'index($2, s) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
fi

# The node's network, when a node was started: the network namespaces the CNI plugins made for
# its pods, the bridge, the node's interface, and the iptables chains the kubelet,
# kube-proxy and the CNI plugins added (KUBE-*, CNI-*), with the rules that jump to them.
if [[ -f $run/node.env ]]; then
    . "$run/node.env"
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do
        ip netns delete "$ns" 2>/dev/null || true
    done
    ip link delete "${NODE_BRIDGE:?}" 2>/dev/null || true
    ip link delete "${NODE_IFACE:?}" 2>/dev/null || true
    find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null || true
    # Each table rewritten without the chains named KUBE-* and CNI-* and the rules that use them;
    # the rules of other programs stay as they are.
    for table in filter nat mangle; do
        iptables-save -t "$table" | grep -vE '(KUBE|CNI)-' | iptables-restore -T "$table"
    done
fi

rm -rf "$run" "$K8S_STATE/etcd" "$K8S_STATE/node" "$K8S_STATE/kubeconfig"
[[ $keep_logs == 1 ]] || rm -rf "$K8S_STATE/logs"
