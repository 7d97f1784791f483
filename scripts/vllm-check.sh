#!/usr/bin/env bash
# fattn as vLLM's CPU attention backend, checked end to end (minutes; not part of
# scripts/test.sh or CI, which have no vLLM): the environment of scripts/vllm-venv.sh, the
# backend's tests (tests/python/test_vllm.py), then tiny random Llama, Mistral and Gemma 2
# models served by vllm.LLM with fattn and with CPU_ATTN, greedy tokens compared
# (python -m fattn.vllm.check).
#
# Usage: scripts/vllm-check.sh [--out DIR] [python -m fattn.vllm.check arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/vllm-venv.sh
py=${FATTN_VLLM_VENV:-$HOME/.cache/fattn/venv-vllm}/bin/python
echo "== pytest tests/python/test_vllm.py"
"$py" -m pytest -q -p no:cacheprovider tests/python/test_vllm.py
echo "== python -m fattn.vllm.check $*"
exec "$py" -m fattn.vllm.check "$@"
