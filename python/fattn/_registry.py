"""The Python side of an operator namespace: fake kernels and autograd registration.

The C++ extension (``_C`` or a ``fattn.jit`` build) defines ``<ns>::attention``,
``<ns>::attention_kvcache``, ``<ns>::attention_varlen`` and their backwards, with their CPU
kernels; this module adds, for the same namespace,

* fake (meta) kernels, so ``torch.compile(fullgraph=True)`` and FakeTensor tracing see
  the output shapes, dtypes and strides without running anything;
* the autograd formulas of ``attention`` and ``attention_varlen``: the forward saves q, k,
  v, out and lse (no Sq×Sk matrix), the backward calls ``attention_backward`` /
  ``attention_varlen_backward`` with the same options. The backwards themselves are not
  differentiable (no double backward): they say so when asked. ``attention_kvcache`` is
  inference-only (its C++ Autograd kernel refuses to differentiate it); it mutates its
  caches, which torch.compile functionalizes from the schema's annotations.
"""
from __future__ import annotations

import torch

from ._layouts import empty_like_output, lse_dtype

_registered: set[str] = set()


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
        raise RuntimeError(f"fattn: q.dtype must be float32, bfloat16 or float16 (float64 only "
                           f"through the CPU reference), got {q.dtype}")
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
    """Registers the fake kernels and autograd formulas of ``<ns>``'s operators (once)."""
    if ns in _registered:
        return
    qualname = f"{ns}::attention"
    backward_qualname = f"{ns}::attention_backward"

    def fake_attention(q, k, v, is_causal=False, causal_bottom_right=False, scale=None,
                       impl="auto", attn_mask=None, window_left=-1, window_right=-1,
                       softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                       dropout_seed=None, dropout_offset=0):
        check_operands(q, k, v, is_causal, causal_bottom_right)
        b, h, s, _ = q.shape
        return empty_like_output(q), q.new_empty((b, h, s), dtype=lse_dtype(q))

    def fake_attention_backward(dout, q, k, v, out, lse, dlse=None, is_causal=False,
                                causal_bottom_right=False, scale=None, impl="auto",
                                attn_mask=None, window_left=-1, window_right=-1, softcap=0.0,
                                alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=None,
                                dropout_offset=0):
        check_operands(q, k, v, is_causal, causal_bottom_right)
        dsinks = q.new_empty((sinks.numel() if sinks is not None else 0,), dtype=lse_dtype(q))
        return empty_like_output(q), empty_like_output(k), empty_like_output(v), dsinks

    torch.library.register_fake(qualname, fake_attention)
    torch.library.register_fake(backward_qualname, fake_attention_backward)

    def setup_context(ctx, inputs, output):
        q, k, v, *options = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options  # with the dropout stream: the backward regenerates its mask
        attn_mask = options[ATTENTION_OPTION["attn_mask"]]
        if attn_mask is not None and attn_mask.requires_grad:
            raise NotImplementedError(
                "fattn: attn_mask requires grad, but fattn computes no gradient for the mask; "
                "pass attn_mask.detach()")

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:  # only lse was used
            grad_out = torch.zeros_like(out)
        op = getattr(torch.ops, ns).attention_backward
        dq, dk, dv, dsinks = op(grad_out, q, k, v, out, lse, grad_lse, *ctx.options)
        return (dq, dk, dv) + _option_grads(ctx.options, ATTENTION_OPTION["sinks"], dsinks)

    torch.library.register_autograd(qualname, backward, setup_context=setup_context)

    def no_double_backward(ctx, *grads):
        raise NotImplementedError(
            f"fattn: {backward_qualname} is not differentiable (fattn has no double "
            "backward); torch.autograd.grad(..., create_graph=True) through fattn is not "
            "supported")

    torch.library.register_autograd(backward_qualname, no_double_backward,
                                    setup_context=lambda ctx, inputs, output: None)
    _register_kv_ops(ns)
    from . import cuda_dispatch
    cuda_dispatch.register(ns)
    _registered.add(ns)


# Where each option sits among an operator's arguments after its tensors (q, k, v; varlen:
# and cu_seqlens_q, cu_seqlens_k), as the schemas in python/csrc/ops.cpp order them.
ATTENTION_OPTION = {name: n for n, name in enumerate(
    ("is_causal", "causal_bottom_right", "scale", "impl", "attn_mask", "window_left",
     "window_right", "softcap", "alibi_slopes", "sinks", "dropout_p", "dropout_seed",
     "dropout_offset"))}
VARLEN_OPTION = {name: n for n, name in enumerate(
    ("causal", "scale", "impl", "window_left", "window_right", "softcap", "alibi_slopes",
     "sinks", "dropout_p", "dropout_seed", "dropout_offset"))}


def _option_grads(options, sinks_at, dsinks):
    """The options' gradients: None but for the sinks (dsinks in their dtype)."""
    grads = [None] * len(options)
    sinks = options[sinks_at] if sinks_at < len(options) else None
    if sinks is not None:
        grads[sinks_at] = dsinks.to(sinks.dtype)
    return tuple(grads)


def _check_rank(name, t, rank, dims):
    if t.dim() != rank:
        raise RuntimeError(f"fattn: {name} must have {rank} dimensions {dims}, got {t.dim()} "
                           f"with shape {list(t.shape)}")


def _check_int32(name, t):
    if t.dtype != torch.int32:
        raise RuntimeError(f"fattn: {name} must be an int32 tensor, got {t.dtype}")


def _register_kv_ops(ns: str) -> None:
    """Fake kernels of attention_kvcache and attention_varlen(_backward), the autograd formula
    of attention_varlen (python/csrc/kv_ops.cpp has the layouts)."""
    ops = getattr(torch.ops, ns)

    def fake_kvcache(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None,
                     block_table=None, causal=False, scale=None, kv_splits=0, impl="auto",
                     window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                     sinks=None):
        _check_rank("q", q, 4, "(batch, heads, seq, head_dim)")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            _check_rank(name, t, 4, "(batch or pages, kv heads, seq, head_dim)")
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if t is not None:
                _check_rank(name, t, 4, "(batch, kv heads, new keys, head_dim)")
        for name, t in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
            if t is not None:
                _check_int32(name, t)
        b, h, s, _ = q.shape
        return empty_like_output(q), q.new_empty((b, h, s), dtype=torch.float32)

    def check_packed(q, k, v):
        _check_rank("q", q, 3, "(total_q, heads, head_dim)")
        _check_rank("k", k, 3, "(total_k, kv heads, head_dim)")
        _check_rank("v", v, 3, "(total_k, kv heads, head_dim)")

    def fake_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None,
                    impl="auto", window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                    sinks=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0):
        check_packed(q, k, v)
        _check_int32("cu_seqlens_q", cu_seqlens_q)
        _check_int32("cu_seqlens_k", cu_seqlens_k)
        return q.new_empty(q.shape), q.new_empty((q.size(1), q.size(0)), dtype=lse_dtype(q))

    def fake_varlen_kvcache(q, k, v, cu_seqlens_q, cu_seqlens_k=None, seqused_k=None,
                            block_table=None, causal=False, scale=None, impl="auto",
                            window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                            sinks=None):
        _check_rank("q", q, 3, "(total_q, heads, head_dim)")
        rank = 4 if block_table is not None else 3
        for name, t in (("k", k), ("v", v)):
            _check_rank(name, t, rank, "(pages, kv heads, block_size, head_dim)" if rank == 4
                        else "(total_k, kv heads, head_dim)")
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                        ("seqused_k", seqused_k), ("block_table", block_table)):
            if t is not None:
                _check_int32(name, t)
        return q.new_empty(q.shape), q.new_empty((q.size(1), q.size(0)), dtype=lse_dtype(q))

    def fake_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=False,
                             scale=None, impl="auto", window_left=-1, window_right=-1,
                             softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                             dropout_seed=None, dropout_offset=0):
        check_packed(q, k, v)
        dsinks = q.new_empty((sinks.numel() if sinks is not None else 0,), dtype=lse_dtype(q))
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks

    torch.library.register_fake(f"{ns}::attention_kvcache", fake_kvcache)
    torch.library.register_fake(f"{ns}::triton_attention_kvcache", fake_kvcache)
    torch.library.register_fake(f"{ns}::attention_varlen", fake_varlen)
    torch.library.register_fake(f"{ns}::attention_varlen_backward", fake_varlen_backward)
    torch.library.register_fake(f"{ns}::attention_varlen_kvcache", fake_varlen_kvcache)

    def setup_context(ctx, inputs, output):
        q, k, v, cu_seqlens_q, cu_seqlens_k, *options = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.options = options  # causal, scale, impl, window_left/right, softcap, slopes, sinks
        # The logsumexp carries no gradient (attention_varlen_backward takes none), as in
        # FlashAttention: it is marked so, rather than given a silently wrong gradient.
        ctx.mark_non_differentiable(lse)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv, dsinks = ops.attention_varlen_backward(grad_out, q, k, v, out, lse,
                                                           cu_seqlens_q, cu_seqlens_k,
                                                           *ctx.options)
        return (dq, dk, dv, None, None) + _option_grads(ctx.options, VARLEN_OPTION["sinks"],
                                                        dsinks)

    torch.library.register_autograd(f"{ns}::attention_varlen", backward,
                                    setup_context=setup_context)

    def no_double_backward(ctx, *grads):
        raise NotImplementedError(
            f"fattn: {ns}::attention_varlen_backward is not differentiable (fattn has no "
            "double backward); torch.autograd.grad(..., create_graph=True) through fattn is "
            "not supported")

    torch.library.register_autograd(f"{ns}::attention_varlen_backward", no_double_backward,
                                    setup_context=lambda ctx, inputs, output: None)
