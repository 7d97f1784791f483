# Sourced by scripts/test_python.sh and scripts/report.sh: the Python virtual environment
# (created once, then reused) and what goes into it.
#   FATTN_VENV   the environment (default ~/.cache/fattn/venv)
# After sourcing, $py is the environment's python. Functions:
#   python_env_require MODULE:PACKAGE ...   pip-installs the packages whose module is missing
#   python_env_install_fattn                torch as pinned in pyproject.toml, then
#                                           `pip install --no-build-isolation .`

venv=${FATTN_VENV:-$HOME/.cache/fattn/venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
py="$venv/bin/python"

python_env_require() {
  local missing=() spec
  for spec in "$@"; do
    "$py" -c "import ${spec%%:*}" 2>/dev/null || missing+=("${spec#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    "$py" -m pip install -q "${missing[@]}"
  fi
}

python_env_install_fattn() {
  # The one torch pin: pyproject.toml's dependencies.
  local torch_pin
  torch_pin=$(sed -n 's/.*"torch==\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)
  [ -n "$torch_pin" ] || { echo "python_env.sh: no torch==X pin in pyproject.toml" >&2; return 1; }
  # Install only what is missing, so that a warm environment costs nothing here.
  if ! "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_pin')" \
      2>/dev/null; then
    echo "== installing torch==$torch_pin (a few GB the first time)"
    "$py" -m pip install -q "torch==$torch_pin"
  fi
  python_env_require numpy:numpy pytest:pytest matplotlib:matplotlib \
    scikit_build_core:scikit-build-core ninja:ninja
  # Triton for tests/python/test_triton.py, on the CPU through its interpreter: triton 3.6
  # (what torch 2.11's CUDA wheels pin), whose interpreter needs numpy < 2.4.
  python_env_require triton:triton==3.6.0
  if ! "$py" -c "import sys, numpy; sys.exit(tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 4))"; then
    echo "== installing numpy<2.4 (triton 3.6's interpreter)"
    "$py" -m pip install -q "numpy<2.4"
  fi
  # transformers for tests/python/test_transformers.py: the release fattn.transformers names.
  local transformers_pin
  transformers_pin=$(sed -n 's/^TESTED_VERSION = "\(.*\)"/\1/p' python/fattn/transformers.py)
  if ! "$py" -c "import sys, transformers; sys.exit(transformers.__version__ != '$transformers_pin')" \
      2>/dev/null; then
    echo "== installing transformers==$transformers_pin"
    "$py" -m pip install -q "transformers==$transformers_pin"
  fi
  echo "== pip install --no-build-isolation . (torch $torch_pin)"
  # build-dir in pyproject.toml (build-python/) keeps the objects: a rebuild compiles only
  # what changed. PATH: the environment's ninja and cmake come first.
  PATH="$venv/bin:$PATH" "$py" -m pip install -q --no-build-isolation .
}
