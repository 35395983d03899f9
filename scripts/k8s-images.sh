#!/usr/bin/env bash
# Loads the images the end-to-end tests run into the node's containerd (there is no registry):
#   - localhost/cron-runner:test, the runner image of scripts/image.sh (built if missing);
#   - docker.io/library/redis:7.4-bookworm, the bundled Redis's default image, built here from
#     Debian bookworm's redis-server (7.0, not 7.4) with mmdebstrap and imported under the
#     chart's default name, so the chart's values stay as a user leaves them.
#
#   scripts/k8s-images.sh        (after make k8s-up)
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"

socket=$K8S_STATE/run/containerd/containerd.sock
[[ -S $socket ]] || k8s_die "no node running ($socket): make k8s-up"
image_sh=$K8S_REPO/scripts/image.sh
runner=localhost/cron-runner:test
redis=docker.io/library/redis:7.4-bookworm
cache=$K8S_REPO/.work/k8s-images
mkdir -p "$cache"

podman() { "$image_sh" env podman "$@"; }

if ! podman image exists "$runner"; then
    k8s_log "$runner: building with scripts/image.sh build"
    "$image_sh" build
fi

if ! podman image exists "$redis"; then
    rootfs=$cache/redis-bookworm.tar
    if [[ ! -s $rootfs ]]; then
        k8s_log "$redis: mmdebstrap bookworm redis-server (cached in $rootfs)"
        mirror=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        nice -n 10 mmdebstrap --quiet --variant=minbase --include=redis-server \
            --aptopt='APT::Install-Recommends "false"' --format=tar \
            bookworm "$rootfs.partial" "${mirror:-http://deb.debian.org/debian}"
        mv "$rootfs.partial" "$rootfs"
    fi
    # The official image's uid 999 runs it (the chart's redis.bundled.uid); /data is its volume.
    podman import --quiet --change 'USER 999:999' --change 'WORKDIR /data' \
        --change 'CMD ["redis-server"]' "$rootfs" "$redis" >/dev/null
fi

for image in "$runner" "$redis"; do
    archive=$cache/import.tar
    podman save --quiet --format docker-archive -o "$archive" "$image"
    ctr --address "$socket" -n k8s.io images import "$archive" >/dev/null
    rm -f "$archive"
    k8s_log "$image: imported into the node's containerd"
done
