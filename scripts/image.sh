#!/usr/bin/env bash
# Build and exercise the container image with Debian's podman, buildah and runc: no Docker
# daemon, no registry. Everything podman and buildah create stays under $WORK
# (configuration, graphroot, runroot, TMPDIR, locks, network configuration), so this never
# touches the machine's own containers or images, and `clean` can delete all of it.
#
#   scripts/image.sh build       the base (mmdebstrap, tarball cached), localhost/cron-runner:test
#                                and the examples/custom-image user image on top of it, and
#                                app images without Python (php-cli, nodejs; musl, scratch-like,
#                                Debian 11) for runner.inject
#   scripts/image.sh dist        build, then the self-contained runner as a tarball and its
#                                SHA-256 in $ARTIFACTS (dist/), for servers without Python
#   scripts/image.sh test        build, dist, run the image tests (pytest -m image), print figures,
#                                clean (KEEP_IMAGE=1 keeps everything for a look around)
#   scripts/image.sh clean       remove our pods, images and storage; keep the cached base tarball
#   scripts/image.sh env CMD...  run CMD with the private configuration (e.g. `env podman ps -a`)
#
# The base stands in for python:3.12-slim: Debian bookworm's python3 (3.11) and python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

# A directory of our own even when IMAGE_WORK names a shared one: clean removes what is
# inside WORK, and must never reach something this script did not create.
WORK=${IMAGE_WORK:+$IMAGE_WORK/cron-runner-image}
WORK=${WORK:-$PWD/.work/podman}
MARKER=$WORK/.made-by-image-sh
BASE_IMAGE=localhost/py-base:bookworm
IMAGE=${IMAGE:-localhost/cron-runner:test}
EXAMPLE_IMAGE=${EXAMPLE_IMAGE:-localhost/cron-runner-example:test}
BASE_TAR=$WORK/cache/py-base-bookworm.tar
# The base's Debian packages, name=version: what pins it, since no registry digest exists for
# an mmdebstrap base (image/README.md, Supply chain). A build whose base differs stops.
BASE_LOCK=image/base-packages.lock
# Build artifacts: the CycloneDX SBOM of the image's Python packages.
ARTIFACTS=${ARTIFACTS:-dist}
# App images without Python, as a PHP or Node team has them: the chart injects the runner.
PHP_IMAGE=${PHP_IMAGE:-localhost/app-php:test}
NODE_IMAGE=${NODE_IMAGE:-localhost/app-node:test}
# And app images of every other libc the injected runner must run on (docs/adoption.md): musl
# and BusyBox with no glibc at all, nothing but one static binary (scratch), and Debian 11's
# glibc 2.31. Their job is tests/image/apps/job.sh.
MUSL_IMAGE=${MUSL_IMAGE:-localhost/app-musl:test}
STATIC_IMAGE=${STATIC_IMAGE:-localhost/app-static:test}
BULLSEYE_IMAGE=${BULLSEYE_IMAGE:-localhost/app-bullseye:test}
PYTEST=${PYTEST:-.venv/bin/pytest}
# What configure() creates, and so what clean() removes; cache/ is kept.
OWNED_DIRS=(conf storage run tmp libpod networks)

die() { echo "image.sh: $*" >&2; exit 1; }

require_tools() {
    local tool missing=()
    # catatonit is the pause process of the pods' infra containers.
    for tool in podman buildah runc catatonit mmdebstrap; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) ||
        die "missing ${missing[*]}: apt-get install -y podman buildah runc catatonit mmdebstrap"
}

configure() {
    local d
    for d in "${OWNED_DIRS[@]}" cache; do mkdir -p "$WORK/$d"; done
    touch "$MARKER"
    cat >"$WORK/conf/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF
    # crun fails on this machine kind's cgroup layout, and podman's default ulimits exceed
    # its hard limits. File locks, our own network directory and the CNI backend (never
    # invoked: every container here uses the host network) keep podman out of /dev/shm,
    # /etc/containers and /run/containers.
    cat >"$WORK/conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$WORK/libpod"
image_copy_tmp_dir = "$WORK/tmp"
lock_type = "file"

[network]
network_config_dir = "$WORK/networks"
network_backend = "cni"
EOF
    export CONTAINERS_CONF=$WORK/conf/containers.conf
    export CONTAINERS_STORAGE_CONF=$WORK/conf/storage.conf
    export TMPDIR=$WORK/tmp
    export IMAGE EXAMPLE_IMAGE PHP_IMAGE NODE_IMAGE MUSL_IMAGE STATIC_IMAGE BULLSEYE_IMAGE ARTIFACTS
}

debian_mirror() {
    local mirror=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        mirror=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
    fi
    echo "${mirror:-http://deb.debian.org/debian}"
}

base() {
    podman image exists "$BASE_IMAGE" && return
    if [[ ! -s $BASE_TAR ]]; then
        echo "image.sh: mmdebstrap bookworm python3 base (about a minute; cached in $BASE_TAR)"
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
            --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Retries "3"' --format=tar \
            bookworm "$BASE_TAR.partial" "$(debian_mirror)"
        mv "$BASE_TAR.partial" "$BASE_TAR"
    fi
    podman import --quiet "$BASE_TAR" "$BASE_IMAGE" >/dev/null
}

base_packages() {
    podman run --rm "$BASE_IMAGE" dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort
}

check_base_lock() {
    local now
    now=$(base_packages)
    if [[ ${UPDATE_BASE_LOCK:-0} == 1 ]]; then
        printf '%s\n' "$now" >"$BASE_LOCK"
        echo "image.sh: wrote $BASE_LOCK ($(wc -l <"$BASE_LOCK") packages): review and commit it"
        return
    fi
    [[ -s $BASE_LOCK ]] || die "no $BASE_LOCK: UPDATE_BASE_LOCK=1 scripts/image.sh build writes it"
    diff -u "$BASE_LOCK" <(printf '%s\n' "$now") >&2 ||
        die "the base's Debian packages differ from $BASE_LOCK (the mirror moved on, or the \
cached $BASE_TAR is another one): review the diff, then UPDATE_BASE_LOCK=1 scripts/image.sh build"
}

sbom() {
    mkdir -p "$ARTIFACTS"
    podman run --rm --entrypoint cat "$IMAGE" /opt/cron-runner/share/sbom.cdx.json \
        >"$ARTIFACTS/cron-runner-image.cdx.json"
    echo "image.sh: SBOM of the image's Python packages in $ARTIFACTS/cron-runner-image.cdx.json"
}

# One app image from Debian's packages alone: mmdebstrap (tarball cached), the job script from
# tests/image/apps, the image's own non-root user, entrypoint and cmd as a Dockerfile sets them.
app_image() {
    local image=$1 package=$2 script=$3 user=$4 entrypoint=$5 cmd=$6 tar
    podman image exists "$image" && return
    tar=$WORK/cache/app-$package-bookworm.tar
    if [[ ! -s $tar ]]; then
        echo "image.sh: mmdebstrap bookworm $package app base (cached in $tar)"
        mmdebstrap --quiet --variant=minbase --include="$package" \
            --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Retries "3"' \
            --customize-hook="mkdir -p \"\$1/app\"" \
            --customize-hook="copy-in tests/image/apps/$script /app" \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
            --format=tar bookworm "$tar.partial" "$(debian_mirror)"
        mv "$tar.partial" "$tar"
    fi
    podman import --quiet --change "USER $user" --change "WORKDIR /app" \
        --change "ENTRYPOINT $entrypoint" --change "CMD $cmd" "$tar" "$image" >/dev/null
}

# A root tarball from Debian's packages, cached: NAME SUITE VARIANT PACKAGES (comma-separated).
# The apps' jobs are copied into /app (an extract hook: the extract variant runs no other).
root_tar() {
    local name=$1 suite=$2 variant=$3 packages=$4 tar
    tar=$WORK/cache/app-$name-$suite.tar
    if [[ ! -s $tar ]]; then
        echo "image.sh: mmdebstrap $suite $name app root (cached in $tar)" >&2
        mmdebstrap --quiet --variant="$variant" ${packages:+--include="$packages"} \
            --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Retries "3"' \
            --extract-hook='mkdir -p "$1/app"' \
            --extract-hook='cp tests/image/apps/job.sh "$1/app/"' \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
            --format=tar "$suite" "$tar.partial" "$(debian_mirror)" >&2
        mv "$tar.partial" "$tar"
    fi
    echo "$tar"
}

# An image from a root tarball, with the job's user, entrypoint and cmd: IMAGE TAR USER
# ENTRYPOINT CMD.
import_app() {
    podman import --quiet --change "USER $3" --change "WORKDIR /app" \
        --change "ENTRYPOINT $4" --change "CMD $5" "$2" "$1" >/dev/null
}

# The images of the other libcs; their user is the distroless one, with no /etc/passwd entry.
other_libc_images() {
    local tar root
    if ! podman image exists "$MUSL_IMAGE"; then
        # extract: musl's loader and libc, a static BusyBox, and no glibc (no /lib64).
        tar=$(root_tar musl bookworm extract musl,busybox-static)
        import_app "$MUSL_IMAGE" "$tar" 65532:65532 '["/bin/busybox", "sh"]' '["/app/job.sh"]'
    fi
    if ! podman image exists "$STATIC_IMAGE"; then
        # Nothing but the app: its one static binary (BusyBox) and its job, as FROM scratch.
        tar=$(root_tar musl bookworm extract musl,busybox-static)
        root=$WORK/tmp/static-root
        rm -rf "$root" && mkdir -p "$root/app"
        tar -xOf "$tar" ./bin/busybox >"$root/app/busybox"
        chmod 0755 "$root/app/busybox"
        cp tests/image/apps/job.sh "$root/app/"
        tar -C "$root" -cf "$root.tar" .
        import_app "$STATIC_IMAGE" "$root.tar" 65532:65532 '["/app/busybox", "sh"]' '["/app/job.sh"]'
        rm -rf "$root" "$root.tar"
    fi
    if ! podman image exists "$BULLSEYE_IMAGE"; then
        # With ps, which the runner's tarball test (tests/image/test_dist.py) uses in it.
        tar=$(root_tar bullseye bullseye minbase procps)
        import_app "$BULLSEYE_IMAGE" "$tar" 65532:65532 '["/bin/sh"]' '["/app/job.sh"]'
    fi
}

build() {
    app_image "$PHP_IMAGE" php-cli job.php 33:33 '["php"]' '["/app/job.php"]'
    app_image "$NODE_IMAGE" nodejs job.js 65534:65534 '["node"]' '["/app/job.js"]'
    other_libc_images
    base
    check_base_lock
    # Host network: RUN steps reach PyPI without podman creating bridges or firewall rules.
    local version ca_bundle=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt} trust=()
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
    # pip in the builder trusts only its own certifi bundle; this machine kind reaches PyPI
    # through a proxy whose CA only the host trusts. Hand the host's bundle to the RUN steps
    # through a pip.conf mounted for the build only: it is in no layer.
    if [[ -r $ca_bundle ]]; then
        printf '[global]\ncert = /run/host-ca.crt\n' >"$WORK/conf/pip.conf"
        trust=(--volume "$ca_bundle:/run/host-ca.crt:ro" --volume "$WORK/conf/pip.conf:/etc/pip.conf:ro")
    fi
    buildah bud --quiet --layers --network host "${trust[@]}" \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VERSION="$version" -t "$IMAGE" .
    # A user's image: `FROM cron-runner` + `pip install their-tasks`.
    buildah bud --quiet --layers --network host "${trust[@]}" \
        --build-arg CRON_RUNNER_IMAGE="$IMAGE" -t "$EXAMPLE_IMAGE" \
        -f examples/custom-image/Dockerfile examples/tasks-package
    sbom
}

figures() {
    local image_b base_b
    image_b=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    base_b=$(podman image inspect --format '{{.Size}}' "$BASE_IMAGE")
    echo "== image figures ($IMAGE)"
    awk -v i="$image_b" -v b="$base_b" 'BEGIN {
        printf "image size:            %6.1f MB\n", i / 1e6
        printf "base image:            %6.1f MB\n", b / 1e6
        printf "our layers above base: %6.1f MB\n", (i - b) / 1e6 }'
    podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | cut -c1-110 | head -n 12
    local app
    for app in "$PHP_IMAGE" "$NODE_IMAGE" "$MUSL_IMAGE" "$STATIC_IMAGE" "$BULLSEYE_IMAGE"; do
        podman image exists "$app" || continue
        awk -v s="$(podman image inspect --format '{{.Size}}' "$app")" -v n="$app" \
            'BEGIN { printf "app image %s: %6.1f MB (no Python)\n", n, s / 1e6 }'
    done
}

# The self-contained runner as a tarball for servers without Python 3.11 (docs/adoption.md),
# from the image's /opt/cron-runner-bin: the launcher and bundle/ in cron-runner-VERSION/,
# with the same bytes whatever the build's time or user, and its SHA-256 beside it.
dist() {
    local version name stage created
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
    name=cron-runner-$version-linux-$(uname -m)
    stage=$WORK/tmp/dist
    rm -rf "$stage" && mkdir -p "$stage" "$ARTIFACTS"
    created=$(podman create --pull=never "$IMAGE")
    podman cp "$created:/opt/cron-runner-bin" "$stage/cron-runner-$version"
    podman rm "$created" >/dev/null
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" \
        -cf - "cron-runner-$version" | gzip -n -9 >"$ARTIFACTS/$name.tar.gz"
    (cd "$ARTIFACTS" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
    rm -rf "$stage"
    echo "image.sh: $ARTIFACTS/$name.tar.gz ($(du -h "$ARTIFACTS/$name.tar.gz" | cut -f1)) and .sha256"
}

unmount_below_work() {
    local mnt
    # Deepest first, so that nested mounts go before their parents.
    awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r mnt; do umount "$mnt" || umount -l "$mnt"; done
}

clean() {
    [[ -f $MARKER ]] || return 0
    configure
    if command -v podman >/dev/null; then
        # The storage is private, so "all" means only what this script and its tests made.
        podman pod rm --all --force --time 0 >/dev/null 2>&1 || true
        podman rm --all --force --time 0 >/dev/null 2>&1 || true
        buildah rm --all >/dev/null 2>&1 || true
        podman volume rm --all --force >/dev/null 2>&1 || true
        podman rmi --all --force >/dev/null 2>&1 || true
    fi
    unmount_below_work
    local d
    for d in "${OWNED_DIRS[@]}"; do rm -rf "${WORK:?}/$d"; done
    rm -f "$BASE_TAR.partial"
}

run_tests() {
    [[ ${KEEP_IMAGE:-0} == 1 ]] || trap clean EXIT
    build
    dist
    figures
    "$PYTEST" -m image tests/image "$@"
}

command=${1:-}
shift || true
case $command in
    base) require_tools; configure; base ;;
    build) require_tools; configure; build ;;
    dist) require_tools; configure; build; dist ;;
    test) require_tools; configure; run_tests "$@" ;;
    figures) configure; figures ;;
    clean) clean ;;
    env) configure; exec "$@" ;;
    *) die "usage: scripts/image.sh base|build|dist|test|clean|figures|env CMD..." ;;
esac
