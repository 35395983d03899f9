#!/usr/bin/env bash
# Makes the control plane's PKI with openssl, once per state directory: a CA, the API server's
# serving certificate, the service-account key pair, and one client certificate per identity
# (admin in system:masters, the controller-manager and the scheduler under their RBAC names).
#
#   scripts/k8s-pki.sh DIR
set -euo pipefail
dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
cd "$dir"
[[ -f ca.crt ]] && exit 0

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl genrsa -out ca.key 2048 2>/dev/null
openssl req -x509 -new -key ca.key -days 3650 -subj /CN=cron-runner-dev-ca -out ca.crt

# sign NAME SUBJECT EXTENSIONS
sign() {
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

openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
chmod 600 ./*.key
