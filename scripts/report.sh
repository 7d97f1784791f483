#!/usr/bin/env bash
# REPORT.md and its figures (figures/), generated from JSON results by `python -m report`.
#
#   scripts/report.sh                   measure, then generate: fattn-bench (ceilings,
#                                       roofline, naive stages, fused) -> results/report/
#                                       fattn-bench.json; python -m fattn.bench (fattn vs
#                                       torch SDPA vs standard) -> results/report/torch/;
#                                       python -m fattn.launches -> results/report/
#                                       launches.json; then REPORT.md here. Takes minutes
#                                       (2 on the 2-core dev-spr VM).
#   scripts/report.sh --from DIR        only regenerate, from DIR's JSON (what CI does)
#   --out DIR                           where REPORT.md and figures/ go (default: .)
#   FATTN_VENV                          the Python environment (scripts/python_env.sh)
# Measure on a quiet machine: fattn-bench and the report flag timings taken while
# other processes ran.
set -euo pipefail
cd "$(dirname "$0")/.."

results=results/report
out=.
measure=1
usage="usage: scripts/report.sh [--from DIR] [--out DIR]"
while [ $# -gt 0 ]; do
  case "$1" in
    --from) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; results=$2; measure=0; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

source scripts/python_env.sh
if [ "$measure" = 1 ]; then
  scripts/setup.sh
  echo "== fattn-bench"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target fattn-bench
  mkdir -p "$results"
  build/bench/fattn-bench --seq 128,512,1024,4096 --causal none \
    --json "$results/fattn-bench.json" --csv "$results/fattn-bench.csv"
  python_env_install_fattn
  echo "== python -m fattn.bench"
  "$py" -m fattn.bench --sweep b2h8 --b2h8-s 128 512 1024 2048 4096 \
    --out "$results/torch"
  echo "== python -m fattn.launches"
  "$py" -m fattn.launches --seq 128 1024 --out "$results/launches.json"
else
  python_env_require matplotlib:matplotlib
fi
echo "== python -m report"
"$py" -m report --results "$results" --out "$out"
