#!/usr/bin/env bash
# fattn — stages GoogleTest's source in .gpu-deps/googletest (git-ignored), where
# scripts/gpu-check.sh builds it from when the GPU machine has no GoogleTest package and
# cannot download one. Run it on a machine that has the source (GTEST_SOURCE, default
# /usr/src/googletest: Debian's and Ubuntu's googletest package), then copy the checkout
# with its .gpu-deps/ to the GPU machine.
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
du -sh .gpu-deps
