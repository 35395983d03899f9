#!/bin/sh
# Make a PyInstaller bundle carry what PyInstaller leaves to the system: the C library, the
# dynamic loader, and every other shared library that the bundle's program and extensions
# load and the bundle lacks. bundle/launch.c then starts it through that loader, so the
# app image's own libc (an older glibc, musl, or none) is never used.
#
#   bundle/carry-libc.sh BUNDLE_DIR      (PyInstaller's --onedir output)
#
# Also carried, for images without a distribution (scratch, distroless static): the time
# zone database, used by the runner when the image has none (runner/bundle.py).
set -eu
bundle=$1
libs=$bundle/_internal
# ldd names each library it resolved (NAME => PATH) and the loader (a path of its own).
find "$bundle" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -exec ldd {} + 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*\/ld-linux/ { print $1 }' |
    sort -u |
    while read -r lib; do
        [ -e "$libs/$(basename "$lib")" ] || cp -L "$lib" "$libs/"
    done
# glibc opens libgcc_s itself (dlopen) when a thread exits or is cancelled: ldd cannot see it.
cp -L "$(gcc -print-file-name=libgcc_s.so.1)" "$libs/"
test -x "$libs/$(basename "$(ldd /bin/true | awk '$1 ~ /^\/.*\/ld-linux/ { print $1 }')")"
mkdir -p "$libs/share"
cp -a /usr/share/zoneinfo "$libs/share/zoneinfo"
rm -rf "$libs/share/zoneinfo/right" "$libs/share/zoneinfo/posix"
