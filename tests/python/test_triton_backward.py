"""fattn.triton.attention_backward and attention_varlen_backward (the GPU's gradients)
against float64 autograd of the definition (fattn/triton/reference.py): dQ, dK, dV and the
sinks' gradient, every variant, GQA, packed sequences; bit-identical run to run. On CUDA
tensors with a GPU, under Triton's interpreter on CPU tensors otherwise."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

import fattn.triton  # noqa: E402
from fattn.triton import reference  # noqa: E402
from test_16bit import inputs, ulp_floor  # noqa: E402
from test_triton import DEVICE, variant_args, VARIANTS  # noqa: E402

# float32: |err| <= 5e-5 · max(1, max|ref|) per gradient (each is a sum over a row or a
# column of P·(dP − Δ) products; fattn's CPU backward is held to 2e-5 at IEEE products,
# 3xTF32 on a GPU adds ~1e-6 per product)
TOL = 5e-5
TILES = dict(block_m=16, block_n=16)


def float64_gradients(q, k, v, dout, dlse=None, **kw):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    sinks = kw.pop("sinks", None)
    if sinks is not None:
        sinks = sinks.detach().double().requires_grad_()
        leaves.append(sinks)
    out, lse = reference.attention(*leaves[:3], sinks=sinks, **kw)
    loss = (out * dout.double()).sum()
    if dlse is not None:
        loss = loss + (lse.nan_to_num(neginf=0.0) * dlse.double()).sum()
    grads = torch.autograd.grad(loss, leaves)
    return out, lse, grads


def assert_gradient(name, got, ref, tol=TOL):
    assert got.shape == ref.shape, name
    got = got.cpu().double()
    assert not got.isnan().any(), f"{name}: NaN"
    err = (got - ref).abs().max().item()
    bound = tol * max(1.0, ref.abs().max().item())
    assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}"


def run_backward(q, k, v, dout, causal, dlse=None, **kw):
    dev = {n: (t.to(DEVICE) if torch.is_tensor(t) else t) for n, t in kw.items()}
    q, k, v, dout = (t.to(DEVICE) for t in (q, k, v, dout))
    flags = dict(causal=causal is not None, causal_bottom_right=causal == "bottom_right")
    out, lse = fattn.triton.attention(q, k, v, return_lse=True, **flags, **TILES, **dev)
    return fattn.triton.attention_backward(dout, q, k, v, out, lse,
                                           None if dlse is None else dlse.to(DEVICE),
                                           **flags, **TILES, **dev)


GRID = [  # (b, hq, hkv, sq, sk, d, causal, layout)
    (1, 2, 2, 37, 53, 16, None, "bhsd"),
    (2, 4, 2, 30, 45, 64, "top_left", "bshd"),
    (1, 4, 1, 45, 30, 32, "bottom_right", "strided"),
    (1, 2, 2, 17, 20, 128, "bottom_right", "bhsd"),
    (1, 2, 1, 9, 21, 256, "top_left", "bshd"),
    (1, 2, 2, 1, 33, 80, None, "bhsd"),
]


@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(map(str, c)))
def test_float32_gradients_grid(case):
    b, hq, hkv, sq, sk, d, causal, layout = case
    q, k, v = inputs(torch.float32, b, hq, hkv, sq, sk, d, seed=sq + d, layout=layout)
    dout = inputs(torch.float32, b, hq, hq, sq, 1, d, seed=99)[0]
    dq, dk, dv, dsinks = run_backward(q, k, v, dout, causal)
    _, _, (rq, rk, rv) = float64_gradients(q, k, v, dout, causal=causal)
    assert dsinks is None
    for name, got, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert_gradient(name, got, ref)


@pytest.mark.parametrize("name", ["window_both", "window_causal_bottom_right", "softcap",
                                  "sinks", "alibi_batch_heads", "mask_bool", "mask_additive",
                                  "mask_empty_rows_sinks", "everything"])
def test_float32_gradients_variants(name):
    from test_triton import B, D, HKV, HQ, SK, SQ
    kw = variant_args(VARIANTS[name])
    causal = kw.pop("causal", None)
    q, k, v = inputs(torch.float32, B, HQ, HKV, SQ, SK, D, seed=len(name))
    dout = inputs(torch.float32, B, HQ, HQ, SQ, 1, D, seed=7)[0]
    g = torch.Generator().manual_seed(8)
    dlse = torch.randn(B, HQ, SQ, generator=g)
    dq, dk, dv, dsinks = run_backward(q, k, v, dout, causal, dlse=dlse, **kw)
    _, _, grads = float64_gradients(q, k, v, dout, dlse=dlse, causal=causal, **kw)
    for label, got, ref in zip(("dq", "dk", "dv", "dsinks"), (dq, dk, dv, dsinks), grads):
        assert_gradient(label, got, ref)
    assert (dsinks is None) == ("sinks" not in kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_gradients_within_rule(dtype):
    """Each gradient's error against float64 at most 2x that of torch's own autograd
    through the same computation in the dtype (test_triton.torch_eager), plus 2 ulps of
    the dtype at the largest gradient."""
    from test_triton import torch_eager
    q, k, v = inputs(dtype, 1, 4, 2, 33, 47, 64, seed=4)
    dout = inputs(dtype, 1, 4, 4, 33, 1, 64, seed=5)[0]
    kw = dict(window_size=(20, 0), softcap=5.0)
    dq, dk, dv, _ = run_backward(q, k, v, dout, "bottom_right", **kw)
    _, _, ref = float64_gradients(q, k, v, dout, causal="bottom_right", **kw)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch_eager(*leaves, dtype, causal="bottom_right", **kw).backward(dout)
    for name, got, want, theirs in zip(("dq", "dk", "dv"), (dq, dk, dv), ref,
                                       (t.grad for t in leaves)):
        err = (got.cpu().double() - want).abs().max().item()
        err_torch = (theirs.double() - want).abs().max().item()
        bound = 2 * err_torch + 2 * ulp_floor(want, dtype)
        assert got.dtype == dtype and err <= bound, (name, err, err_torch, bound)


def test_gradients_are_bit_identical_run_to_run():
    q, k, v = inputs(torch.float32, 1, 4, 1, 40, 50, 32, seed=3)
    dout = inputs(torch.float32, 1, 4, 4, 40, 1, 32, seed=6)[0]
    first = run_backward(q, k, v, dout, "top_left")
    second = run_backward(q, k, v, dout, "top_left")
    for a, b in zip(first[:3], second[:3]):
        assert torch.equal(a, b)


# The configurations production runs (problem.BACKWARD_TILES' tiles, no test override) at
# the head dims whose gradients were wrong on an H200 with Triton 3.6 (D = 80, 96 and 128
# pad to BLOCK_D = 128: dK/dV 32 × 64, dQ 64 × 32), not causal and causal with a window,
# several key and query tiles per program, odd lengths, Sq != Sk, GQA. On a GPU these run
# the compiled kernels; under the interpreter the same tiles and grid.
PRODUCTION = [  # (dtype, hq, hkv, sq, sk, d, causal, window)
    (torch.float16, 2, 1, 131, 200, 128, None, (-1, -1)),
    (torch.bfloat16, 2, 2, 160, 97, 96, None, (-1, -1)),
    (torch.float16, 4, 2, 100, 150, 80, "bottom_right", (40, 0)),
    (torch.bfloat16, 2, 1, 96, 96, 128, "top_left", (30, 20)),
    (torch.float16, 2, 2, 70, 300, 64, None, (-1, -1)),
    (torch.bfloat16, 2, 1, 50, 45, 256, None, (-1, -1)),
]


def production_backward(q, k, v, dout, causal, window):
    q, k, v, dout = (t.to(DEVICE) for t in (q, k, v, dout))
    flags = dict(causal=causal is not None, causal_bottom_right=causal == "bottom_right",
                 window_size=window)
    out, lse = fattn.triton.attention(q, k, v, return_lse=True, **flags)
    return fattn.triton.attention_backward(dout, q, k, v, out, lse, **flags)[:3]


@pytest.mark.parametrize("case", PRODUCTION, ids=lambda c: "-".join(
    str(x).replace("torch.", "").replace(" ", "") for x in c))
def test_16bit_gradients_at_production_tiles(case):
    from test_triton import torch_eager
    dtype, hq, hkv, sq, sk, d, causal, window = case
    q, k, v = inputs(dtype, 1, hq, hkv, sq, sk, d, seed=sq + d)
    dout = inputs(dtype, 1, hq, hq, sq, 1, d, seed=d)[0]
    grads = production_backward(q, k, v, dout, causal, window)
    _, _, ref = float64_gradients(q, k, v, dout, causal=causal, window_size=window)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch_eager(*leaves, dtype, causal=causal, window_size=window).backward(dout)
    for name, got, want, theirs in zip(("dq", "dk", "dv"), grads, ref, (t.grad for t in leaves)):
        err = (got.cpu().double() - want).abs().max().item()
        err_torch = (theirs.double() - want).abs().max().item()
        bound = 2 * err_torch + 2 * ulp_floor(want, dtype)
        assert got.dtype == dtype and err <= bound, (name, err, err_torch, bound)


def test_production_tiles_bit_identical_run_to_run():
    """FlashAttention's deterministic test at the configuration that broke it on an H200:
    D = 128, not causal, production tiles; two backward passes, the same bits."""
    q, k, v = inputs(torch.float16, 1, 2, 2, 130, 190, 128, seed=11)
    dout = inputs(torch.float16, 1, 2, 2, 130, 1, 128, seed=12)[0]
    first = production_backward(q, k, v, dout, None, (-1, -1))
    second = production_backward(q, k, v, dout, None, (-1, -1))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_backward_tiles_override():
    """attention_backward's tiles= (the benchmark's sweep) runs the kernels at the given
    tiles, with the same gradients as the default's to float32 rounding, and rejects a
    malformed configuration naming the argument."""
    q, k, v = inputs(torch.float32, 1, 2, 1, 40, 70, 64, seed=2)
    dout = inputs(torch.float32, 1, 2, 2, 40, 1, 64, seed=3)[0]
    q, k, v, dout = (t.to(DEVICE) for t in (q, k, v, dout))
    out, lse = fattn.triton.attention(q, k, v, return_lse=True)
    default = fattn.triton.attention_backward(dout, q, k, v, out, lse)[:3]
    swept = fattn.triton.attention_backward(dout, q, k, v, out, lse,
                                            tiles=((16, 32, 4, 2), (32, 16, 4, 2)))[:3]
    for a, b in zip(default, swept):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, a.abs().max().item())
    with pytest.raises(fattn.triton.ArgumentError, match="tiles must be two"):
        fattn.triton.attention_backward(dout, q, k, v, out, lse, tiles=((24, 32, 4, 2),) * 2)


def test_varlen_gradients():
    lq, lk = [5, 0, 17], [9, 4, 17]
    cu_q = torch.tensor([0, 5, 5, 22], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 13, 30], dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, h, 32, generator=g) for n, h in ((22, 4), (30, 2), (30, 2)))
    dout = torch.randn(22, 4, 32, generator=g)
    sinks = torch.randn(4, generator=g)
    kw = dict(causal=True, window_size=(6, 0), softcap=4.0)
    dev = [t.to(DEVICE) for t in (q, k, v, cu_q, cu_k, dout, sinks)]
    out, lse = fattn.triton.attention_varlen(*dev[:5], return_lse=True, sinks=dev[6], **kw,
                                             **TILES)
    dq, dk, dv, dsinks = fattn.triton.attention_varlen_backward(dev[5], *dev[:3], out, lse,
                                                                dev[3], dev[4], sinks=dev[6],
                                                                **kw, **TILES)
    leaves = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    ref_out, _ = reference.attention_varlen(*leaves[:3], cu_q, cu_k, sinks=leaves[3], **kw)
    grads = torch.autograd.grad((ref_out * dout.double()).sum(), leaves)
    for name, got, ref in zip(("dq", "dk", "dv", "dsinks"), (dq, dk, dv, dsinks), grads):
        assert_gradient(name, got, ref)


def test_cpu_tensors_without_the_interpreter(monkeypatch):
    """With a GPU (no interpreter), CPU tensors get fattn's error naming the device, not
    Triton's launch failure."""
    monkeypatch.setattr(fattn.triton.problem, "interpreted", lambda: False)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(fattn.triton.ArgumentError, match="q is on cpu, expected a CUDA"):
        fattn.triton.attention(q, q, q)


def test_bad_gradient_inputs():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    out, lse = fattn.triton.attention(q, q, q, return_lse=True)
    with pytest.raises(fattn.triton.ArgumentError, match="dout must have shape"):
        fattn.triton.attention_backward(q[:, :, :4], q, q, q, out, lse)
    with pytest.raises(fattn.triton.ArgumentError, match="lse.dtype must be torch.float32"):
        fattn.triton.attention_backward(q, q, q, q, out, lse.double())
