#!/usr/bin/env bash
# The pinned llama.cpp source (as the llama-cpp-python source package on PyPI vendors it;
# version in ggml-fattn/llama-cpp-python-version) and builds of it, cached per version and
# CPU under ~/.cache/fattn/llama.cpp (FATTN_CACHE moves it). Never committed here.
#   scripts/llama-deps.sh ggml    ggml's shared libraries only (the backend's tests)
#   scripts/llama-deps.sh llama   llama.cpp, CPU-only, shared libraries, with its tools
#                                 (llama-bench, llama-server, llama-quantize, test-backend-ops)
# Prints KEY=VALUE lines: LLAMA_SOURCE (the tree), GGML_LIB_DIR (libggml*.so), and with
# llama LLAMA_BIN (the tools). Progress goes to stderr. Exit status 3: the source could not
# be downloaded (no registry, no cache).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-ggml}
case "$mode" in ggml|llama) ;; *) echo "usage: scripts/llama-deps.sh ggml|llama" >&2; exit 2 ;; esac
version=$(cat ggml-fattn/llama-cpp-python-version)
# Built with GGML_NATIVE: one build per CPU's instruction set.
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-8)
root=${FATTN_CACHE:-$HOME/.cache/fattn}/llama.cpp/$version
src=$root/src
jobs=$(nproc)
say() { echo "llama-deps: $*" >&2; }

if [ ! -f "$src/ggml/src/ggml-backend-impl.h" ]; then
  say "downloading llama-cpp-python==$version (source package, ~76 MB)"
  mkdir -p "$root/download"
  if ! python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" \
      -d "$root/download" >&2; then
    say "the package registry did not give llama-cpp-python==$version"
    exit 3  # unavailable: callers that can go on without llama.cpp say so and skip
  fi
  rm -rf "$root/extract" && mkdir -p "$root/extract"
  tar xzf "$root/download/llama_cpp_python-$version.tar.gz" -C "$root/extract"
  rm -rf "$src" && mv "$root/extract/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$root/extract"
fi
echo "LLAMA_SOURCE=$src"

# ccache where there is one (a rebuild of an unchanged tree costs little).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
common=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON "${launcher[@]}")
# One build tree per CPU; the ggml libraries are its first targets, the tools the rest.
# (The vendored ggml/ has no ggml.pc.in: it is configured as part of the whole tree.)
build=$root/build-$cpu_key
if [ ! -f "$build/CMakeCache.txt" ]; then
  say "configuring llama.cpp (CPU, shared libraries) in $build"
  cmake -S "$src" -B "$build" "${common[@]}" -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >&2
fi
targets=(ggml ggml-base ggml-cpu)
[ "$mode" = llama ] && targets+=(llama-bench llama-server llama-quantize llama-perplexity test-backend-ops)
if [ ! -f "$build/.built-$mode" ]; then
  say "building ${targets[*]}"
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" >&2
  touch "$build/.built-$mode"
fi
echo "GGML_LIB_DIR=$build/bin"
[ "$mode" = llama ] && echo "LLAMA_BIN=$build/bin"
exit 0
