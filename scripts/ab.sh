#!/usr/bin/env bash
# Same speed or not: the CPU entry points of this checkout against another revision's,
# alternated. Builds REV's library in a git worktree (build-ab/REV), compiles
# bench/api_timing.cpp (public API only) against each library with $CXX (default g++, as
# CMake's default here), runs the two in turn ROUNDS times (default 5; which goes first
# alternates) and prints per case the median of each side's medians and their ratio.
# Usage: scripts/ab.sh REV [ROUNDS] [-- fattn-api-timing options: --filter S --isa NAME --threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/ab.sh REV [ROUNDS] [-- timing options]" >&2; exit 2; }
rev=$(git rev-parse --short "$1"); shift
rounds=5
if [ $# -ge 1 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/ab.sh: ROUNDS must be a positive integer, got '$rounds' (timing options go after --)" >&2; exit 2; }
[ "${1:-}" = "--" ] && shift
cxx=${CXX:-g++}
jobs=$(nproc)
root=$PWD/build-ab
mkdir -p "$root"

# One library per side: this checkout's and REV's (Release, no tests, no bench, no CUDA).
build_library() {  # source_dir build_dir
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DFATTN_CUDA=OFF -DFATTN_BUILD_TESTS=OFF \
    -DFATTN_BUILD_BENCH=OFF >/dev/null
  cmake --build "$2" -j"$jobs" --target fattn >/dev/null
}
git worktree prune  # a worktree whose folder was deleted is registered no more
[ -d "$root/$rev/src" ] || git worktree add --detach "$root/$rev/src" "$rev" >/dev/null 2>&1
build_library "$root/$rev/src" "$root/$rev/build"
build_library . "$root/head/build"
for side in "$rev" head; do
  src=$([ "$side" = head ] && echo . || echo "$root/$rev/src")
  "$cxx" -O2 -std=c++20 -I"$src/include" bench/api_timing.cpp "$root/$side/build/libfattn.a" \
    -fopenmp -o "$root/$side/fattn-api-timing"
done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base head"; else order="head base"; fi
  for side in $order; do
    bin=$root/$([ "$side" = head ] && echo head || echo "$rev")/fattn-api-timing
    "$bin" "$@" > "$out/$side.$r"
  done
done
python3 - "$out" "$rev" "$rounds" <<'PY'
import statistics, sys
out, rev, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(side):
    cases = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}"):
            name, ms = line.split()
            cases.setdefault(name, []).append(float(ms))
    return cases
base, head = load("base"), load("head")
print(f"| case | {rev} ms | this ms | this/{rev} | {rev} range | this range |")
print("| --- | --- | --- | --- | --- | --- |")
for name, b in base.items():
    h = head[name]
    mb, mh = statistics.median(b), statistics.median(h)
    print(f"| {name} | {mb:.3f} | {mh:.3f} | {mh / mb:.3f} | {min(b):.2f}-{max(b):.2f} | {min(h):.2f}-{max(h):.2f} |")
PY
