#!/usr/bin/env bash
# fattn — stages, on the workstation, what scripts/gpu-check.sh needs on a device machine
# that cannot download anything: GoogleTest's source, into .gpu-deps/ (git-ignored
# through .git/info/exclude). Name .gpu-deps in the device run's `carry`.
set -eu
cd "$(dirname "$0")/.."
SRC=${GTEST_SOURCE:-/usr/src/googletest}
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "gpu-deps: no GoogleTest source at $SRC (set GTEST_SOURCE)" >&2
  exit 1
fi
mkdir -p .gpu-deps
rm -rf .gpu-deps/googletest
cp -r "$SRC" .gpu-deps/googletest
mkdir -p .git/info
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >>.git/info/exclude
du -sh .gpu-deps
