#!/usr/bin/env bash
# Install the Debian packages of scripts/system-packages.txt that are missing.
#
#   scripts/system-packages.sh [TARGET...]   TARGET: test (default), image, or all
#
# As root, with apt-get, it installs what is missing; otherwise it names the packages and
# prints the exact command, and exits 1. Nothing is done when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("${@:-test}")
wanted=()
while read -r package target _; do
    [[ -z $package || $package == \#* ]] && continue
    for t in "${targets[@]}"; do
        if [[ $t == all || $t == "$target" ]]; then wanted+=("$package"); fi
    done
done <scripts/system-packages.txt

# Debian's python3 has no venv module until python3-venv is installed: make needs it first.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then wanted+=(python3-venv); fi

missing=()
for package in "${wanted[@]}"; do
    if ! dpkg-query -W -f '${db:Status-Status}' "$package" 2>/dev/null | grep -qx installed; then
        missing+=("$package")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

command="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "missing system packages: ${missing[*]}" >&2
    if command -v apt-get >/dev/null; then
        echo "install them as root, then run make again:" >&2
        echo "  sudo sh -c '$command'" >&2
    else
        echo "this machine has no apt-get: install the equivalents of these Debian packages" >&2
    fi
    exit 1
fi
echo "installing system packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A mirror's brief hiccup must not fail the whole run.
apt-get -o Acquire::Retries=3 update -qq
apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
