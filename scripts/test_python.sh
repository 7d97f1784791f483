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

source scripts/python_env.sh
python_env_install_fattn

echo "== pytest tests/python"
# --durations: the slowest tests in every log, where CI time goes.
exec "$py" -m pytest -q -p no:cacheprovider --durations=20 tests/python "$@"
