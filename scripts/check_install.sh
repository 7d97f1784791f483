#!/usr/bin/env bash
# README's PyTorch install line, run as written by a new user: in a fresh clone of this
# repository and a fresh virtual environment (pip's download cache makes it quick after
# the first time), then a call of the installed package against torch.
# Usage: scripts/check_install.sh
set -euo pipefail
cd "$(dirname "$0")/.."

line=$(grep -m1 -E '^pip install torch==' README.md | sed 's/[[:space:]]*#.*$//')
[ -n "$line" ] || { echo "check_install.sh: no 'pip install torch==…' line in README.md" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone --quiet . "$tmp/fattn"
# Under scripts/test.sh's compile cache: the clone and the venv are both under $tmp, so
# their paths, relative to it, are the same every run.
[ -z "${CCACHE_BASEDIR:-}" ] || export CCACHE_BASEDIR="$tmp"
python3 -m venv "$tmp/venv"
echo "== in a fresh clone and venv: $line"
(
  cd "$tmp/fattn"
  source "$tmp/venv/bin/activate"
  python -m pip install -q --upgrade pip
  eval "$line" >"$tmp/install.log" 2>&1 || { tail -40 "$tmp/install.log" >&2; exit 1; }
  cd /  # the installed package, not the clone's python/ folder
  python - <<'PY'
import torch, torch.nn.functional as F
import fattn
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 4, 37, 64, generator=g) for _ in range(3))
err = (fattn.scaled_dot_product_attention(q, k, v, is_causal=True)
       - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item()
assert err < 1e-5, err
print(f"fattn {fattn.__version__} installed by README's line; max |fattn - torch| = {err:.1e}")
PY
)
