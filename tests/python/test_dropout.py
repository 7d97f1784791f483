"""Attention dropout on the CPU (fattn.scaled_dot_product_attention, flash_attention and
flash_attn_varlen_func with dropout_p > 0): the forward against a float64 reference that
applies the same mask (fattn.dropout_mask), gradients against float64 autograd with that
mask and by finite differences (gradcheck, one fixed stream), the mask's keep rate over
10^6 draws, reproducibility from torch.manual_seed, independence from the thread count,
dropout_p = 0 unchanged, torch.compile of a training step, and the errors."""
import math

import pytest
import torch

import fattn
from fattn.functional import dropout_stream

op = torch.ops.fattn.attention


def stream(seed, p):
    """The (p, seed, offset) a call draws after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    p, seed, offset = dropout_stream("test", p, torch.device("cpu"))
    return p, int(seed), offset


def reference(q, k, v, keep, p, causal=None, scale=None):
    """float64 out of (B, H, S, D) attention whose probabilities are kept where `keep`
    (B, Hq, Sq, Sk) and scaled by 1/(1 - p): differentiable."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.size(-1)))
    sq, sk = s.shape[-2:]
    if causal is not None:
        shift = sk - sq if causal == "bottom_right" else 0
        s = s.masked_fill(torch.arange(sk) > torch.arange(sq)[:, None] + shift, float("-inf"))
    probs = torch.softmax(s, -1).nan_to_num(0.0)
    return (probs * keep / (1 - p)) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 53, 64), (1, 8, 8, 130, 99, 128),
                                   (1, 2, 1, 1, 300, 32)])
def test_sdpa_forward_and_gradients_against_the_same_mask(shape, causal, dtype):
    b, hq, hkv, sq, sk, d = shape
    g = torch.Generator().manual_seed(sq * sk)
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, hkv, sk, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, hkv, sk, d, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    p = 0.25
    _, seed, offset = stream(11, p)
    torch.manual_seed(11)
    out = fattn.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal,
                                             enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    keep = fattn.dropout_mask(b, hq, sq, sk, p, seed, offset)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, keep, p, "top_left" if causal else None)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for name, got, want in [("out", out, ref)] + list(zip(("dq", "dk", "dv"), grads, ref_grads)):
        err = (got.double() - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), (name, err)


def test_gradcheck_with_one_stream():
    """Finite differences of the float64 path (the reference) with a fixed (seed, offset):
    the mask is a constant of the function."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 16, dtype=torch.float64, generator=g).requires_grad_()
               for _ in range(3))
    seed = torch.tensor(1234)
    f = lambda q, k, v: op(q, k, v, True, False, None, "auto", None, -1, -1, 0.0, None, None,  # noqa: E731
                           0.3, seed, 5)[0]
    assert torch.autograd.gradcheck(f, (q, k, v))


def test_mask_keep_rate_and_reproducibility():
    p = 0.1
    keep = fattn.dropout_mask(4, 8, 256, 128, p, 2024)  # 2^20 draws
    n = keep.numel()
    assert abs(keep.double().mean().item() - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(keep, fattn.dropout_mask(4, 8, 256, 128, p, 2024))
    assert not torch.equal(keep, fattn.dropout_mask(4, 8, 256, 128, p, 2025))
    assert not torch.equal(keep, fattn.dropout_mask(4, 8, 256, 128, p, 2024, offset=1))
    assert fattn.dropout_mask(1, 1, 3, 3, 0.0, 7).all()


def test_reproducible_from_manual_seed_on_any_thread_count():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 150, 64, generator=g) for _ in range(3))
    before = torch.get_num_threads()
    outs = []
    try:
        for threads, seed in ((1, 7), (2, 7), (2, 8)):
            torch.set_num_threads(threads)
            torch.manual_seed(seed)
            outs.append(fattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    torch.manual_seed(7)
    again = fattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    assert torch.equal(again, outs[0])
    # each call draws a new mask
    assert not torch.equal(fattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2), again)


def test_dropout_zero_is_the_plain_call():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 70, 64, generator=g) for _ in range(3))
    state = torch.get_rng_state()
    plain = fattn.scaled_dot_product_attention(q, k, v)
    assert torch.equal(fattn.scaled_dot_product_attention(q, k, v, dropout_p=0.0), plain)
    assert torch.equal(torch.get_rng_state(), state)  # p = 0 draws nothing


def test_flash_attention_and_varlen_dropout():
    g = torch.Generator().manual_seed(6)
    lengths = [3, 40, 0, 25]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), 4, 32, generator=g) for _ in range(3))
    p = 0.4
    _, seed, offset = stream(21, p)
    torch.manual_seed(21)
    out = fattn.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, dropout_p=p, causal=True)
    keep = fattn.dropout_mask(len(lengths), 4, 40, 40, p, seed, offset)
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        sl = [t[rows].transpose(0, 1)[None] for t in (q, k, v)]
        ref = reference(*sl, keep[b:b + 1, :, :n, :n], p, "bottom_right")
        assert (out[rows].transpose(0, 1)[None].double() - ref).abs().max().item() < 2e-5
    # flash_attention (bshd): the same stream as sdpa on the transposed tensors
    qd, kd, vd = (torch.randn(2, 33, 4, 32, generator=g) for _ in range(3))
    torch.manual_seed(9)
    a = fattn.flash_attention(qd, kd, vd, dropout_p=0.3)
    torch.manual_seed(9)
    b = fattn.scaled_dot_product_attention(qd.transpose(1, 2), kd.transpose(1, 2),
                                           vd.transpose(1, 2), dropout_p=0.3)
    assert torch.equal(a, b.transpose(1, 2))


def test_dropout_errors():
    q = torch.randn(1, 2, 8, 16)
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
            fattn.scaled_dot_product_attention(q, q, q, dropout_p=p)
    with pytest.raises(RuntimeError, match="dropout_p > 0 runs on impl auto, fused or reference"):
        op(q, q, q, False, False, None, "naive", None, -1, -1, 0.0, None, None, 0.1,
           torch.tensor(1), 0)
    with pytest.raises(RuntimeError, match=r"dropout_offset must be in \[0, 2\^32\)"):
        op(q, q, q, False, False, None, "auto", None, -1, -1, 0.0, None, None, 0.1,
           torch.tensor(1), -1)
    with pytest.raises(RuntimeError, match="dropout_p = 0.1 needs dropout_seed"):
        op(q, q, q, False, False, None, "auto", None, -1, -1, 0.0, None, None, 0.1)
    cache = torch.randn(2, 32, 2, 16)
    with pytest.raises(NotImplementedError, match="dropout_p must be 0.0 with block_table"):
        fattn.flash_attn_varlen_func(q[0].transpose(0, 1).contiguous(), cache, cache,
                                     torch.tensor([0, 8], dtype=torch.int32),
                                     torch.tensor([0, 8], dtype=torch.int32), 8, 8,
                                     dropout_p=0.1, block_table=torch.tensor([[0]], dtype=torch.int32))


def test_compile_traces_the_draw():
    """torch.compile (fullgraph) of forward and backward with dropout: the seed's draw is a
    traced op; the same stream as eager from the same torch.manual_seed."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g, requires_grad=True) for _ in range(3))

    def forward(q, k, v):
        return fattn.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)

    def step(f):
        torch.manual_seed(3)
        out = f(q, k, v)
        return out, torch.autograd.grad(out.sum(), (q, k, v))

    eager = step(forward)
    torch._dynamo.reset()
    traced = step(torch.compile(forward, fullgraph=True, backend="aot_eager"))
    assert torch.equal(traced[0], eager[0])
    for a, b in zip(traced[1], eager[1]):
        assert torch.equal(a, b)
