#!/usr/bin/env bash
# FlashAttention's own test file (tests/test_flash_attn.py of the pinned flash-attn source
# package on PyPI) run on the CPU against fattn's FlashAttention 2 functions
# (fattn.flash_attn_interface), unchanged but for its device: "cuda" becomes "cpu", and its
# CUDA queries answer as a 16 GiB sm_80 GPU (tests/flash_attn_suite/conftest.py).
#   scripts/fa-tests.sh [--sample N] [-k EXPR] [--tests "NAME ..."] [--path cpu|triton]
#                       [--json FILE] [--machine NAME]
#     --sample N   one case in N, the same cases every run (a hash of the case id); 1: all
#     -k EXPR      pytest's selection (e.g. "dropout or paged")
#     --tests NAMES  only these test functions of the file (collecting all 510,000 cases
#                  takes about 90 s on 2 cores; a few small functions, seconds)
#     --path P     cpu: fattn's functions on CPU tensors (its CPU kernels; the default);
#                  triton: the same functions on fattn's Triton kernels (the CUDA tensors'
#                  path) under Triton's interpreter: slow, for a few small cases
#     --json FILE  a summary: version, selection, cases, passed, failed, skipped (by reason),
#                  per test function, and each failure's id
# The source package is downloaded once into ~/.cache/fattn/flash-attn (FATTN_CACHE moves
# it) and checked against PyPI's sha256; never committed here. Exit status: pytest's (0
# all selected cases passed or were skipped by the file's own rules), 3 when the source
# could not be downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
version=2.8.3   # flash-attn, whose tests/test_flash_attn.py this runs
sample=1 select="" json="" machine=$(hostname -s) path=cpu tests=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sample) sample=$2; shift 2 ;;
    -k) select=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --machine) machine=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    *) echo "usage: scripts/fa-tests.sh [--sample N] [-k EXPR] [--tests \"NAME ...\"] [--path cpu|triton] [--json FILE] [--machine NAME]" >&2
       exit 2 ;;
  esac
done
source scripts/python_env.sh
"$py" -c "import fattn" 2>/dev/null || python_env_install_fattn >&2
python_env_require einops:einops

root=${FATTN_CACHE:-$HOME/.cache/fattn}/flash-attn/$version
src=$root/flash_attn-$version
if [ ! -f "$src/tests/test_flash_attn.py" ]; then
  echo "fa-tests: downloading flash-attn==$version (source package, ~8 MB)" >&2
  mkdir -p "$root"
  if ! "$py" - "$version" "$root/flash_attn.tar.gz" <<'PY'
import hashlib, os, re, sys, urllib.parse, urllib.request
version, target = sys.argv[1], sys.argv[2]
# The package index pip reads (PEP 503's simple pages carry each file's sha256).
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page_url = f"{index}/flash-attn/"
page = urllib.request.urlopen(page_url, timeout=60).read().decode()
name = f"flash_attn-{version}.tar.gz"
link = re.search(r'href="([^"]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
if not link:
    sys.exit(f"fa-tests: {page_url} lists no {name}")
data = urllib.request.urlopen(urllib.parse.urljoin(page_url, link.group(1)), timeout=300).read()
if hashlib.sha256(data).hexdigest() != link.group(2):
    sys.exit(f"fa-tests: {name}: sha256 differs from the index's")
open(target, "wb").write(data)
PY
  then
    echo "fa-tests: the package registry did not give flash-attn==$version" >&2
    exit 3
  fi
  tar xzf "$root/flash_attn.tar.gz" -C "$root" "flash_attn-$version/tests/test_flash_attn.py" \
    "flash_attn-$version/flash_attn/bert_padding.py"
  rm "$root/flash_attn.tar.gz"
fi

# The file as FlashAttention ships it, its tensors made on the CPU.
# A directory of its own per run: runs side by side do not share a file.
run=$(mktemp -d "$root/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
sed -e 's/device = "cuda"/device = "cpu"/g; s/device="cuda"/device="cpu"/g' \
  "$src/tests/test_flash_attn.py" > "$run/test_flash_attn.py"
cp tests/flash_attn_suite/conftest.py "$run/conftest.py"
args=(-q -p no:cacheprovider --junitxml "$run/junit.xml" -o junit_family=xunit1)
[ -n "$select" ] && args+=(-k "$select")
targets=(test_flash_attn.py)
if [ -n "$tests" ]; then
  targets=()
  for name in $tests; do targets+=("test_flash_attn.py::$name"); done
fi
status=0
(cd "$run" && FATTN_FA_SOURCE=$src FATTN_FA_SAMPLE=$sample FATTN_FA_PATH=$path \
   PYTHONPATH="$repo/tests/flash_attn_suite${PYTHONPATH:+:$PYTHONPATH}" \
   "$py" -m pytest "${args[@]}" "${targets[@]}") || status=$?
if [ -n "$json" ]; then
  "$py" tests/flash_attn_suite/summary.py "$run/junit.xml" --version "$version" \
    --sample "$sample" --select "$select" --machine "$machine" --path "$path" --json "$json"
fi
exit $status
