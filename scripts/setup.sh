#!/usr/bin/env bash
# Installs what fattn's build needs from Debian's packages (only the ones missing).
set -euo pipefail
packages=(cmake g++ make googletest libgtest-dev nlohmann-json3-dev libcli11-dev python3-venv)
# Not needed to build: ccache, the compile cache that scripts/test.sh uses where it is
# installed. Tried only as root; a failure to install it is not an error.
optional=(ccache)

missing_of() {
  local p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done
}

mapfile -t missing < <(missing_of "${packages[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fattn setup: please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "fattn setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

mapfile -t missing < <(missing_of "${optional[@]}")
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" -eq 0 ]; then
  echo "fattn setup: installing ${missing[*]} (optional)"
  install_optional() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1
  }
  install_optional || { apt-get update -qq >/dev/null 2>&1 && install_optional; } ||
    echo "fattn setup: could not install ${missing[*]}; building without it" >&2
fi
