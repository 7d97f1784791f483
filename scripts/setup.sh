#!/usr/bin/env bash
# Installs what fattn's build needs from Debian's packages (only the ones missing).
set -euo pipefail
packages=(cmake g++ make googletest libgtest-dev nlohmann-json3-dev libcli11-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fattn setup: please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "fattn setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
