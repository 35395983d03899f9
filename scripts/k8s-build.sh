#!/usr/bin/env bash
# Builds the Kubernetes components, etcd and helm from their published Go modules, pinned by
# the small modules under k8s/ (go.mod + go.sum). Each binary is built once per version into
# ${CRON_RUNNER_K8S_CACHE:-/var/cache/cron-runner/k8s}; a later run finds it there and skips it.
#
#   scripts/k8s-build.sh                 everything (control plane, node, etcd, helm, CoreDNS)
#   scripts/k8s-build.sh control-plane   what `make k8s-up` needs: apiserver, controller-manager,
#                                        scheduler, kubectl, etcd, helm
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"

export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

command -v go >/dev/null || k8s_die "go not found: Go 1.26 is expected at /usr/local/go/bin"

case "${1:-all}" in
    control-plane) kube=(kube-apiserver kube-controller-manager kube-scheduler kubectl) ;;
    all) kube=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy) ;;
    *) echo "usage: $0 [all|control-plane]" >&2; exit 64 ;;
esac

tmp=
cleanup() { [[ -z $tmp ]] || rm -f "$tmp"; }
trap cleanup EXIT

# build MODULE_DIR OUT_DIR NAME PACKAGE LDFLAGS: build into a temporary name and rename, so an
# interrupted build never leaves a binary that a later run would take as done.
build() {
    local dir=$1 out=$2 name=$3 pkg=$4 ldflags=$5
    if [[ -x $out/$name ]]; then
        k8s_log "$name: cached in $out"
        return
    fi
    mkdir -p "$out"
    tmp=$out/.$name.partial
    k8s_log "$name: building $pkg"
    local start=$SECONDS
    (cd "$K8S_MODULES/$dir" && nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg")
    mv "$tmp" "$out/$name"
    tmp=
    k8s_log "$name: built in $((SECONDS - start)) s, $(du -m "$out/$name" | cut -f1) MB"
}

# The same -X flags as kube::version::ldflags in the release's hack/lib/version.sh, so that
# `kubectl version` and the API server's /version (which helm's kubeVersion checks read) report
# the real release instead of v0.0.0-master.
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
minor=${K8S_VERSION#v*.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done
for name in "${kube[@]}"; do
    build kubernetes "$K8S_BIN" "$name" "k8s.io/kubernetes/cmd/$name" "$kube_ldflags"
done

etcd_ldflags="-s -w"
build etcd "$ETCD_BIN" etcd go.etcd.io/etcd/server/v3 "$etcd_ldflags"
build etcd "$ETCD_BIN" etcdctl go.etcd.io/etcd/etcdctl/v3 "$etcd_ldflags"

# helm's Makefile stamps the same variables.
helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
helm_ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
build helm "$HELM_BIN" helm helm.sh/helm/v4/cmd/helm "$helm_ldflags"

# Only when the node is wanted: the cluster's DNS, run by k8s-up.sh on the node's address.
if [[ ${1:-all} == all ]]; then
    build coredns "$COREDNS_BIN" coredns github.com/coredns/coredns "-s -w"
fi
