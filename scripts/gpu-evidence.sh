#!/usr/bin/env bash
# fattn — the whole GPU evidence set in one command, about 12 minutes on an H100:
# scripts/gpu-check.sh (build, CUDA and Triton tests, python -m fattn.bench --gpu,
# compute-sanitizer, fattn_gpu_bench, ncu) with
# --deadline-s $CHECK_DEADLINE_S (default 480), then scripts/gpu-torch-bench.sh (the
# PyTorch side by side) limited to $TORCH_TIMEOUT_S (default 220). The two result folders
# are packed as one archive, gpu-evidence.tar.gz (unpack: tar xzf gpu-evidence.tar.gz -> check/
# torch/), beside the two summaries, in $OUT (default gpu-evidence-out in the repository
# root); the ncu report (.ncu-rep) is left out (its size).
#   scripts/gpu-evidence.sh [bench_cuda args]
set -u
case "${OUT:-}" in ""|/*) ;; *) OUT=$PWD/$OUT ;; esac  # relative: to the caller's directory
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-evidence-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
WORK=/tmp/fattn-gpu-evidence
rm -rf "$WORK" && mkdir -p "$WORK/check" "$WORK/torch"
scripts/gpu-check.sh --out "$WORK/check" --deadline-s "${CHECK_DEADLINE_S:-480}" \
  >"$WORK/check.log" 2>&1
echo "gpu-check exit $?"
OUT=$WORK/torch timeout "${TORCH_TIMEOUT_S:-220}" scripts/gpu-torch-bench.sh --suite all \
  --budget 0.15 "$@" >"$WORK/torch.log" 2>&1
echo "gpu-torch-bench exit $?"
rm -f "$WORK/check/fattn.ncu-rep"
cp "$WORK/check/summary.txt" "$OUT/check_summary.txt" 2>/dev/null
cp "$WORK/torch/summary.txt" "$OUT/torch_summary.txt" 2>/dev/null
tar czf "$OUT/gpu-evidence.tar.gz" -C "$WORK" check torch check.log torch.log
ls -la "$OUT"
grep -E "tests exit|memcheck exit|racecheck exit|synccheck exit|build (OK|FAILED)|spill" \
  "$WORK/check/summary.txt"
tail -25 "$WORK/torch.log"
