# Shared by the k8s-*.sh scripts (sourced, not run): versions, paths and small helpers.
# The versions are read from the pinning modules under k8s/, so go.mod is the one place to bump.

K8S_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The machines' Go 1.26 lives here; an older Debian go earlier on PATH must not build the modules.
if [[ -x /usr/local/go/bin/go ]]; then PATH=/usr/local/go/bin:$PATH; fi
K8S_MODULES=$K8S_REPO/k8s

# The version a module of ours requires, e.g. `module_version kubernetes k8s.io/kubernetes`.
module_version() {
    awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' \
        "$K8S_MODULES/$1/go.mod"
}

K8S_VERSION=$(module_version kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(module_version etcd go.etcd.io/etcd/server/v3)
HELM_VERSION=$(module_version helm helm.sh/helm/v4)
COREDNS_VERSION=$(module_version coredns github.com/coredns/coredns)

# Built binaries live outside the work tree, one directory per version, so that every worktree
# and every later run of the same versions skips the build.
K8S_CACHE=${CRON_RUNNER_K8S_CACHE:-/var/cache/cron-runner/k8s}
K8S_BIN=$K8S_CACHE/$K8S_VERSION/bin
ETCD_BIN=$K8S_CACHE/etcd-$ETCD_VERSION/bin
HELM_BIN=$K8S_CACHE/helm-$HELM_VERSION/bin
COREDNS_BIN=$K8S_CACHE/coredns-$COREDNS_VERSION/bin

# The running cluster's state: PKI, etcd data, logs, pid files, kubeconfig.
K8S_STATE=${CRON_RUNNER_K8S_STATE:-$K8S_REPO/.k8s}

k8s_log() { printf '%s k8s: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
k8s_die() { k8s_log "error: $*"; exit 1; }
