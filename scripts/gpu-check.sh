#!/usr/bin/env bash
# fattn — build, test, benchmark, sanitize and profile the GPU paths on a machine with an
# NVIDIA GPU: CUDA toolkit and CMake; a python3 with torch (CUDA), triton and pytest for the
# Python steps; compute-sanitizer and Nsight Compute where installed. Downloads nothing
# when GoogleTest is there (package or source tree, see --gtest-source).
#
# The one GPU command (about 7 minutes on an H100; docs/cuda.md):
#
#   scripts/gpu-check.sh --out DIR --deadline-s 450
#
#   scripts/gpu-check.sh [--out DIR] [--deadline-s S] [--focus wgmma|tma|decode|backward] [--arch SM]
#                        [--gtest-source DIR] [--no-python] [--dry-run]
#
#   --out DIR         where the results go (default: gpu-check-out in the repository root;
#                     env OUT)
#   --deadline-s S    finish within S seconds (env DEADLINE_S): each step gets at most its
#                     own cap, less what the later steps keep in reserve, and a step with
#                     less than its minimum left is skipped (said in summary.txt); below
#                     about 300 s the build is starved. Default: no limit.
#   --focus wgmma     the Hopper wgmma kernels only (env FOCUS; docs/cuda.md): tests *wgmma*
#                     and CudaBehaviour.*, compute-sanitizer on their Small cases, the
#                     benchmark of fused (and its 128-row tiles) against fused_wgmma and
#                     fused_wgmma_pipelined, ncu as usual; no Python steps
#   --focus tma       the TMA kernel (fused_tma, docs/cuda.md), within about 8 minutes under
#                     --deadline-s 450: the TMA and wgmma probes first, tests *fused_tma* and
#                     CudaBehaviour.*, compute-sanitizer on its Small cases, the flash-suite
#                     benchmark of fused (fused_mma) / fused_wgmma / fused_wgmma_pipelined /
#                     fused_tma, ncu on those kernels only (L2 and tensor-pipe throughput, shared
#                     bank conflicts; a table of them in summary.txt); no Python steps
#   --focus decode    the decode kernel (KV cache, docs/cuda.md): tests CudaDecode* and
#                     CudaBehaviour.*, compute-sanitizer on CudaDecodeSanitize.*, the KV-cache
#                     Python tests, the Python benchmark's decode section with all the time
#                     left (fattn_op on the decode kernel beside fattn_triton, cuDNN, flash;
#                     paged, graph-replay and ring-depth rows); no fattn_gpu_bench, no ncu
#   --focus backward  the Hopper backward (docs/cuda.md): tests *CudaBackward* and
#                     CudaBehaviour.*, compute-sanitizer on its small cases, the gradient
#                     Python tests, the Python benchmark's training section with all the time
#                     left (fattn_op on the Hopper backward beside fattn_triton, flash and
#                     cuDNN); no fattn_gpu_bench, no ncu
#   --arch SM         CUDA architecture to build for, e.g. 90 (env CUDA_ARCH; default: the
#                     compute capability of GPU 0 as nvidia-smi reports it, else 90)
#   --gtest-source DIR  GoogleTest source tree to build when the system has no GoogleTest
#                     package (env GTEST_SOURCE; see below)
#   --no-python       skip the Python steps (3 and 4) and the extension's build
#   --dry-run         a rehearsal on a machine without a GPU: the build, the C++ tests (they
#                     skip), the Python steps on the CPU (Triton under its interpreter, the
#                     benchmark with --smoke); no sanitizer, fattn_gpu_bench or ncu
#   env BUILD         build directory (default /tmp/fattn-gpu-build); JOBS: parallel jobs;
#                     PYTHON: the interpreter of the Python steps (default python3);
#                     FATTN_COMMIT: the revision the evidence names (default: git's HEAD)
#
# Steps, the most valuable first (build, CUDA tests + sanitizers, Triton tests, the self-test
# (python -m fattn.selftest: selftest.json, and selftest-records/ for
# python/fattn/dispatch/verified.json; docs/dispatch.md), the Python benchmark,
# fattn_gpu_bench, ncu), each with its file and time cap: docs/cuda.md,
# "Running the checks on a machine with an NVIDIA GPU".
# summary.txt (also printed last) holds the machine, step results, spills and the bench
# table. Copy DIR/results/<machine>/gpu/ into the repository's results/ to keep them.
set -u
usage="usage: scripts/gpu-check.sh [--out DIR] [--deadline-s S] [--focus wgmma|tma|decode|backward] [--arch SM] [--gtest-source DIR] [--no-python] [--dry-run]"
OUT=${OUT:-}
DEADLINE_S=${DEADLINE_S:-}
FOCUS=${FOCUS:-}
CUDA_ARCH=${CUDA_ARCH:-}
GTEST_SOURCE=${GTEST_SOURCE:-}
PYTHON_STEPS=1
DRY_RUN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out|--deadline-s|--focus|--arch|--gtest-source)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      case "$1" in
        --out) OUT=$2 ;;
        --deadline-s) DEADLINE_S=$2 ;;
        --focus) FOCUS=$2 ;;
        --arch) CUDA_ARCH=$2 ;;
        --gtest-source) GTEST_SOURCE=$2 ;;
      esac
      shift 2 ;;
    --no-python) PYTHON_STEPS=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) awk 'NR > 1 && /^set -u$/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case "$DEADLINE_S" in
  *[!0-9]*|0) echo "--deadline-s (DEADLINE_S): a number of seconds, got '$DEADLINE_S'" >&2; exit 2 ;;
esac
# Relative paths given here are relative to the caller's directory, not the repository's.
absolute() { case "$1" in ""|/*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
OUT=$(absolute "$OUT")
GTEST_SOURCE=$(absolute "$GTEST_SOURCE")
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
BUILD=${BUILD:-/tmp/fattn-gpu-build}
PY=${PYTHON:-python3}
if [ -z "$CUDA_ARCH" ]; then
  CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  case "$CUDA_ARCH" in ""|*[!0-9]*) CUDA_ARCH=90 ;; esac
fi
# BENCH_SUITE: fattn_gpu_bench's --suite; NCU_KERNELS: the kernels ncu profiles.
# PY_SECTIONS: the Python benchmark's sections, each "name share rest" (its share of the
# time left: share / rest); PYTEST_SELECT: pytest arguments that narrow the Triton tests;
# CPP_BENCH: 0 skips fattn_gpu_bench and ncu.
BENCH_SUITE=all
PY_SECTIONS=("masked 30 100" "forward 25 70" "decode 20 45" "training 25 25")
PYTEST_SELECT=()
CPP_BENCH=1
NCU_KERNELS="regex:naive_|fused_"
# The Hopper backward's small cases (tests/cuda/test_cuda_backward.cpp names them), for the
# sanitizers: both dtypes and head dims, every causal alignment, Sq 65 × Sk 113.
BACKWARD_SMALL="Grid/CudaBackward.MatchesFloat64Reference/*_Sq65_Sk113_*"
BACKWARD_SMALL_D64="Grid/CudaBackward.MatchesFloat64Reference/*_Sq65_Sk113_D64_*"
case "$FOCUS" in
  "")
    TEST_FILTER="*"
    MEM_FILTER="Small/CudaSanitize.*:CudaDecodeSanitize.*:$BACKWARD_SMALL"
    RACE_FILTER="Small/CudaSanitize.*_D64_*:CudaDecodeSanitize.*:$BACKWARD_SMALL_D64"
    SYNC_FILTER="Small/CudaSanitize.*fused*_D64_*:CudaDecodeSanitize.*:$BACKWARD_SMALL_D64"
    BENCH_IMPLS=() ;;
  backward)
    # The Hopper backward (src/cuda/backward_tma.cuh): its tests and sanitizers, the gradient
    # Python tests, and the Python benchmark's training section with every minute left.
    TEST_FILTER="*CudaBackward*:CudaBehaviour.*"
    MEM_FILTER="$BACKWARD_SMALL"
    RACE_FILTER="$BACKWARD_SMALL"
    SYNC_FILTER="$BACKWARD_SMALL"
    PYTEST_SELECT=(-k "grad or backward or training")
    PY_SECTIONS=("training 1 1")
    CPP_BENCH=0 ;;
  decode)
    # The decode kernel (src/cuda/decode.cuh): its tests and sanitizers, the KV-cache Python
    # tests, and the Python benchmark's decode section with every minute left; no
    # fattn_gpu_bench (dense kernels) and no ncu.
    TEST_FILTER="CudaDecode*:CudaBehaviour.*"
    MEM_FILTER="CudaDecodeSanitize.*"
    RACE_FILTER="CudaDecodeSanitize.*"
    SYNC_FILTER="CudaDecodeSanitize.*"
    PYTEST_SELECT=(-k "kvcache or decode or cache")
    PY_SECTIONS=("decode 1 1")
    CPP_BENCH=0 ;;
  wgmma)
    TEST_FILTER="*wgmma*:CudaBehaviour.*"
    MEM_FILTER="Small/CudaSanitize.*wgmma*"
    RACE_FILTER="Small/CudaSanitize.*wgmma*_D64_*"
    SYNC_FILTER="$RACE_FILTER"
    # fattn_gpu_bench's variant names: gpu/gpu_bench.cu, namespace variant
    BENCH_IMPLS=(--impls "fused,fused_br128,fused_wgmma,fused_wgmma_pipelined")
    PYTHON_STEPS=0 ;;
  tma)
    # The kernel's names carry "fused_tma" (tests/util/cuda_case.hpp: Case::name).
    TEST_FILTER="*fused_tma*:CudaBehaviour.*"
    MEM_FILTER="Small/CudaSanitize.*fused_tma*"
    RACE_FILTER="Small/CudaSanitize.*fused_tma*_D64_*"
    SYNC_FILTER="$RACE_FILTER"
    BENCH_IMPLS=(--impls "fused,fused_wgmma,fused_wgmma_pipelined,fused_tma,fused_tma_more_stages,fused_tma_persistent,fused_tma_pingpong")
    BENCH_SUITE=flash  # D = 64 and 128, S = 512..16384: where the 450 TFLOP/s bar is read
    NCU_KERNELS="regex:fused_(mma|wgmma|tma)"
    PYTHON_STEPS=0 ;;
  *) echo "--focus (FOCUS) must be empty, wgmma, tma, decode or backward, got '$FOCUS'" >&2; exit 2 ;;
esac
JOBS=${JOBS:-$(nproc)}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[gpu-check +$(elapsed)s] $*" | tee -a "$SUMMARY"; }
# cap N RESERVE: seconds a step may take under --deadline-s: at most N, leaving RESERVE
# for later steps. Without a deadline: 0, which `timeout` takes as no limit.
cap() {
  [ -n "$DEADLINE_S" ] || { echo 0; return; }
  local left=$((DEADLINE_S - $(elapsed) - $2))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 5 ] && left=5
  echo "$left"
}
# ended RC: "exit RC", or "timed out" for timeout's 124.
ended() { if [ "$1" = 124 ]; then echo "timed out"; else echo "exit $1"; fi; }
# late MIN RESERVE NAME: true (and said) when under --deadline-s the step NAME would get
# less than MIN seconds after RESERVE for the later steps: it is skipped.
late() {
  [ -n "$DEADLINE_S" ] || return 1
  local left=$((DEADLINE_S - $(elapsed) - $2))
  [ "$left" -ge "$1" ] && return 1
  say "$3 skipped: ${left} s left before the deadline's reserve, it needs ${1}"
  return 0
}

# ---- 0. the machine -----------------------------------------------------------------------
{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
  nvidia-smi 2>/dev/null | grep -o "CUDA Version: [0-9.]*"
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  ncu --version 2>&1 | tail -1
  compute-sanitizer --version 2>&1 | tail -1
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA available:', torch.cuda.is_available())" 2>&1 | tail -1
  "$PY" -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
} | tee -a "$SUMMARY"
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
COMMIT=${FATTN_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
[ "$COMMIT" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ] &&
  COMMIT="$COMMIT (plus uncommitted changes)"
say "fattn revision: $COMMIT"
GEN=()
KEEP_GOING=(-- -k)
if command -v ninja >/dev/null; then GEN=(-G Ninja); KEEP_GOING=(-- -k 0); fi

# The Python steps need $PY with torch (on CUDA, unless --dry-run) and Python's headers (the
# extension); pytest from $PY or from .gpu-deps/python.
PYDEPS=""
HAVE_PYTEST=1
if [ "$PYTHON_STEPS" = 1 ]; then
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    say "Python steps off: $PY cannot import torch"; PYTHON_STEPS=0
  elif [ "$DRY_RUN" = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    say "Python steps off: torch in $PY sees no CUDA device (--dry-run rehearses them on the CPU)"
    PYTHON_STEPS=0
  elif ! "$PY" -c "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null; then
    say "Python steps off: no Python.h for $PY (the extension cannot be built)"; PYTHON_STEPS=0
  fi
  if ! "$PY" -c "import pytest" >/dev/null 2>&1; then
    if [ -d "$ROOT/.gpu-deps/python" ] && PYTHONPATH="$ROOT/.gpu-deps/python" "$PY" -c "import pytest" >/dev/null 2>&1; then
      PYDEPS=$ROOT/.gpu-deps/python
      say "pytest from .gpu-deps/python"
    else
      say "WARNING: no pytest for $PY (scripts/gpu-deps.sh stages one in .gpu-deps/python): no Triton tests"
      HAVE_PYTEST=0
    fi
  fi
fi

# ---- 1. build ------------------------------------------------------------------------------
BUILD_LOG=$OUT/build.log
: >"$BUILD_LOG"
PREFIX_ARGS=()
SYSTEM_GTEST=""
for f in /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
  /usr/local/lib*/cmake/GTest/GTestConfig.cmake; do
  [ -f "$f" ] && SYSTEM_GTEST=$f
done
if [ -z "$SYSTEM_GTEST" ]; then
  # No package: a source tree, given, staged or the distribution's; else a clone.
  GTEST_SRC=""
  for d in "$GTEST_SOURCE" "$ROOT/.gpu-deps/googletest" /usr/src/googletest; do
    [ -n "$d" ] && [ -f "$d/CMakeLists.txt" ] && { GTEST_SRC=$d; break; }
  done
  if [ -z "$GTEST_SRC" ] && command -v git >/dev/null; then
    say "cloning GoogleTest (no package or source tree on this machine)"
    rm -rf /tmp/fattn-googletest
    timeout 60 git clone --quiet --depth 1 --branch v1.15.2 \
      https://github.com/google/googletest.git /tmp/fattn-googletest >>"$BUILD_LOG" 2>&1 &&
      GTEST_SRC=/tmp/fattn-googletest
  fi
  if [ -n "$GTEST_SRC" ]; then
    say "building GoogleTest from $GTEST_SRC"
    if ! { timeout 120 cmake -S "$GTEST_SRC" -B /tmp/gtest-build "${GEN[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest >>"$BUILD_LOG" 2>&1 &&
      timeout 120 cmake --build /tmp/gtest-build -j"$JOBS" --target install >>"$BUILD_LOG" 2>&1; }; then
      say "GoogleTest build FAILED (see build.log)"
    fi
    PREFIX_ARGS+=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
  else
    say "WARNING: no GoogleTest (package, source tree or clone): the tests will not build;" \
      "scripts/gpu-deps.sh stages a source tree, or pass --gtest-source"
  fi
fi

WRAPPER=/tmp/fattn-gpu-check-project
mkdir -p "$WRAPPER"
# CUDA is enabled here, at the top: enabled only inside fattn's directory (cmake/cuda.cmake),
# it is missing in the sibling tests/cuda, whose wgmma probe is a .cu source (CMake:
# "Missing variable ... CMAKE_CUDA_COMPILE_OBJECT").
cat >"$WRAPPER/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(fattn_gpu_check LANGUAGES CXX CUDA)
find_package(CUDAToolkit REQUIRED)
add_subdirectory("$ROOT" fattn)
enable_testing()
add_subdirectory("$ROOT/tests/cuda" cuda_tests)
EOF
TESTS=$BUILD/cuda_tests/fattn_cuda_tests
PROBE=$BUILD/cuda_tests/fattn_cuda_wgmma_probe_tests
TMA_PROBE=$BUILD/cuda_tests/fattn_cuda_tma_probe_tests
BENCH=$BUILD/fattn/gpu/fattn_gpu_bench
TARGETS=(fattn_cuda_tests fattn_cuda_wgmma_probe_tests fattn_cuda_tma_probe_tests fattn_gpu_bench)
# The Python extension in the same build: it links the same fattn library (CPU kernels and
# the CUDA backend), built once for both. Against $PY's torch, whatever its version.
PY_ARGS=(-DFATTN_BUILD_PYTHON=OFF)
if [ "$PYTHON_STEPS" = 1 ]; then
  PY_ARGS=(-DFATTN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")"
    -DFATTN_CHECK_TORCH_VERSION=OFF)
  TARGETS+=(fattn_python)
fi
# Fresh outputs only: a target that fails leaves no older binary to be run in its place.
rm -f "$TESTS" "$PROBE" "$TMA_PROBE" "$BENCH" "$BUILD"/fattn/python/_C*.so
say "configure + build (sm_${CUDA_ARCH}, Release, ${JOBS} jobs): ${TARGETS[*]}"
T0=$(date +%s)
configure() {
  timeout "$(cap 90 380)" cmake -S "$WRAPPER" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DFATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DFATTN_BUILD_TESTS=OFF \
    -DFATTN_BUILD_BENCH=OFF -DFATTN_BUILD_GPU_BENCH=ON -DFATTN_CUDA_PTXAS_VERBOSE=ON \
    "${PY_ARGS[@]}" "${PREFIX_ARGS[@]}" "$@" >>"$BUILD_LOG" 2>&1
}
CONFIGURED=0
if configure; then
  CONFIGURED=1
elif [ "$PYTHON_STEPS" = 1 ]; then
  say "configure FAILED with the Python extension; again without it (see build.log)"
  PYTHON_STEPS=0
  PY_ARGS=(-DFATTN_BUILD_PYTHON=OFF)
  TARGETS=(fattn_cuda_tests fattn_cuda_wgmma_probe_tests fattn_cuda_tma_probe_tests fattn_gpu_bench)
  configure && CONFIGURED=1
fi
BUILD_RC=1
if [ "$CONFIGURED" = 1 ]; then
  timeout "$(cap 240 260)" cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" \
    "${KEEP_GOING[@]}" >>"$BUILD_LOG" 2>&1
  BUILD_RC=$?
fi
BUILT=""
for f in "$TESTS" "$PROBE" "$TMA_PROBE" "$BENCH"; do [ -x "$f" ] && BUILT+=" $(basename "$f")"; done
ls "$BUILD"/fattn/python/_C*.so >/dev/null 2>&1 && BUILT+=" fattn._C"
if [ "$BUILD_RC" = 0 ]; then
  say "build OK in $(($(date +%s) - T0)) s:$BUILT"
else
  say "build FAILED (exit $BUILD_RC; 124: timed out) after $(($(date +%s) - T0)) s; built:${BUILT:- nothing}; from build.log:"
  grep -E "error|Error|FAILED" "$BUILD_LOG" | head -20 | tee -a "$SUMMARY"
  tail -5 "$BUILD_LOG" | tee -a "$SUMMARY"
fi
{
  echo "== compiler warnings in build.log: $(grep -c -i 'warning' "$BUILD_LOG")"
  echo "== ptxas: $(grep -c 'Compiling entry' "$BUILD_LOG") kernels compiled with -v; those with a stack frame or spills (sm_${CUDA_ARCH})"
  grep -B2 -E "[1-9][0-9]* bytes spill (stores|loads)|[1-9][0-9]* bytes stack frame" "$BUILD_LOG" |
    grep -E "Compiling entry|spill" | sed 's/ptxas info    : //' | head -20
  echo "== SASS (sm_${CUDA_ARCH}): tensor-core (HMMA), TMA (UTMALDG), mbarrier (SYNCS) and local-memory (LDL/STL) instructions per kernel"
  # HGMMA: wgmma (the sm_90a library; 16 per tile at D = 128 and 12 at D = 64 expected:
  # D/16 for S = Q·Kᵀ plus Bc/16 for P·V). HMMA also matches HGMMA's mnemonic, so the
  # sm_90a kernels show both counts equal. Static counts of fused_tma_kernel (nvcc 13.0,
  # docs/cuda.md): D = 128: HGMMA 56, UTMALDG 8, SYNCS 36; D = 64: HGMMA 40, UTMALDG 4, SYNCS 40.
  for lib in "$BUILD/fattn/libfattn_cuda.a" "$BUILD/fattn/libfattn_cuda_sm90a.a"; do
    [ -f "$lib" ] || continue
    cuobjdump --dump-sass "$lib" 2>/dev/null |
      awk '/Function :/ {f=$3; seen[f]=1} /HMMA/ {n[f]++} /HGMMA/ {g[f]++} /UTMALDG/ {t[f]++}
           /SYNCS/ {y[f]++} /LDL|STL/ {l[f]++}
           END {for (k in seen) printf "  %-80s HMMA %d, HGMMA %d, UTMALDG %d, SYNCS %d, local ld/st %d\n", k, n[k], g[k], t[k], y[k], l[k]}' |
      sort | head -48
  done
} | tee -a "$SUMMARY"

# The Python package: python/fattn with the _C just built, staged for PYTHONPATH.
STAGE=""
if [ "$PYTHON_STEPS" = 1 ]; then
  if ls "$BUILD"/fattn/python/_C*.so >/dev/null 2>&1; then
    STAGE=$BUILD/python-stage
    rm -rf "$STAGE" && mkdir -p "$STAGE"
    cp -r "$ROOT/python/fattn" "$STAGE/fattn"
    find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
    cp "$BUILD"/fattn/python/_C*.so "$STAGE/fattn/"
  elif "$PY" -c "import scikit_build_core" >/dev/null 2>&1 && ! late 120 200 "pip install (fallback)"; then
    say "the extension did not build in the CMake build: pip install --target (no index)"
    STAGE=$BUILD/python-pip
    rm -rf "$STAGE"
    if ! timeout "$(cap 240 200)" "$PY" -m pip install --no-build-isolation --no-deps --no-index \
      --target "$STAGE" . -Ccmake.define.FATTN_CUDA=ON \
      -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
      -Ccmake.define.FATTN_CHECK_TORCH_VERSION=OFF -Cbuild-dir=/tmp/fattn-python-build \
      >"$OUT/pyinstall.log" 2>&1; then
      say "pip install FAILED (pyinstall.log):"
      tail -5 "$OUT/pyinstall.log" | tee -a "$SUMMARY"
      STAGE=""
    fi
  fi
  if [ -n "$STAGE" ]; then
    PYPATH=$STAGE${PYDEPS:+:$PYDEPS}
    say "python package: $(cd /tmp && PYTHONPATH=$PYPATH "$PY" -c "import fattn; print('fattn', fattn.__version__, 'from', fattn.__file__, '| CUDA backend:', fattn._C.with_cuda)" 2>&1 | tail -1)"
  else
    say "no fattn package with its extension: the Python steps are skipped"
    PYTHON_STEPS=0
  fi
fi

# ---- 2 + 3: correctness, side by side ------------------------------------------------------
# The CUDA checks (wgmma probe, tests, compute-sanitizer) in the background beside the Triton
# tests in the foreground (mostly Triton's compiler, on the CPU): nothing is timed in either,
# and the window they share ends at PHASE_END (under --deadline-s), before the benchmarks,
# which then have the GPU to themselves.
PHASE_END=""
if [ -n "$DEADLINE_S" ]; then
  PHASE_END=$(($(date +%s) + $(cap 200 190)))
fi
# until N [END]: seconds a step may take: at most N, and not past END (default PHASE_END);
# 0 (no limit) without a deadline.
until_end() {
  local end=${2:-$PHASE_END}
  [ -n "$end" ] || { echo 0; return; }
  local left=$((end - $(date +%s)))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 5 ] && left=5
  echo "$left"
}
# short MIN NAME: true (and said) when fewer than MIN seconds are left before PHASE_END.
short() {
  [ -n "$PHASE_END" ] || return 1
  local left=$((PHASE_END - $(date +%s)))
  [ "$left" -ge "$1" ] && return 1
  say "$2 skipped: ${left} s left in the correctness window, it needs ${1}"
  return 0
}

cuda_checks() {
  # The TMA probe first (seconds): the copy engine's 128-byte swizzle, the mbarrier phases and
  # wgmma on swizzled tiles, each assumption fused_tma makes (tests/cuda/test_tma_probe.cpp).
  if [ -x "$TMA_PROBE" ] && ! short 10 "TMA probe"; then
    say "TMA probe"
    timeout "$(until_end 60)" "$TMA_PROBE" >/tmp/tma_probe.log 2>&1
    say "TMA probe exit $?"
    grep -E '\[tma probe\]|FAILED|SKIPPED|Failure|error' /tmp/tma_probe.log | head -60 | tee -a "$SUMMARY"
  fi
  # fused_tma's smoke test: one small case in its own process, 30 s at most (about a second
  # when it works). A kernel that hangs (an mbarrier phase that never completes) is left
  # out of every later step — FATTN_CUDA_SKIP_KERNELS for the tests and compute-sanitizer,
  # fattn_gpu_bench --skip for the benchmark and ncu (the file fused_tma.hung) — so that
  # the other kernels' checks and timings still come back.
  if [ -x "$TESTS" ] && ! short 10 "fused_tma smoke test"; then
    timeout 30 "$TESTS" --gtest_brief=1 --gtest_filter='Small/CudaSanitize.*fused_tma*' >/tmp/tma_smoke.log 2>&1
    local smoke=$?
    if [ "$smoke" = 124 ]; then
      export FATTN_CUDA_SKIP_KERNELS=fused_tma
      touch "$OUT/fused_tma.hung"
      say "fused_tma smoke test HUNG (30 s): fused_tma is left out of the later steps"
    else
      say "fused_tma smoke test exit $smoke: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' /tmp/tma_smoke.log | tr '\n' ' ')"
    fi
  fi
  # The wgmma probe (seconds): which descriptor assignment matches; the fused_wgmma
  # kernel (src/cuda/core_tile.cuh) uses the LBO = K-adjacent one (variant 0: "A0B0").
  if [ -x "$PROBE" ] && ! short 10 "wgmma probe"; then
    say "wgmma probe"
    # Its whole log is appended to tests.log below, beside the other tests' output.
    timeout "$(until_end 60)" "$PROBE" >/tmp/wgmma_probe.log 2>&1
    say "wgmma probe exit $?"
    grep -E '\[wgmma probe\]|FAILED|SKIPPED' /tmp/wgmma_probe.log | head -50 | tee -a "$SUMMARY"
    # Whether ptxas kept the wgmma as tensor-core instructions (HGMMA) in the probe's SASS:
    # 23 expected: 10 SS in the four probe_kernel, 5 RS in the two probe_rs_kernel, 4 + 4 in
    # the two kernel_layout_probe.
    if command -v cuobjdump >/dev/null 2>&1; then
      echo "wgmma probe SASS: HGMMA instructions: $(cuobjdump --dump-sass "$PROBE" 2>/dev/null | grep -c HGMMA)" |
        tee -a "$SUMMARY"
    fi
  fi
  if [ -x "$TESTS" ] && ! short 15 "CUDA tests"; then
    say "tests"
    timeout "$(until_end 150)" "$TESTS" --gtest_brief=1 --gtest_filter="$TEST_FILTER" >"$OUT/tests.log" 2>&1
    local rc=$?
    say "tests exit $rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$OUT/tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$OUT/tests.log" | head -25 | tee -a "$SUMMARY"
    [ -f /tmp/wgmma_probe.log ] && { echo "== wgmma probe"; cat /tmp/wgmma_probe.log; } >>"$OUT/tests.log"
    [ -f /tmp/tma_probe.log ] && { echo "== TMA probe"; cat /tmp/tma_probe.log; } >>"$OUT/tests.log"
  fi
  # compute-sanitizer. memcheck: the whole Small subset; racecheck: the D=64 cases;
  # synccheck: the fused D=64 ones.
  if [ "$DRY_RUN" = 0 ] && [ -x "$TESTS" ] && command -v compute-sanitizer >/dev/null; then
    local san=$OUT/sanitizer.log spec tool limit filter extra
    : >"$san"
    for spec in "memcheck 60 $MEM_FILTER:CudaBehaviour.FullyMasked*" \
      "racecheck 45 $RACE_FILTER" "synccheck 30 $SYNC_FILTER"; do
      read -r tool limit filter <<<"$spec"
      short 10 "compute-sanitizer --tool $tool" && continue
      extra=()
      case $tool in
        memcheck) extra=(--leak-check full) ;;
        racecheck) extra=(--racecheck-report all) ;;
      esac
      say "compute-sanitizer --tool $tool ($filter)"
      echo "===== $tool $filter" >>"$san"
      timeout "$(until_end "$limit")" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
        "$TESTS" --gtest_filter="$filter" --gtest_brief=1 >>"$san" 2>&1
      local rc=$?
      say "  $tool exit $rc (99: errors found, 124: timed out): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY' "$san" | tail -2 | tr '\n' ' ')"
    done
  fi
}
# Its own summary part and console log (merged into summary.txt when it is done).
rm -f /tmp/wgmma_probe.log /tmp/tma_probe.log "$OUT/fused_tma.hung"
(SUMMARY=$OUT/summary-cuda-checks.txt; : >"$SUMMARY"; cuda_checks) >"$OUT/cuda-checks.log" 2>&1 &
CUDA_CHECKS=$!
say "CUDA checks (probe, tests, compute-sanitizer) in the background -> cuda-checks.log${PHASE_END:+, until +$((PHASE_END - START)) s}"

if [ "$PYTHON_STEPS" = 1 ] && [ "$HAVE_PYTEST" = 1 ] && ! short 30 "Triton tests"; then
  TRITON_TESTS=()
  # the Triton kernels' tests and the CUDA glue of torch.ops.fattn (on CUDA tensors there)
  for f in "$ROOT"/tests/python/test_triton*.py "$ROOT"/tests/python/test_cuda_dispatch.py; do
    [ -f "$f" ] && TRITON_TESTS+=("$f")
  done
  if [ ${#TRITON_TESTS[@]} -eq 0 ]; then
    say "Triton tests: no tests/python/test_triton*.py"
  else
    INTERPRET=()
    [ "$DRY_RUN" = 1 ] && INTERPRET=(env TRITON_INTERPRET=1)
    say "Triton tests: ${TRITON_TESTS[*]#$ROOT/}${INTERPRET:+ (interpreter: dry run)}"
    (cd "$ROOT" && PYTHONPATH=$PYPATH FATTN_COMMIT=$COMMIT timeout "$(until_end 600)" \
      "${INTERPRET[@]}" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" --durations=10 \
      --junitxml="$OUT/triton-junit.xml" "${PYTEST_SELECT[@]}" "${TRITON_TESTS[@]}") \
      >"$OUT/triton.log" 2>&1
    RC=$?
    say "Triton tests $(ended $RC): $(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$OUT/triton.log" | tail -1)"
    grep -E '^(FAILED|ERROR) ' "$OUT/triton.log" | head -25 | tee -a "$SUMMARY"
  fi
fi
wait "$CUDA_CHECKS"
say "CUDA checks done:"
tee -a "$SUMMARY" <"$OUT/summary-cuda-checks.txt"

# ---- the self-test: every candidate this GPU dispatches, against float64, and its records ----
# python -m fattn.selftest writes a verification record for each kernel that passed, under
# FATTN_CACHE_DIR; they are copied to OUT (selftest-records/) to be committed to
# python/fattn/dispatch/verified.json with the evidence (selftest.json) under results/.
if [ "$PYTHON_STEPS" = 1 ] && ! late 40 65 "self-test"; then
  SELFTEST_ARGS=(--json "$OUT/selftest.json")
  [ "$DRY_RUN" = 1 ] && SELFTEST_ARGS+=(--quick)
  say "self-test: python -m fattn.selftest ${SELFTEST_ARGS[*]}"
  (cd "$ROOT" && PYTHONPATH=$PYPATH FATTN_CACHE_DIR="$OUT/selftest-cache" \
    timeout "$(cap 150 65)" "$PY" -m fattn.selftest "${SELFTEST_ARGS[@]}") \
    >"$OUT/selftest.log" 2>&1
  RC=$?
  say "self-test $(ended $RC): $(grep -E 'cases passed' "$OUT/selftest.log" | tail -1)"
  if [ -d "$OUT/selftest-cache/verified" ]; then
    mkdir -p "$OUT/selftest-records" && cp "$OUT/selftest-cache/verified/"*.json "$OUT/selftest-records/"
  fi
fi

# ---- 4. fattn's GPU paths beside torch's (Python) ------------------------------------------
# One process per section, so that a kernel that faults (a CUDA context lost) costs its own
# section only; each section may use its share of the time left: masked 30, forward 25,
# decode 20, training 25 (what one leaves goes to the next).
if [ "$PYTHON_STEPS" = 1 ] && ! late 60 65 "Python benchmark"; then
  T=$(cap 200 65)
  END4=$(($(date +%s) + T))
  SMOKE=()
  [ "$DRY_RUN" = 1 ] && SMOKE=(--smoke)
  say "Python benchmark: python -m fattn.bench --gpu ${SMOKE[*]}, one process per section${DEADLINE_S:+, until +$((END4 - START)) s}"
  for spec in "${PY_SECTIONS[@]}"; do
    read -r section share rest <<<"$spec"
    LOG=$OUT/pybench-$section.log
    ST=0
    BUDGET=()
    if [ "$T" -gt 0 ]; then
      ST=$(( (END4 - $(date +%s)) * share / rest ))
      if [ "$ST" -lt 25 ]; then say "  $section skipped: ${ST} s left"; continue; fi
      BUDGET=(--budget-s $((ST - 15)))  # start-up (torch, CUDA, triton) and the last row
    fi
    EXTRA=()
    # training: the backward at 4-warp tiles beside the default (BACKWARD_TILES' 8-warp
    # rows were chosen by ptxas's spills alone; this row times that choice)
    [ "$section" = training ] && EXTRA=(--backward-tiles "32,64,4,3/64,32,4,3")
    (cd /tmp && PYTHONPATH=$PYPATH FATTN_COMMIT=$COMMIT PYTHONUNBUFFERED=1 timeout "$ST" \
      "$PY" -m fattn.bench --gpu --sections "$section" "${SMOKE[@]}" "${BUDGET[@]}" \
      "${EXTRA[@]}" --results "$OUT/results") >"$LOG" 2>&1
    RC=$?
    say "  $section $(ended $RC): $(grep '^wrote' "$LOG" | sed 's/.* in /in /')"
    [ "$RC" = 0 ] || tail -5 "$LOG" | tee -a "$SUMMARY"
    # The table: one line per row that ran (the JSON has the others' statuses).
    grep -E ' ms .*(TFLOP/s|GB/s)' "$LOG" >>"$SUMMARY"
  done
fi

if [ "$DRY_RUN" = 1 ] || [ "$CPP_BENCH" = 0 ]; then
  [ "$DRY_RUN" = 1 ] && say "dry run: no benchmark of the kernel variants, no ncu"
  [ "$CPP_BENCH" = 0 ] && say "--focus $FOCUS: no benchmark of the dense kernel variants, no ncu"
  say "done"
  echo "===================== summary ====================="
  cat "$SUMMARY"
  exit 0
fi

# ---- 5. benchmark of the kernel variants (C++) ---------------------------------------------
BENCH_SKIP=()
[ -f "$OUT/fused_tma.hung" ] && BENCH_SKIP=(--skip fused_tma)
if [ -x "$BENCH" ] && ! late 45 25 "fattn_gpu_bench"; then
  T=$(cap 160 25)
  BUDGET=()
  if [ "$T" -gt 0 ]; then
    BUDGET=(--budget-s $((T - 35)))  # the benchmark's own budget inside the step's cap
    say "benchmark (time budget $((T - 35)) s)"
  else
    say "benchmark (fattn_gpu_bench's default time budget)"
  fi
  echo "== bench" >>"$SUMMARY"
  timeout "$T" "$BENCH" --suite "$BENCH_SUITE" "${BUDGET[@]}" --driver "${DRIVER:-unknown}" "${BENCH_IMPLS[@]}" "${BENCH_SKIP[@]}" \
    --out "$OUT/bench.json" 2>&1 | tee -a "$SUMMARY" | tail -3
fi

# ---- 6. Nsight Compute ---------------------------------------------------------------------
if [ -x "$BENCH" ] && command -v ncu >/dev/null && ! late 20 5 "ncu"; then
  say "ncu"
  KNOWN=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
  METRICS=""
  for m in dram__bytes_read.sum dram__bytes_write.sum dram__bytes.sum lts__t_bytes.sum \
    gpu__time_duration.sum sm__throughput.avg.pct_of_peak_sustained_elapsed \
    gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed \
    sm__sass_thread_inst_executed_op_ffma_pred_on.sum sm__sass_thread_inst_executed_op_fadd_pred_on.sum \
    sm__sass_thread_inst_executed_op_fmul_pred_on.sum sm__inst_executed_pipe_tensor_op_hmma.sum \
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    sm__inst_executed_pipe_tensor_op_gmma.sum \
    sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum \
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
    lts__throughput.avg.pct_of_peak_sustained_elapsed \
    lts__t_sectors.avg.pct_of_peak_sustained_elapsed \
    sm__warps_active.avg.pct_of_peak_sustained_active; do
    base=${m%%.*}
    if [ -z "$KNOWN" ] || grep -qx "$base" <<<"$KNOWN"; then METRICS+="${METRICS:+,}$m"; fi
  done
  SECTIONS=()
  LISTED=$(ncu --list-sections 2>/dev/null)
  for s in SpeedOfLight SpeedOfLight_RooflineChart SpeedOfLight_HierarchicalTensorRooflineChart \
    LaunchStats Occupancy ComputeWorkloadAnalysis; do
    if [ -z "$LISTED" ] || grep -qw "$s" <<<"$LISTED"; then SECTIONS+=(--section "$s"); fi
  done
  echo "== ncu metrics: $METRICS" >>"$SUMMARY"
  echo "== ncu sections: ${SECTIONS[*]}" >>"$SUMMARY"
  METRIC_ARGS=()
  [ -n "$METRICS" ] && METRIC_ARGS=(--metrics "$METRICS")
  rm -f /tmp/fattn_prof.ncu-rep
  timeout "$(cap 200 5)" ncu --clock-control none --kernel-name "$NCU_KERNELS" \
    "${SECTIONS[@]}" "${METRIC_ARGS[@]}" -o /tmp/fattn_prof -f "$BENCH" --profile "${BENCH_IMPLS[@]}" "${BENCH_SKIP[@]}" \
    >/tmp/ncu.log 2>&1
  say "ncu exit $? ($(grep -c '==PROF==' /tmp/ncu.log) profiler lines; errors: $(grep -c '==ERROR==' /tmp/ncu.log))"
  grep '==ERROR==\|==WARNING==' /tmp/ncu.log | head -5 | tee -a "$SUMMARY"
  if [ ! -f /tmp/fattn_prof.ncu-rep ] && [ ${#METRIC_ARGS[@]} -gt 0 ] && ! late 20 5 "ncu (sections only)"; then
    say "ncu again without the extra metrics (sections only)"
    timeout "$(cap 150 5)" ncu --clock-control none --kernel-name "$NCU_KERNELS" \
      "${SECTIONS[@]}" -o /tmp/fattn_prof -f "$BENCH" --profile "${BENCH_IMPLS[@]}" "${BENCH_SKIP[@]}" >/tmp/ncu.log 2>&1
    say "ncu exit $?"
  fi
  if [ -f /tmp/fattn_prof.ncu-rep ]; then
    ncu --import /tmp/fattn_prof.ncu-rep --csv --page raw >"$OUT/ncu_raw.csv" 2>&1
    ncu --import /tmp/fattn_prof.ncu-rep --csv --page details >"$OUT/ncu_details.csv" 2>&1
    cp /tmp/fattn_prof.ncu-rep "$OUT/fattn.ncu-rep"
    say "ncu: $(($(wc -l <"$OUT/ncu_raw.csv") - 2)) kernels profiled"
    # What the TMA kernel is built to move (docs/cuda.md): L2 throughput, tensor-pipe
    # activity, shared-memory bank conflicts; one line per profiled kernel launch.
    if [ -n "$FOCUS" ] && command -v python3 >/dev/null; then
      echo "== ncu: kernel | grid | duration | L2 throughput % | tensor pipe (gmma / hmma) % | shared bank conflicts (ld+st)" >>"$SUMMARY"
      python3 "$ROOT/scripts/ncu_summary.py" "$OUT/ncu_raw.csv" >>"$SUMMARY" 2>&1
    fi
  fi
fi

say "done"
echo "===================== summary ====================="
cat "$SUMMARY"
