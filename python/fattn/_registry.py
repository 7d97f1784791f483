"""The Python side of an operator namespace: fake kernel and autograd registration.

The C++ extension (``_C`` or a ``fattn.jit`` build) defines ``<ns>::attention`` and its
CPU kernel; this module adds, for the same namespace,

* a fake (meta) kernel, so ``torch.compile(fullgraph=True)`` and FakeTensor tracing see
  the output shapes, dtypes and strides without running anything;
* an autograd formula whose backward raises: the backward pass is not implemented yet,
  and without a formula torch would only warn and return no gradient.
"""
from __future__ import annotations

import torch

_registered: set[str] = set()


def output_is_bshd(q: torch.Tensor) -> bool:
    """The layout rule of python/csrc/ops.cpp (empty_output): (B, S, H, D) memory when q's
    heads are closer in memory than its rows, else contiguous (B, H, S, D)."""
    return q.size(1) > 1 and q.size(2) > 1 and q.stride(1) < q.stride(2)


def check_operands(q, k, v, is_causal: bool, causal_bottom_right: bool) -> None:
    """The structural checks of the C++ operator, so that tracing fails where eager would."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise RuntimeError(
                f"fattn: {name} must have 4 dimensions (batch, heads, seq, head_dim), "
                f"got {t.dim()} with shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise RuntimeError(f"fattn: {name} is on {t.device} but q is on {q.device}; "
                               "q, k and v must be on one device")
        if t.dtype != q.dtype:
            raise RuntimeError(f"fattn: {name}.dtype is {t.dtype} but q.dtype is {q.dtype}; "
                               "q, k and v must have one dtype")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise RuntimeError(f"fattn: q.dtype must be float32 (float16 and bfloat16 only on "
                           f"CUDA), got {q.dtype}")
    if causal_bottom_right and not is_causal:
        raise RuntimeError("fattn: causal_bottom_right=True needs is_causal=True (it picks the "
                           "alignment of the causal mask)")
    if k.size(0) != q.size(0) or v.size(0) != q.size(0):
        raise RuntimeError(f"fattn: q, k and v must have one batch size, got {q.size(0)}, "
                           f"{k.size(0)}, {v.size(0)}")
    if v.size(1) != k.size(1) or v.size(2) != k.size(2):
        raise RuntimeError(f"fattn: v's (heads, seq) must equal k's, got {tuple(v.shape)} and "
                           f"{tuple(k.shape)}")
    if k.size(3) != q.size(3) or v.size(3) != q.size(3):
        raise RuntimeError(f"fattn: q, k and v must have one head dim, got {q.size(3)}, "
                           f"{k.size(3)}, {v.size(3)}")
    if (q.size(1) % k.size(1) != 0) if k.size(1) > 0 else q.size(1) != 0:
        raise RuntimeError(f"fattn: q.size(1) (query heads) must be a multiple of k.size(1) "
                           f"(kv heads) = {k.size(1)}, got {q.size(1)}")


def register(ns: str) -> None:
    """Registers the fake kernel and the autograd formula of ``<ns>::attention`` (once)."""
    if ns in _registered:
        return
    qualname = f"{ns}::attention"

    def fake_attention(q, k, v, is_causal=False, causal_bottom_right=False, scale=None,
                       impl="auto"):
        check_operands(q, k, v, is_causal, causal_bottom_right)
        b, h, s, d = q.shape
        if output_is_bshd(q):
            out = q.new_empty((b, s, h, d)).transpose(1, 2)
        else:
            out = q.new_empty((b, h, s, d))
        lse = q.new_empty((b, h, s), dtype=torch.float32)
        return out, lse

    torch.library.register_fake(qualname, fake_attention)

    def setup_context(ctx, inputs, output):
        pass

    def backward(ctx, grad_out, grad_lse):
        raise NotImplementedError(
            f"fattn: the backward pass of {qualname} is not implemented yet (forward only). "
            "Run fattn under torch.no_grad() / torch.inference_mode(), or detach its inputs.")

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)
    _registered.add(ns)
