#!/usr/bin/env bash
# Builds the node's sandbox ("pause") image without a registry: Kubernetes' own pause.c, from
# the k8s.io/kubernetes module pinned in k8s/, compiled static with gcc and packed into an OCI
# archive that `ctr -n k8s.io images import` loads as localhost/pause:VERSION.
#
#   scripts/k8s-pause-image.sh OUT.tar
set -euo pipefail
. "$(dirname "$0")/k8s-lib.sh"
out=${1:?usage: $0 OUT.tar}
name=localhost/pause:$K8S_VERSION

src=$(cd "$K8S_MODULES/kubernetes" && GOTOOLCHAIN=local go list -m -f '{{.Dir}}' k8s.io/kubernetes)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root" "$tmp/oci/blobs/sha256"
gcc -Os -static -DVERSION="$K8S_VERSION" -o "$tmp/root/pause" "$src/build/pause/linux/pause.c"
strip "$tmp/root/pause"

# blob FILE: store FILE under its digest, print "DIGEST SIZE".
blob() {
    local digest size
    digest=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    cp "$1" "$tmp/oci/blobs/sha256/$digest"
    echo "$digest $size"
}

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tmp/root" -cf "$tmp/layer.tar" pause
read -r layer layer_size < <(blob "$tmp/layer.tar")
cat >"$tmp/config.json" <<JSON
{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:$layer"]}}
JSON
read -r config config_size < <(blob "$tmp/config.json")
cat >"$tmp/manifest.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$layer","size":$layer_size}]}
JSON
read -r manifest manifest_size < <(blob "$tmp/manifest.json")
cat >"$tmp/oci/index.json" <<JSON
{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,"annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"$K8S_VERSION"}}]}
JSON
echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tmp/oci" -cf "$out" .
echo "$name"
