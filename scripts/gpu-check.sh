#!/usr/bin/env bash
# fattn — build, test, sanitize, benchmark and profile the CUDA backend on a machine with an
# NVIDIA GPU (CUDA toolkit, CMake; compute-sanitizer and Nsight Compute where installed).
#
#   scripts/gpu-check.sh [--out DIR] [--deadline-s S] [--focus wgmma] [--arch SM]
#                        [--gtest-source DIR]
#
#   --out DIR         where the results go (default: gpu-check-out in the repository root;
#                     env OUT)
#   --deadline-s S    finish within S seconds (env DEADLINE_S): each step gets at most its
#                     own cap, less what the later steps keep in reserve; below about 330 s
#                     the build is starved. Default: no limit; the benchmark then runs with
#                     its own time budget.
#   --focus wgmma     the Hopper wgmma kernels only (env FOCUS; docs/cuda.md): tests *wgmma*
#                     and CudaBehaviour.*, compute-sanitizer on their Small cases, the
#                     benchmark of fused (and its 128-row tiles) against fused_wgmma and
#                     fused_wgmma_pipelined, ncu as usual; minutes less than the whole check
#   --arch SM         CUDA architecture to build for, e.g. 90 (env CUDA_ARCH; default: the
#                     compute capability of GPU 0 as nvidia-smi reports it, else 90)
#   --gtest-source DIR  GoogleTest source tree to build when the system has no GoogleTest
#                     package (env GTEST_SOURCE; see below)
#   env BUILD         build directory (default /tmp/fattn-gpu-build); JOBS: parallel jobs
#
# Steps:
#   1 build      the library, fattn_cuda_tests (tests/cuda) and fattn_gpu_bench (gpu/),
#                Release, ptxas -v into build.log. The tests are configured through a
#                small wrapper project (repo as a subdirectory + tests/cuda), so this
#                script does not depend on tests/CMakeLists.txt. GoogleTest: the system's
#                package (libgtest-dev), else built from a source tree: --gtest-source,
#                .gpu-deps/googletest (scripts/gpu-deps.sh stages it, for a machine that
#                cannot download) or /usr/src/googletest; else cloned from GitHub.
#   2 tests      the wgmma probe, then the whole CUDA test suite         -> tests.log
#   3 sanitizer  compute-sanitizer on the Small/CudaSanitize subset: memcheck (+leaks)
#                on all of it, racecheck and synccheck on its D=64 cases -> sanitizer.log
#   4 bench      fattn_gpu_bench, both suites                            -> bench.json
#   5 ncu        --clock-control none; SpeedOfLight, roofline, launch, occupancy and
#                compute sections + DRAM bytes, flop and tensor-pipe counters, bank
#                conflicts, of every naive and fused kernel at S = 1024 and 4096
#                                                  -> ncu_raw.csv, ncu_details.csv, fattn.ncu-rep
# summary.txt (also printed last) holds the machine, step results, spills and the bench
# table. Files in the output directory: summary.txt build.log tests.log sanitizer.log
# bench.json ncu_raw.csv ncu_details.csv fattn.ncu-rep.
set -u
usage="usage: scripts/gpu-check.sh [--out DIR] [--deadline-s S] [--focus wgmma] [--arch SM] [--gtest-source DIR]"
OUT=${OUT:-}
DEADLINE_S=${DEADLINE_S:-}
FOCUS=${FOCUS:-}
CUDA_ARCH=${CUDA_ARCH:-}
GTEST_SOURCE=${GTEST_SOURCE:-}
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
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
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
if [ -z "$CUDA_ARCH" ]; then
  CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  case "$CUDA_ARCH" in ""|*[!0-9]*) CUDA_ARCH=90 ;; esac
fi
case "$FOCUS" in
  "")
    TEST_FILTER="*"
    MEM_FILTER="Small/CudaSanitize.*"
    RACE_FILTER="Small/CudaSanitize.*_D64_*"
    SYNC_FILTER="Small/CudaSanitize.*fused*_D64_*"
    BENCH_IMPLS=() ;;
  wgmma)
    TEST_FILTER="*wgmma*:CudaBehaviour.*"
    MEM_FILTER="Small/CudaSanitize.*wgmma*"
    RACE_FILTER="Small/CudaSanitize.*wgmma*_D64_*"
    SYNC_FILTER="$RACE_FILTER"
    # fattn_gpu_bench's variant names: gpu/gpu_bench.cu, namespace variant
    BENCH_IMPLS=(--impls "fused,fused_br128,fused_wgmma,fused_wgmma_pipelined") ;;
  *) echo "--focus (FOCUS) must be empty or wgmma, got '$FOCUS'" >&2; exit 2 ;;
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

# ---- 0. the machine -----------------------------------------------------------------------
{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  ncu --version 2>&1 | tail -1
  compute-sanitizer --version 2>&1 | tail -1
} | tee -a "$SUMMARY"
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

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
    timeout 120 git clone --quiet --depth 1 --branch v1.15.2 \
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
say "configure + build (sm_${CUDA_ARCH}, Release, ${JOBS} jobs)"
T0=$(date +%s)
BUILD_OK=0
if timeout "$(cap 60 400)" cmake -S "$WRAPPER" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DFATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DFATTN_BUILD_TESTS=OFF -DFATTN_BUILD_BENCH=OFF \
  -DFATTN_BUILD_GPU_BENCH=ON -DFATTN_CUDA_PTXAS_VERBOSE=ON \
  "${PREFIX_ARGS[@]}" >>"$BUILD_LOG" 2>&1 &&
  timeout "$(cap 240 290)" cmake --build "$BUILD" -j"$JOBS" --target fattn_gpu_bench fattn_cuda_tests \
    fattn_cuda_wgmma_probe_tests \
    >>"$BUILD_LOG" 2>&1; then
  BUILD_OK=1
  say "build OK in $(($(date +%s) - T0)) s"
else
  say "build FAILED after $(($(date +%s) - T0)) s; last lines of build.log:"
  grep -E "error|Error|FAILED" "$BUILD_LOG" | head -20 | tee -a "$SUMMARY"
  tail -5 "$BUILD_LOG" | tee -a "$SUMMARY"
fi
TESTS=$BUILD/cuda_tests/fattn_cuda_tests
BENCH=$BUILD/fattn/gpu/fattn_gpu_bench
{
  echo "== compiler warnings in build.log: $(grep -c -i 'warning' "$BUILD_LOG")"
  echo "== ptxas: kernels with a stack frame or spills (sm_${CUDA_ARCH})"
  grep -B2 -E "[1-9][0-9]* bytes spill (stores|loads)|[1-9][0-9]* bytes stack frame" "$BUILD_LOG" |
    grep -E "Compiling entry|spill" | sed 's/ptxas info    : //' | head -20
  echo "== SASS (sm_${CUDA_ARCH}): tensor-core (HMMA) and local-memory (LDL/STL) instructions per kernel"
  # HGMMA: wgmma (the sm_90a library; 16 per tile at D = 128 and 12 at D = 64 expected:
  # D/16 for S = Q·Kᵀ plus Bc/16 for P·V). HMMA also matches HGMMA's mnemonic, so the
  # sm_90a kernels show both counts equal.
  for lib in "$BUILD/fattn/libfattn_cuda.a" "$BUILD/fattn/libfattn_cuda_sm90a.a"; do
    [ -f "$lib" ] || continue
    cuobjdump --dump-sass "$lib" 2>/dev/null |
      awk '/Function :/ {f=$3; seen[f]=1} /HMMA/ {n[f]++} /HGMMA/ {g[f]++} /LDL|STL/ {l[f]++}
           END {for (k in seen) printf "  %-80s HMMA %d, HGMMA %d, local ld/st %d\n", k, n[k], g[k], l[k]}' |
      sort | head -40
  done
} | tee -a "$SUMMARY"

# ---- 2. tests ------------------------------------------------------------------------------
# The wgmma probe first (seconds): which descriptor assignment matches; the fused_wgmma
# kernel (src/cuda/core_tile.cuh) uses the LBO = K-adjacent one (variant 0: "A0B0").
PROBE=$BUILD/cuda_tests/fattn_cuda_wgmma_probe_tests
if [ "$BUILD_OK" = 1 ] && [ -x "$PROBE" ]; then
  say "wgmma probe"
  # Its whole log is appended to tests.log below, beside the other tests' output.
  timeout 60 "$PROBE" >/tmp/wgmma_probe.log 2>&1
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
if [ "$BUILD_OK" = 1 ] && [ -x "$TESTS" ]; then
  say "tests"
  timeout "$(cap 150 230)" "$TESTS" --gtest_brief=1 --gtest_filter="$TEST_FILTER" >"$OUT/tests.log" 2>&1
  RC=$?
  say "tests exit $RC: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/tests.log" | head -25 | tee -a "$SUMMARY"
  [ -f /tmp/wgmma_probe.log ] && { echo "== wgmma probe"; cat /tmp/wgmma_probe.log; } >>"$OUT/tests.log"
fi

# ---- 3. compute-sanitizer ------------------------------------------------------------------
if [ "$BUILD_OK" = 1 ] && [ -x "$TESTS" ]; then
  SAN=$OUT/sanitizer.log
  : >"$SAN"
  # memcheck: the whole Small subset; racecheck: the D=64 cases; synccheck: the fused D=64 ones.
  for spec in "memcheck 60 $MEM_FILTER:CudaBehaviour.FullyMasked*" \
    "racecheck 60 $RACE_FILTER" "synccheck 30 $SYNC_FILTER"; do
    read -r tool limit filter <<<"$spec"
    extra=()
    case $tool in
      memcheck) extra=(--leak-check full) ;;
      racecheck) extra=(--racecheck-report all) ;;
    esac
    say "compute-sanitizer --tool $tool ($filter)"
    echo "===== $tool $filter" >>"$SAN"
    timeout "$(cap "$limit" 150)" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
      "$TESTS" --gtest_filter="$filter" --gtest_brief=1 >>"$SAN" 2>&1
    RC=$?
    say "  $tool exit $RC (99: errors found, 124: timed out): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY' "$SAN" | tail -2 | tr '\n' ' ')"
  done
fi

# ---- 4. benchmark --------------------------------------------------------------------------
if [ "$BUILD_OK" = 1 ] && [ -x "$BENCH" ]; then
  T=$(cap 160 80)
  BUDGET=()
  if [ "$T" -gt 0 ]; then
    BUDGET=(--budget-s $((T - 35)))  # the benchmark's own budget inside the step's cap
    say "benchmark (time budget $((T - 35)) s)"
  else
    say "benchmark (fattn_gpu_bench's default time budget)"
  fi
  echo "== bench" >>"$SUMMARY"
  timeout "$T" "$BENCH" --suite all "${BUDGET[@]}" --driver "${DRIVER:-unknown}" "${BENCH_IMPLS[@]}" \
    --out "$OUT/bench.json" 2>&1 | tee -a "$SUMMARY" | tail -3
fi

# ---- 5. Nsight Compute ---------------------------------------------------------------------
if [ "$BUILD_OK" = 1 ] && [ -x "$BENCH" ] && command -v ncu >/dev/null; then
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
  timeout "$(cap 200 15)" ncu --clock-control none --kernel-name regex:'naive_|fused_' \
    "${SECTIONS[@]}" "${METRIC_ARGS[@]}" -o /tmp/fattn_prof -f "$BENCH" --profile \
    >/tmp/ncu.log 2>&1
  say "ncu exit $? ($(grep -c '==PROF==' /tmp/ncu.log) profiler lines; errors: $(grep -c '==ERROR==' /tmp/ncu.log))"
  grep '==ERROR==\|==WARNING==' /tmp/ncu.log | head -5 | tee -a "$SUMMARY"
  if [ ! -f /tmp/fattn_prof.ncu-rep ] && [ ${#METRIC_ARGS[@]} -gt 0 ]; then
    say "ncu again without the extra metrics (sections only)"
    timeout "$(cap 150 10)" ncu --clock-control none --kernel-name regex:'naive_|fused_' \
      "${SECTIONS[@]}" -o /tmp/fattn_prof -f "$BENCH" --profile >/tmp/ncu.log 2>&1
    say "ncu exit $?"
  fi
  if [ -f /tmp/fattn_prof.ncu-rep ]; then
    ncu --import /tmp/fattn_prof.ncu-rep --csv --page raw >"$OUT/ncu_raw.csv" 2>&1
    ncu --import /tmp/fattn_prof.ncu-rep --csv --page details >"$OUT/ncu_details.csv" 2>&1
    cp /tmp/fattn_prof.ncu-rep "$OUT/fattn.ncu-rep"
    say "ncu: $(($(wc -l <"$OUT/ncu_raw.csv") - 2)) kernels profiled"
  fi
fi

say "done"
echo "===================== summary ====================="
cat "$SUMMARY"
