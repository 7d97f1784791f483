"""The Python side of an operator namespace: fake kernels and autograd registration.

The C++ extension (``_C`` or a ``fattn.jit`` build) defines ``<ns>::attention`` and
``<ns>::attention_backward`` and their CPU kernels; this module adds, for the same namespace,

* fake (meta) kernels, so ``torch.compile(fullgraph=True)`` and FakeTensor tracing see
  the output shapes, dtypes and strides without running anything;
* the autograd formula of ``attention``: the forward saves q, k, v, out and lse (no
  Sq×Sk matrix), the backward calls ``attention_backward`` with the same options. The
  backward itself is not differentiable (no double backward): it says so when asked.
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
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise RuntimeError(f"fattn: q.dtype must be float32 (float16 and bfloat16 only on "
                           f"CUDA, float64 only through the CPU reference), got {q.dtype}")
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


def _empty_like_output(t):
    """An uninitialised tensor laid out as the C++ operator lays out an output like t."""
    b, h, s, d = t.shape
    if output_is_bshd(t):
        return t.new_empty((b, s, h, d)).transpose(1, 2)
    return t.new_empty((b, h, s, d))


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def register(ns: str) -> None:
    """Registers the fake kernels and the autograd formula of ``<ns>::attention`` (once)."""
    if ns in _registered:
        return
    qualname = f"{ns}::attention"
    backward_qualname = f"{ns}::attention_backward"

    def fake_attention(q, k, v, is_causal=False, causal_bottom_right=False, scale=None,
                       impl="auto"):
        check_operands(q, k, v, is_causal, causal_bottom_right)
        b, h, s, _ = q.shape
        return _empty_like_output(q), q.new_empty((b, h, s), dtype=_lse_dtype(q))

    def fake_attention_backward(dout, q, k, v, out, lse, dlse=None, is_causal=False,
                                causal_bottom_right=False, scale=None, impl="auto"):
        check_operands(q, k, v, is_causal, causal_bottom_right)
        return _empty_like_output(q), _empty_like_output(k), _empty_like_output(v)

    torch.library.register_fake(qualname, fake_attention)
    torch.library.register_fake(backward_qualname, fake_attention_backward)

    def setup_context(ctx, inputs, output):
        q, k, v, is_causal, causal_bottom_right, scale, impl = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (is_causal, causal_bottom_right, scale, impl)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:  # only lse was used
            grad_out = torch.zeros_like(out)
        op = getattr(torch.ops, ns).attention_backward
        dq, dk, dv = op(grad_out, q, k, v, out, lse, grad_lse, *ctx.options)
        return dq, dk, dv, None, None, None, None

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)

    def no_double_backward(ctx, *grads):
        raise NotImplementedError(
            f"fattn: {backward_qualname} is not differentiable (fattn has no double "
            "backward); torch.autograd.grad(..., create_graph=True) through fattn is not "
            "supported")

    torch.library.register_autograd(backward_qualname, no_double_backward,
                                    setup_context=lambda ctx, inputs, output: None)
    _registered.add(ns)
