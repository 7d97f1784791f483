#!/usr/bin/env bash
# The main job: builds fattn and prints the CPU benchmark table (naive vs fused,
# with this machine's FMA peak and bandwidth measured in the same run).
# Extra arguments go to fattn-bench (see build/bench/fattn-bench --help), e.g.
#   scripts/bench.sh --json results/cpu.json --csv results/cpu.csv
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target fattn-bench
exec build/bench/fattn-bench "$@"
