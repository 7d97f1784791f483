#!/usr/bin/env bash
# fattn — the PyTorch side-by-side on the device machine (repo root = cwd), one call:
#   builds and installs the fattn package with its CUDA backend into the image's python3
#   (torch 2.11 + cu130, scikit-build-core, ninja and CMake are there; no network needed),
#   then runs python -m fattn.bench_cuda (fattn naive/fused vs SDPA flash, efficient, cudnn,
#   math; every dtype) and writes bench_cuda.json / .csv and the logs into $OUT.
# Usage: OUT=dir scripts/gpu-torch-bench.sh [bench_cuda arguments, e.g. --suite b2h8]
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-torch-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
echo "== nvidia-smi" | tee "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$OUT/summary.txt"
echo "== pip install (CUDA backend, sm_90)" | tee -a "$OUT/summary.txt"
T0=$(date +%s)
if ! timeout 420 "$PY" -m pip install --no-build-isolation --no-deps --no-index . \
  -Ccmake.define.FATTN_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
  -Cbuild-dir=/tmp/fattn-python-build >"$OUT/install.log" 2>&1; then
  echo "install FAILED after $(($(date +%s) - T0)) s (install.log)" | tee -a "$OUT/summary.txt"
  tail -20 "$OUT/install.log" | tee -a "$OUT/summary.txt"
  exit 1
fi
echo "installed in $(($(date +%s) - T0)) s" | tee -a "$OUT/summary.txt"
cd /tmp || exit 1  # import the installed package, not the source tree
"$PY" -m fattn.bench_cuda --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -40
