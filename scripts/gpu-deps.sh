#!/usr/bin/env bash
# fattn — stages what scripts/gpu-check.sh needs on a GPU machine that cannot download, in
# .gpu-deps/ (git-ignored; copy the checkout with it, or carry it):
#   .gpu-deps/googletest  GoogleTest's source (GTEST_SOURCE, default /usr/src/googletest:
#                         Debian's and Ubuntu's googletest package), built there when the
#                         machine has no GoogleTest package
#   .gpu-deps/python      pytest and what it imports (pure Python), copied from $PYTHON
#                         (default python3) when it has pytest; used there only when the
#                         machine's python has no pytest (same Python minor version best)
set -eu
cd "$(dirname "$0")/.."
SRC=${GTEST_SOURCE:-/usr/src/googletest}
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "gpu-deps: no GoogleTest source at $SRC (set GTEST_SOURCE)" >&2
  exit 1
fi
mkdir -p .gpu-deps
rm -rf .gpu-deps/googletest
cp -r "$SRC" .gpu-deps/googletest
PY=${PYTHON:-python3}
rm -rf .gpu-deps/python
if "$PY" -c "import pytest" 2>/dev/null; then
  mkdir -p .gpu-deps/python
  "$PY" - <<'EOF'
import importlib, os, shutil, sys
for name in ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments",
             "exceptiongroup", "tomli"):
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    src = module.__file__
    if os.path.basename(src) == "__init__.py":
        src = os.path.dirname(src)
    dst = os.path.join(".gpu-deps/python", os.path.basename(src))
    if os.path.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy2(src, dst)
print(f"gpu-deps: pytest from Python {sys.version.split()[0]}")
EOF
else
  echo "gpu-deps: $PY has no pytest: .gpu-deps/python not staged" >&2
fi
du -sh .gpu-deps/*
