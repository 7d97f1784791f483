"""Shared helpers of the Python tests: inputs and a float64 reference."""
import contextlib
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is first imported (torch.compile's tests import it
# too): without a GPU, fattn.triton's tests run under its interpreter (test_triton.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fattn  # noqa: F401,E402  (registers torch.ops.fattn)

# The bound of the C++ suite (tests/util/checks.hpp): |got - ref| <= 1e-5 * max(1, max|ref|)
# for outputs, 1e-5 * max(1, |ref|) for each logsumexp.
OUT_TOL = 1e-5
LSE_TOL = 1e-5


@contextlib.contextmanager
def cpu_isa(name):
    """Inside, every fattn CPU call runs the kernels of instruction set `name` ("avx512",
    "avx2", "portable", "auto": the library's choice), so an AVX-512 machine tests the AVX2
    kernels too; skips the test where this CPU lacks them."""
    if not fattn._C.cpu_supports(name):
        pytest.skip(f"this CPU does not support isa {name} (best: {fattn.best_cpu_isa()})")
    before = fattn._C.set_cpu_isa(name)
    try:
        yield
    finally:
        fattn._C.set_cpu_isa(before)


def int32(values):
    """An int32 tensor of the values: the cache indices and sequence offsets."""
    return torch.tensor(values, dtype=torch.int32)


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def qkv(b, hq, hkv, sq, sk, d, seed=0, layout="bhsd"):
    """q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), logically; in memory either
    contiguous (B, H, S, D), or (B, S, H, D) transposed ("bshd": non-contiguous views),
    or a slice of a wider tensor ("strided": padded rows and head dim)."""
    def make(h, s, sd):
        if layout == "bhsd":
            return randn(b, h, s, d, seed=sd)
        if layout == "bshd":
            return randn(b, s, h, d, seed=sd).transpose(1, 2)
        if layout == "strided":
            return randn(b, h + 1, s + 3, d + 5, seed=sd)[:, 1:, 2:-1, 3:-2]
        raise ValueError(layout)
    return make(hq, sq, seed), make(hkv, sk, seed + 1), make(hkv, sk, seed + 2)


def hidden_pairs(sq, sk, causal):
    """(Sq, Sk) bool: True where the causal mask ("top_left" or "bottom_right") hides key j
    from query i."""
    offset = sk - sq if causal == "bottom_right" else 0
    return torch.arange(sk).view(1, -1) > torch.arange(sq).view(-1, 1) + offset


def reference(q, k, v, causal=None, scale=None):
    """float64 softmax(q kᵀ · scale [masked]) v and its logsumexp, for (B, H, S, D)
    tensors with Hq a multiple of Hkv. causal: None, "top_left" or "bottom_right".
    A row that sees no key gives 0 and logsumexp -inf (fattn's convention)."""
    q, k, v = q.double(), k.double(), v.double()
    hq, hkv = q.size(1), k.size(1)
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    sq, sk = q.size(2), k.size(2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal is not None:
        s = s.masked_fill(hidden_pairs(sq, sk, causal), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.nan_to_num(p, nan=0.0)  # rows that see no key
    return torch.matmul(p, v), lse


def assert_close_to_reference(out, ref, tol=OUT_TOL):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = (out.double() - ref).abs().max().item() if ref.numel() else 0.0
    bound = tol * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
    assert err <= bound, f"max abs error {err:.3g} > {bound:.3g}"


def assert_lse_close(lse, ref_lse, tol=LSE_TOL):
    assert lse.dtype == torch.float32
    lse = lse.double()
    inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf), "rows with logsumexp -inf differ"
    if (~inf).any():
        err = (lse[~inf] - ref_lse[~inf]).abs()
        bound = tol * ref_lse[~inf].abs().clamp(min=1.0)
        assert bool((err <= bound).all()), f"lse error {err.max().item():.3g}"


def run_python(code, timeout=600, env=None):
    """Runs code in a fresh interpreter (a clean process: threads, loaded libraries,
    registered operators); returns its stdout, failing the test with its output."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=timeout, env=e)
    if p.returncode != 0:
        pytest.fail(f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout
