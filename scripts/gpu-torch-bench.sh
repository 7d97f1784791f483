#!/usr/bin/env bash
# fattn — the PyTorch side by side on a machine with an NVIDIA GPU: installs the fattn
#   package with its CUDA backend into $PYTHON (default python3), which must already have
#   torch with CUDA, scikit-build-core, ninja and CMake (pip runs with --no-index: nothing
#   is downloaded), then runs python -m fattn.bench_cuda (fattn naive/fused vs SDPA flash,
#   efficient, cudnn, math; every dtype) and writes bench_cuda.json / .csv and the logs
#   into $OUT (default gpu-torch-bench-out in the repository root).
#   CUDA_ARCH: the architecture to build for (default: GPU 0's compute capability, else 90);
#   INSTALL_TIMEOUT_S: limit on the install (default 420 s).
# Usage: OUT=dir scripts/gpu-torch-bench.sh [bench_cuda arguments, e.g. --suite b2h8]
set -u
case "${OUT:-}" in ""|/*) ;; *) OUT=$PWD/$OUT ;; esac  # relative: to the caller's directory
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-torch-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
CUDA_ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')}
case "$CUDA_ARCH" in ""|*[!0-9]*) CUDA_ARCH=90 ;; esac
echo "== nvidia-smi" | tee "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$OUT/summary.txt"
echo "== pip install (CUDA backend, sm_$CUDA_ARCH)" | tee -a "$OUT/summary.txt"
T0=$(date +%s)
if ! timeout "${INSTALL_TIMEOUT_S:-420}" "$PY" -m pip install --no-build-isolation --no-deps --no-index . \
  -Ccmake.define.FATTN_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
  -Cbuild-dir=/tmp/fattn-python-build >"$OUT/install.log" 2>&1; then
  echo "install FAILED after $(($(date +%s) - T0)) s (install.log)" | tee -a "$OUT/summary.txt"
  tail -20 "$OUT/install.log" | tee -a "$OUT/summary.txt"
  exit 1
fi
echo "installed in $(($(date +%s) - T0)) s" | tee -a "$OUT/summary.txt"
cd /tmp || exit 1  # import the installed package, not the source tree
"$PY" -m fattn.bench_cuda --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -40
