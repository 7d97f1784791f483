#!/usr/bin/env bash
# Every test: the C++ suite (Release, CUDA code compiled where nvcc exists), the ggml
# backend's tests and ggml's test-backend-ops against it, the same suite under ASan+UBSan, a consumer project built against the installed CMake
# package, the PyTorch package's pytest suite (scripts/test_python.sh), a sample of
# FlashAttention's own test file against fattn (scripts/fa-tests.sh), README's PyTorch
# install line in a fresh clone and virtual environment (scripts/check_install.sh), and
# REPORT.md regenerated from the committed results (scripts/report.sh --from results/report).
# Usage: scripts/test.sh [--no-sanitizers] [--no-python]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
sanitizers=1
python=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitizers) sanitizers=0 ;;
    --no-python) python=0 ;;
    *) echo "usage: scripts/test.sh [--no-sanitizers] [--no-python]" >&2; exit 2 ;;
  esac
done

# Each phase's start, in seconds since this script began: where CI's time goes.
phase() { echo "== $1 (at ${SECONDS} s)"; }

scripts/setup.sh

# A compile cache across runs: every build below (Release, AMX emulation, ASan, the
# Python package's, the install check's) starts from a clean tree, and a run after a
# change recompiles only what the change touched. CCACHE_BASEDIR makes the paths under
# the checkout relative, so a clean clone elsewhere hits the same entries;
# CCACHE_NOHASHDIR lets -g builds (ASan's) hit too, at the price of debug info naming the
# directory of the run that compiled them. Where ccache is not installed, plain builds.
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  ccache --zero-stats >/dev/null || true
fi

phase "build and test (Release)"
# FATTN_CUDA_PTXAS_VERBOSE: ptxas -v on every CUDA source, as scripts/gpu-check.sh builds
# (registers and spills per kernel in the log; the option must keep building the C++
# sources of the CUDA library too). Unused where there is no nvcc.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFATTN_CUDA_PTXAS_VERBOSE=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

phase "ggml backend (ggml-fattn): its tests and ggml's test-backend-ops on FLASH_ATTN_EXT"
# The pinned llama.cpp source from the package registry (cached after the first run) and
# its ggml shared libraries (scripts/llama-deps.sh); the backend built against them, then
# ggml's own test of the op against its CPU kernel with the backend loaded as llama.cpp
# loads it (ggml-fattn/tests/backend_ops_check.py: 0 failures, every case fattn is meant
# to take on fattn). Without a registry or a cache: said, and skipped.
set +e
llama_deps=$(scripts/llama-deps.sh ggml)
llama_status=$?
set -e
if [ "$llama_status" = 3 ]; then
  echo "llama.cpp's source is unavailable (no package registry, no cache): ggml-fattn is not tested" >&2
elif [ "$llama_status" != 0 ]; then
  exit "$llama_status"
else
  eval "$llama_deps"  # LLAMA_SOURCE, GGML_LIB_DIR
  cmake -S . -B build-ggml -DCMAKE_BUILD_TYPE=Release -DFATTN_CUDA=OFF -DFATTN_BUILD_BENCH=OFF \
    -DFATTN_GGML_SOURCE="$LLAMA_SOURCE" -DFATTN_GGML_LIB_DIR="$GGML_LIB_DIR" >/dev/null
  cmake --build build-ggml -j"$jobs" --target ggml-fattn ggml_fattn_test ggml_test_backend_ops
  ctest --test-dir build-ggml -L ggml --output-on-failure
fi

phase "find_package(fattn) consumer"
rm -rf build/install build/consumer
cmake --install build --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer -j"$jobs"
ctest --test-dir build/consumer --output-on-failure

# The AMX kernels on a CPU without AMX: their tile instructions in software
# (src/cpu/amx/emulation.hpp); every other instruction of theirs runs as it is, so the CPU
# needs AVX-512BW and AVX512-BF16. Only the tests named for the AMX kernels run (amx, Amx).
if grep -q avx512_bf16 /proc/cpuinfo && ! grep -qw amx_tile /proc/cpuinfo; then
  phase "build and test the AMX kernels (emulated tiles)"
  cmake -S . -B build-amx-emulation -DCMAKE_BUILD_TYPE=Release -DFATTN_AMX_EMULATION=ON \
    -DFATTN_BUILD_BENCH=OFF -DFATTN_CUDA=OFF >/dev/null
  cmake --build build-amx-emulation -j"$jobs"
  GTEST_FILTER='*amx*:*Amx*' ctest --test-dir build-amx-emulation --output-on-failure -j"$jobs"
fi

if [ "$sanitizers" = 1 ]; then
  phase "build and test (ASan + UBSan)"
  # Host code only: the sanitizers do not instrument device code, and the Release
  # build above already compiles every CUDA kernel.
  # -O1 -g1 (line tables, enough for the sanitizers' stack traces), and the kernel units at
  # -O1 (CMakeLists.txt): the build in 144 s instead of 327 s on 2 cores, the tests in
  # 193 s instead of 169 s (docs/perf-log.md, 2026-11-27, "CI time").
  # With the pinned llama.cpp tree (the ggml phase above), the ggml backend and its tests
  # too (ggml's libraries themselves uninstrumented).
  ggml_args=()
  if [ "$llama_status" = 0 ]; then
    ggml_args=(-DFATTN_GGML_SOURCE="$LLAMA_SOURCE" -DFATTN_GGML_LIB_DIR="$GGML_LIB_DIR")
  fi
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DFATTN_SANITIZE=address,undefined \
    -DFATTN_BUILD_BENCH=ON -DFATTN_CUDA=OFF "${ggml_args[@]}" >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
fi

if [ "$python" = 1 ]; then
  phase "PyTorch package (pytest)"
  scripts/test_python.sh
  # On an AVX-512 machine, the numerical tests again as an AVX2-only CPU runs them: fattn
  # capped at its AVX2 kernels (FATTN_CPU_ISA) and torch at its AVX2 ones
  # (ATEN_CPU_CAPABILITY), so the bounds relative to torch's own error see both sides
  # as such a CPU does. About 20 s.
  if grep -qw avx512f /proc/cpuinfo; then
    phase "numerical Python tests as on an AVX2-only CPU"
    (source scripts/python_env.sh
     FATTN_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 "$py" -m pytest -q -p no:cacheprovider \
       tests/python/test_accuracy.py tests/python/test_fuzz.py tests/python/test_16bit.py \
       tests/python/test_variants.py tests/python/test_backward.py tests/python/test_kvcache.py)
  fi
  phase "FlashAttention's own tests on fattn (a sample: dropout, paged varlen)"
  # FlashAttention's tests/test_flash_attn.py from the pinned flash-attn source package, on
  # the CPU against fattn.flash_attn_interface (scripts/fa-tests.sh): of each of its test
  # functions with dropout (p 0.17) or a paged KV cache, one case in 10,000 and at least
  # one. About 3 minutes, half of it collecting the file's 510,000 cases. Without a
  # package registry or a cache: said, and skipped.
  set +e
  scripts/fa-tests.sh --sample 10000 -k "0.17 or varlen_causal"
  fa_status=$?
  set -e
  if [ "$fa_status" = 3 ]; then
    echo "flash-attn's source is unavailable (no package registry, no cache): its tests did not run" >&2
  elif [ "$fa_status" != 0 ]; then
    exit "$fa_status"
  fi
  phase "README's PyTorch install line (fresh clone, fresh venv)"
  scripts/check_install.sh
fi

phase "REPORT.md from the committed results (scripts/report.sh --from results/report)"
# Into build/, so the committed REPORT.md is left alone; fails if generation breaks.
scripts/report.sh --from results/report --out build/report
if ! diff -q REPORT.md build/report/REPORT.md >/dev/null; then
  diff -u REPORT.md build/report/REPORT.md | head -20 >&2
  echo "REPORT.md is not what results/report/ gives: run scripts/report.sh --from results/report" >&2
  exit 1
fi
if [ "${CMAKE_CXX_COMPILER_LAUNCHER:-}" = ccache ]; then
  ccache --show-stats | grep -E "Hits|Misses" || true
fi
phase "done"
