#!/usr/bin/env bash
# The Python package's tests: a virtual environment (created once, then reused) with the
# torch pinned in pyproject.toml, `pip install --no-build-isolation .`, then pytest.
#
# Usage: scripts/test_python.sh [pytest arguments...]
#   FATTN_VENV      the environment (default ~/.cache/fattn/venv)
#   FATTN_TEST_JIT  0 skips the fattn.jit tests (their first build takes 1-2 minutes;
#                   it is cached in ~/.cache/fattn/jit)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh  # the compiler and CMake (Debian packages), as for the C++ build

venv=${FATTN_VENV:-$HOME/.cache/fattn/venv}
# The one torch pin: pyproject.toml's dependencies.
torch_pin=$(sed -n 's/.*"torch==\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$torch_pin" ] || { echo "test_python.sh: no torch==X pin in pyproject.toml" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
py="$venv/bin/python"

# Install only what is missing, so that a warm environment costs nothing here.
if ! "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_pin')" \
    2>/dev/null; then
  echo "== installing torch==$torch_pin (a few GB the first time)"
  "$py" -m pip install -q "torch==$torch_pin"
fi
missing=()
for spec in numpy:numpy pytest:pytest matplotlib:matplotlib scikit_build_core:scikit-build-core \
            ninja:ninja; do
  "$py" -c "import ${spec%%:*}" 2>/dev/null || missing+=("${spec#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  "$py" -m pip install -q "${missing[@]}"
fi

echo "== pip install --no-build-isolation . (torch $torch_pin)"
# build-dir in pyproject.toml (build-python/) keeps the objects: a rebuild compiles only
# what changed. PATH: the environment's ninja and cmake come first.
PATH="$venv/bin:$PATH" "$py" -m pip install -q --no-build-isolation .

echo "== pytest tests/python"
exec "$py" -m pytest -q -p no:cacheprovider tests/python "$@"
