#!/usr/bin/env bash
# fattn inside llama.cpp, end to end (docs/llama.md): the pinned llama.cpp built CPU-only
# with shared libraries (scripts/llama-deps.sh llama), libggml-fattn built against it,
# random-weight GGUF models with real per-layer attention shapes (Llama-3-8B's: 32 query
# heads, 8 kv heads, D 128; Llama-3.2-1B's: D 64) quantized to Q4_K_M by llama-quantize,
# then: ggml's test-backend-ops on FLASH_ATTN_EXT with the backend; llama-bench -fa on with
# and without the backend, the same binaries, alternated, per depth (pp512 and tg128, F16
# and Q8_0 caches); the logits against llama.cpp's non-flash path (llama-perplexity's KL
# divergence, fattn's against ggml's flash kernel's); a llama-server request whose tokens
# stream through fattn. Writes results/<machine>/llama/<date>/llama-check.json and a table.
# Usage: scripts/llama-check.sh [--machine NAME] [--threads N] [--depths 0,4096,16384]
#          [--layers N] [--reps N] [--models llama3-8b,llama3.2-1b] [--caches f16,q8_0]
#          [--no-extras]   (llama-bench only: no test-backend-ops, logits or server; rows of
#                           the same day are merged into its JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
machine=$(hostname -s)
threads=$(nproc)
depths=0,4096,16384
layers=2
reps=2
models=llama3-8b,llama3.2-1b
caches=f16,q8_0
extras=()
while [ $# -gt 0 ]; do
  case "$1" in
    --machine) machine=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --depths) depths=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --caches) caches=$2; shift 2 ;;
    --no-extras) extras=(--no-extras); shift ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
step() { echo "llama-check: [$(date +%H:%M:%S)] $*" >&2; }

step "llama.cpp (pinned source, CPU build with its tools)"
eval "$(scripts/llama-deps.sh llama)"  # LLAMA_SOURCE, GGML_LIB_DIR, LLAMA_BIN
step "libggml-fattn against it"
cmake -S . -B build-llama-check -DCMAKE_BUILD_TYPE=Release -DFATTN_CUDA=OFF -DFATTN_BUILD_BENCH=OFF \
  -DFATTN_GGML_SOURCE="$LLAMA_SOURCE" -DFATTN_GGML_LIB_DIR="$GGML_LIB_DIR" >/dev/null
cmake --build build-llama-check -j"$(nproc)" --target ggml-fattn >/dev/null
backend=$PWD/build-llama-check/ggml-fattn/libggml-fattn.so

root=${FATTN_CACHE:-$HOME/.cache/fattn}
venv=$root/venv-llama
if [ ! -x "$venv/bin/python" ]; then
  step "a venv with the tree's gguf package (writes the models)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$LLAMA_SOURCE/gguf-py"
fi
out=results/$machine/llama/$(date +%F)
work=$root/llama-check
mkdir -p "$out" "$work"

if [ ${#extras[@]} = 0 ]; then
  step "test-backend-ops -o FLASH_ATTN_EXT -b FATTN"
  python3 ggml-fattn/tests/backend_ops_check.py --test-backend-ops "$LLAMA_BIN/test-backend-ops" \
    --backend "$backend" --json "$work/test-backend-ops.json" >&2 || true
fi

IFS=, read -r -a model_list <<<"$models"
for shape in "${model_list[@]}"; do
  if [ ! -f "$work/$shape-q4_k_m.gguf" ]; then
    step "model $shape ($layers layers): random f16 weights, then Q4_K_M"
    "$venv/bin/python" scripts/llama/write_model.py --shape "$shape" --layers "$layers" \
      --out "$work/$shape-f16.gguf"
    "$LLAMA_BIN/llama-quantize" "$work/$shape-f16.gguf" "$work/$shape-q4_k_m.gguf" Q4_K_M >/dev/null 2>&1
    rm -f "$work/$shape-f16.gguf"
  fi
done

"$venv/bin/python" scripts/llama/check.py --llama-bin "$LLAMA_BIN" --backend "$backend" \
  --work "$work" --out "$out" --machine "$machine" --threads "$threads" --depths "$depths" \
  --reps "$reps" --models "$models" --caches "$caches" \
  --llama-version "$(cat ggml-fattn/llama-cpp-python-version)" "${extras[@]}"
