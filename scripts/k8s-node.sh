#!/usr/bin/env bash
# Starts the node beside the control plane of scripts/k8s-up.sh (which runs this): containerd
# (Debian's, with its own root, state and socket under .k8s/), runc, the CNI bridge plugin, a
# kubelet, kube-proxy (iptables mode) and CoreDNS, all as plain background processes.
#
#   scripts/k8s-node.sh            start the node (k8s-up.sh does)
#   scripts/k8s-node.sh volumes    make sure the bundled Redis has a free volume to bind
#
# The node's address is 10.245.0.1 on an interface of its own, crk8s-node: the kubelet refuses a loopback address,
# and an address of its own keeps all traffic on this machine. Pods get 10.244.0.0/24 on the
# bridge crk8s0 and resolve names through CoreDNS, which listens on the node's address (the
# kubelet's clusterDNS) and answers cluster.local from the API server. One node per machine:
# the interface, the bridge and the iptables rules are the machine's.
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"

run=$K8S_STATE/run
pki=$K8S_STATE/pki
logs=$K8S_STATE/logs
node=$K8S_STATE/node
kubectl=("$K8S_STATE/bin/kubectl" --kubeconfig "$K8S_STATE/kubeconfig")

node_name=cron-runner-node
node_ip=10.245.0.1
node_iface=crk8s-node
bridge=crk8s0
pod_cidr=10.244.0.0/24
socket=$run/containerd/containerd.sock

# volumes: hostPath PersistentVolumes under .k8s/node/volumes, bound by the real PV controller
# to claims without a StorageClass (the bundled Redis's, as the chart renders it by default). A
# volume left Released by a deleted claim is emptied and offered again: this stands in for a
# provisioner, which would have to run as a pod from an image we do not build.
volumes() {
    local i name phase dir
    for i in 1 2 3; do
        name=cron-runner-dev-$i
        dir=$node/volumes/$i
        phase=$("${kubectl[@]}" get pv "$name" -o 'jsonpath={.status.phase}' 2>/dev/null || true)
        [[ $phase == Available || $phase == Bound || $phase == Pending ]] && continue
        [[ -z $phase ]] || "${kubectl[@]}" delete pv "$name" --wait=true >/dev/null
        rm -rf "$dir"
        # Any uid may write: a hostPath volume is not chowned to the pod's fsGroup.
        mkdir -p "$dir" && chmod 1777 "$dir"
        "${kubectl[@]}" apply -f - >/dev/null <<PV
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name}
spec:
  capacity: {storage: 8Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $dir, type: Directory}
PV
    done
}

if [[ ${1:-} == volumes ]]; then
    volumes
    exit 0
fi

# start NAME ARGS...: in its own session, so that k8s-down can stop it and its children.
start() {
    local name=$1
    shift
    setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
    echo $! >"$run/$name.pid"
    k8s_log "$name: pid $!, log $logs/$name.log"
}

# wait_for WHAT SECONDS COMMAND...
wait_for() {
    local what=$1 seconds=$2 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || k8s_die "$what not ready after ${seconds}s; see $logs/"
        sleep 1
    done
}

for tool in containerd runc ctr iptables ip; do
    command -v "$tool" >/dev/null || k8s_die "$tool not found: scripts/system-packages.sh k8s"
done
[[ -x /usr/lib/cni/bridge ]] || k8s_die "no /usr/lib/cni/bridge: scripts/system-packages.sh k8s"
. "$run/ports.env"

# Recorded first, so that k8s-down removes the interface and bridge even if a step below fails.
cat >"$run/node.env" <<ENV
NODE_BRIDGE=$bridge
NODE_IFACE=$node_iface
ENV
# A bridge with no ports serves as a dummy interface (these machines lack the dummy module).
ip link show "$node_iface" >/dev/null 2>&1 || ip link add "$node_iface" type bridge
ip addr replace "$node_ip/32" dev "$node_iface"
ip link set "$node_iface" up

rm -rf "$node/containerd" "$node/kubelet" "$node/pod-logs"
mkdir -p "$node/cni" "$node/containerd" "$node/kubelet" "$node/pod-logs" "$run/containerd"

# containerd 1.6, CRI: cgroupfs (PID 1 is not systemd), the pause image built locally, and
# restrict_oom_score_adj because these machines lack CAP_SYS_RESOURCE: without it runc cannot
# lower a container's oom_score_adj and every container fails to start.
cat >"$node/containerd.toml" <<TOML
version = 2
root = "$node/containerd"
state = "$run/containerd"
[grpc]
  address = "$socket"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:$K8S_VERSION"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node/cni"
TOML
cat >"$node/cni/10-bridge.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "cron-runner-dev", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$run/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
start containerd containerd --config "$node/containerd.toml"
wait_for containerd 30 ctr --address "$socket" version
"$K8S_REPO/scripts/k8s-pause-image.sh" "$run/pause.tar" >/dev/null
ctr --address "$socket" -n k8s.io images import "$run/pause.tar" >/dev/null
rm -f "$run/pause.tar"

write_kubeconfig() { # FILE USER
    cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: cron-runner-dev
  cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: $pki/ca.crt}
users:
- name: $2
  user: {client-certificate: $pki/$2.crt, client-key: $pki/$2.key}
contexts:
- name: cron-runner-dev
  context: {cluster: cron-runner-dev, user: $2}
current-context: cron-runner-dev
KUBECONFIG
    chmod 600 "$1"
}
write_kubeconfig "$run/kubelet.kubeconfig" kubelet
write_kubeconfig "$run/kube-proxy.kubeconfig" kube-proxy

# Pods get the cluster's search domains only, not this machine's.
: >"$node/resolv.conf"
cat >"$node/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
cgroupDriver: cgroupfs
# cgroup v1 here; kubelet 1.35 and later refuse it unless told.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$socket
podLogsDir: $node/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
# Only the API server (system:masters) holds a certificate of this CA that it would present.
authorization: {mode: AlwaysAllow}
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
clusterDomain: cluster.local
clusterDNS: [$node_ip]
resolvConf: $node/resolv.conf
# Imported images cannot be pulled again: never collect them, never evict for a full disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
YAML
start kubelet "$K8S_BIN/kubelet" --config "$node/kubelet.yaml" \
    --kubeconfig "$run/kubelet.kubeconfig" --root-dir "$node/kubelet" \
    --hostname-override "$node_name" --node-ip "$node_ip"

cat >"$node/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $run/kube-proxy.kubeconfig}
hostnameOverride: $node_name
mode: iptables
clusterCIDR: $pod_cidr
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# A pod reaching a Service whose endpoint is on the same bridge: masquerading sends the reply
# back through the host, where the connection's DNAT is undone.
iptables: {masqueradeAll: true}
# Leave the machine's conntrack table size alone (not writable in a container).
conntrack: {maxPerCore: 0}
YAML
start kube-proxy "$K8S_BIN/kube-proxy" --config "$node/kube-proxy.yaml"

# CoreDNS answers cluster.local from the API server, and NXDOMAIN for any other name, so no
# query leaves this machine.
cat >"$node/Corefile" <<COREFILE
cluster.local:53 {
    bind $node_ip
    errors
    kubernetes cluster.local {
        kubeconfig $K8S_STATE/kubeconfig cron-runner-dev
    }
}
.:53 {
    bind $node_ip
    template ANY ANY {
        rcode NXDOMAIN
    }
}
COREFILE
start coredns "$COREDNS_BIN/coredns" -conf "$node/Corefile"

wait_for "node $node_name" 120 "${kubectl[@]}" wait --for=condition=Ready "node/$node_name" --timeout=5s
volumes
for name in containerd kubelet kube-proxy coredns; do
    kill -0 "$(cat "$run/$name.pid")" 2>/dev/null || k8s_die "$name exited; see $logs/$name.log"
done
k8s_log "node $node_name Ready at $node_ip"
