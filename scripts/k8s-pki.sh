#!/usr/bin/env bash
# Makes the cluster's PKI with openssl, once per state directory: a CA, the API server's
# serving certificate, the service-account key pair, and one client certificate per identity
# (admin in system:masters, the controller-manager, the scheduler, the node's kubelet and
# kube-proxy under their RBAC names). A file already there is kept, so a later release that adds
# an identity adds only its certificate.
#
#   scripts/k8s-pki.sh DIR
set -euo pipefail
dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
cd "$dir"
node=${K8S_NODE_NAME:-cron-runner-node}
node_ip=${K8S_NODE_IP:-10.245.0.1}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -f ca.crt ]]; then
    openssl genrsa -out ca.key 2048 2>/dev/null
    openssl req -x509 -new -key ca.key -days 3650 -subj /CN=cron-runner-dev-ca -out ca.crt
fi

# sign NAME SUBJECT EXTENSIONS
sign() {
    [[ -f $1.crt ]] && return
    openssl genrsa -out "$1.key" 2048 2>/dev/null
    openssl req -new -key "$1.key" -subj "$2" -out "$tmp/$1.csr"
    printf '%s\n' "$3" >"$tmp/$1.ext"
    openssl x509 -req -in "$tmp/$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$tmp/$1.ext" -out "$1.crt" 2>/dev/null
}

client='keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
sign apiserver /CN=kube-apiserver "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin /O=system:masters/CN=admin "$client"
sign controller-manager /CN=system:kube-controller-manager "$client"
sign scheduler /CN=system:kube-scheduler "$client"
sign apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client "$client"
# The kubelet's one certificate serves its API too (the API server reaches it at the node's IP).
sign kubelet "/O=system:nodes/CN=system:node:$node" "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth,serverAuth
subjectAltName=IP:$node_ip,DNS:$node"
sign kube-proxy /CN=system:kube-proxy "$client"

if [[ ! -f sa.key ]]; then
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi
chmod 600 ./*.key
