"""Attention dropout in fattn's Triton kernels (the GPU's): the forward and both backward
kernels keep the probabilities the CPU kernels keep (one mask definition, fattn.dropout_mask),
against the float64 reference with that mask, dense (GQA, causal) and varlen; the same
bits twice from one stream. On CUDA tensors with a GPU, under Triton's interpreter on CPU
tensors otherwise (see test_triton.py)."""
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn  # noqa: E402
import fattn.triton  # noqa: E402
from test_triton import DEVICE  # noqa: E402


def reference(q, k, v, keep, p, causal):
    """float64 (B, H, S, D) attention, probabilities kept where `keep` and scaled by
    1/(1 - p); causal: bottom-right."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    sq, sk = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.arange(sk) > torch.arange(sq)[:, None] + sk - sq, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) * keep / (1 - p)) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 2, 37, 53, 32), (2, 2, 2, 20, 20, 64)])
def test_dense_forward_and_backward_with_the_cpu_mask(shape, causal):
    b, hq, hkv, sq, sk, d = shape
    g = torch.Generator().manual_seed(sq + sk)
    q = torch.randn(b, hq, sq, d, generator=g, requires_grad=True)
    k = torch.randn(b, hkv, sk, d, generator=g, requires_grad=True)
    v = torch.randn(b, hkv, sk, d, generator=g, requires_grad=True)
    dout = torch.randn(b, hq, sq, d, generator=g)
    p, seed, offset = 0.3, -1234567890123, 3
    kw = dict(causal=causal, causal_bottom_right=causal, dropout_p=p, dropout_seed=seed,
              dropout_offset=offset, block_m=16, block_n=16)
    on = [t.detach().to(DEVICE) for t in (q, k, v)]
    out, lse = fattn.triton.attention(*on, return_lse=True, **kw)
    again = fattn.triton.attention(*on, **kw)
    assert torch.equal(out, again)
    dq, dk, dv, _ = fattn.triton.attention_backward(dout.to(DEVICE), *on, out, lse, **kw)
    keep = fattn.dropout_mask(b, hq, sq, sk, p, seed, offset)
    ref = reference(q, k, v, keep, p, causal)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    for name, got, want in [("out", out, ref)] + list(zip(("dq", "dk", "dv"), (dq, dk, dv),
                                                           ref_grads)):
        err = (got.cpu().double() - want).abs().max().item()
        assert err <= 1e-4 * max(1.0, want.abs().max().item()), (name, err)
    # the CPU kernels, the same stream: the same mask, so outputs within float32 rounding
    cpu = torch.ops.fattn.attention(q.detach(), k.detach(), v.detach(), causal, causal, None,
                                    "auto", None, -1, -1, 0.0, None, None, p,
                                    torch.tensor(seed), offset)[0]
    assert (cpu - out.cpu()).abs().max().item() < 1e-4


def test_varlen_forward_and_backward():
    lengths = [5, 0, 33, 12]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(int(cu[-1]), 2, 32, generator=g, requires_grad=True) for _ in range(3))
    dout = torch.randn(int(cu[-1]), 2, 32, generator=g)
    p, seed = 0.25, 77
    kw = dict(causal=True, dropout_p=p, dropout_seed=seed, block_m=16, block_n=16)
    on = [t.detach().to(DEVICE) for t in (q, k, v)]
    out, lse = fattn.triton.attention_varlen(*on, cu.to(DEVICE), cu.to(DEVICE), 33, 33,
                                             return_lse=True, **kw)
    dq, dk, dv, _ = fattn.triton.attention_varlen_backward(dout.to(DEVICE), *on, out, lse,
                                                           cu.to(DEVICE), cu.to(DEVICE), **kw)
    keep = fattn.dropout_mask(len(lengths), 2, 33, 33, p, seed)
    for n_b, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[n_b]), int(cu[n_b + 1]))
        sl = [t[rows].transpose(0, 1)[None] for t in (q, k, v)]
        ref = reference(*sl, keep[n_b:n_b + 1, :, :n, :n], p, True)
        grads = torch.autograd.grad(ref, sl, dout[rows].transpose(0, 1)[None].double())
        got = [out, dq, dk, dv]
        for name, x, want in zip(("out", "dq", "dk", "dv"), got, (ref,) + grads):
            err = (x[rows].cpu().transpose(0, 1)[None].double() - want).abs().max().item()
            assert err <= 1e-4 * max(1.0, want.abs().max().item()), (name, n_b, err)


def test_dropout_p_is_checked():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    with pytest.raises(fattn.triton.ArgumentError, match=r"dropout_p must be in \[0, 1\)"):
        fattn.triton.attention(q, q, q, dropout_p=1.0)
