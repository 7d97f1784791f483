"""The Triton cross-check kernel (fattn.triton) against float64 and fattn's CPU kernels.

Without a GPU it runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set
here before triton is imported; triton 3.6's interpreter needs numpy < 2.4, which
scripts/python_env.sh installs with it). Small shapes: the interpreter runs numpy per block.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it first; this is for a lone run
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn  # noqa: E402
import fattn.triton  # noqa: E402
from conftest import reference  # noqa: E402
from test_16bit import assert_within_rule, inputs  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CASES = [  # (b, hq, hkv, sq, sk, d, causal)
    (1, 2, 2, 37, 53, 16, None),
    (2, 4, 2, 70, 45, 48, "top_left"),
    (1, 4, 1, 45, 70, 64, "bottom_right"),
    (1, 2, 2, 20, 33, 256, "bottom_right"),
    (1, 2, 1, 1, 90, 128, None),
]


def run(q, k, v, causal, **kw):
    return fattn.triton.attention(q, k, v, causal=causal is not None,
                                  causal_bottom_right=causal == "bottom_right",
                                  return_lse=True, block_m=16, block_n=16, **kw)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}x{c[4]}_D{c[5]}_{c[6]}")
def test_float32_matches_float64_and_fattn(case):
    b, hq, hkv, sq, sk, d, causal = case
    q, k, v = inputs(torch.float32, b, hq, hkv, sq, sk, d, seed=sq, layout="bshd")
    out, lse = run(q, k, v, causal)
    ref, ref_lse = reference(q, k, v, causal)
    assert (out.double() - ref).abs().max() <= 1e-5 * max(1.0, ref.abs().max().item())
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= 1e-5
    ours, ours_lse = torch.ops.fattn.attention(q, k, v, causal is not None,
                                               causal == "bottom_right", None, "auto")
    assert (out - ours).abs().max() <= 2e-5 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_within_rule(dtype):
    b, hq, hkv, sq, sk, d = 1, 4, 2, 40, 70, 64
    q, k, v = inputs(dtype, b, hq, hkv, sq, sk, d, seed=3)
    out, _ = run(q, k, v, "bottom_right")
    ref, _ = reference(q, k, v, "bottom_right")
    mask = ~(torch.arange(sk).view(1, -1) > torch.arange(sq).view(-1, 1) + sk - sq)
    torchs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_within_rule(out, torchs, ref, dtype, "triton")


def test_bad_arguments():
    q = torch.randn(1, 2, 8, 8)
    with pytest.raises(ValueError, match="head dim must be in"):
        fattn.triton.attention(q, q, q)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="causal_bottom_right=True needs causal=True"):
        fattn.triton.attention(q, q, q, causal_bottom_right=True)
