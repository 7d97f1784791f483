"""fattn's Python API: thin, traceable wrappers around ``torch.ops.fattn.attention``.

Every function checks what the operator cannot see (the Python argument names, the
arguments fattn does not support) and then passes the tensors to the operator as strided
(B, H, S, D) views: no copy for 3-D or 4-D inputs, whatever their strides.

Errors:
  ValueError           the call is invalid for torch too (mismatched shapes, devices,
                       dtypes, ranks, an unknown layout, GQA heads without enable_gqa)
  NotImplementedError  valid for torch, but not supported by fattn (yet):
                       a mask that requires grad, dtypes other than float32, bfloat16 and float16
                       (float64 on the CPU: the float64 reference, for gradient checks), a
                       device without fattn kernels, gradients of CUDA tensors where
                       triton is not installed (the GPU backward is Triton's)
  TypeError            an argument that is not a tensor
  RuntimeError         raised by the operator itself, its message starting "fattn: "
                       (e.g. a head dim outside [16, 256])
Nothing falls back to another implementation silently.

float32 on CUDA follows torch's TF32 switch for matmuls, read at each call:
torch.backends.cuda.matmul.allow_tf32 = True (or set_float32_matmul_precision("high"))
runs fattn's TF32 mode (Q·Kᵀ in TF32, errors up to ~1e-3, about 1.6x faster); off (torch's
default) runs 3xTF32, float32-level accuracy. See docs/cuda.md.
"""
from __future__ import annotations

import functools

import torch

from . import _attn_probs, _C, cuda_dispatch
from ._layouts import lse_dtype

# Device types with a fattn kernel in this build: the CPU, the fake kernel (meta), and
# CUDA where triton is installed (the Triton kernels) or the extension is built with the
# library's CUDA backend (fattn/cuda_dispatch.py says which runs a call).
_DEVICE_TYPES = (("cpu", "meta", "cuda") if _C.with_cuda or cuda_dispatch.triton_available()
                 else ("cpu", "meta"))
# The dtypes the CPU kernels take (also fattn.kvcache's); float64 on the CPU runs the
# float64 reference (slow, exact): for torch.autograd.gradcheck.
CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPES = {"cpu": CPU_KERNEL_DTYPES + (torch.float64,),
           "meta": (torch.float32, torch.float16, torch.bfloat16, torch.float64),
           "cuda": (torch.float32, torch.float16, torch.bfloat16)}


def check_one_device_and_dtype(fn: str, tensors) -> None:
    """The (name, tensor) pairs share the first one's device and dtype (ValueError naming
    both otherwise). Also used by fattn.kvcache."""
    (first_name, first), rest = tensors[0], tensors[1:]
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(f"fattn.{fn}: {name} is on {t.device} but {first_name} is on "
                             f"{first.device}; all inputs must be on one device")
        if t.dtype != first.dtype:
            raise ValueError(f"fattn.{fn}: {name}.dtype is {t.dtype} but {first_name}.dtype is "
                             f"{first.dtype}; all inputs must have one dtype")


def _check_tensors(fn: str, tensors) -> None:
    """Type, device, dtype and autograd checks shared by every entry point."""
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fattn.{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    check_one_device_and_dtype(fn, tensors)
    first_name, first = tensors[0]
    device = first.device.type
    if device not in _DEVICE_TYPES:
        extra = (" (no CUDA kernels here: install triton, or build fattn with its CUDA "
                 "backend)"
                 if device == "cuda" else "")
        raise NotImplementedError(
            f"fattn.{fn}: {first_name} is on {first.device}, but fattn runs on "
            f"{', '.join(d for d in _DEVICE_TYPES if d != 'meta')} only{extra}")
    if first.dtype not in _DTYPES[device]:
        allowed = ", ".join(str(d).replace("torch.", "") for d in _DTYPES[device])
        raise NotImplementedError(
            f"fattn.{fn}: {first_name}.dtype is {first.dtype}, but fattn on {device} takes "
            f"{allowed}")
    if device == "cuda" and not cuda_dispatch.triton_available():
        refuse_grad(fn, tensors, "fattn's backward pass runs on CUDA tensors in Triton, and "
                                 "triton is not installed")


def refuse_grad(fn: str, tensors, why: str) -> None:
    """NotImplementedError naming the (name, tensor) pairs that require grad under grad
    mode, for a call that has no backward here (`why`)."""
    if not torch.is_grad_enabled():
        return
    needing = [name for name, t in tensors if t.requires_grad]
    if needing:
        raise NotImplementedError(
            f"fattn.{fn}: {', '.join(needing)} require grad, but {why}. Call it under "
            "torch.no_grad() or torch.inference_mode(), or pass detached tensors.")


def _check_heads(fn: str, hq: int, hkv: int, enable_gqa: bool, hint: str) -> None:
    if hkv == hq:
        return
    if not enable_gqa:
        raise ValueError(
            f"fattn.{fn}: query has {hq} heads but key/value have {hkv}; they must be equal, "
            f"or pass {hint} for grouped-query attention")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"fattn.{fn}: query's {hq} heads must be a multiple of key/value's "
                         f"{hkv} heads (grouped-query attention)")


def _as_bhsd(fn: str, name: str, t: torch.Tensor, rank: int):
    """(…, H, S, D) of any rank >= 2 viewed as (B, H, S, D). Ranks 2 to 4 are views;
    a rank above 4 merges the leading dimensions (torch.reshape: a copy only when they
    cannot be merged as they lie in memory)."""
    if t.dim() != rank:
        raise ValueError(f"fattn.{fn}: query has {rank} dimensions but {name} has {t.dim()}; "
                         "query, key and value must have the same rank")
    if rank == 2:
        return t.unsqueeze(0).unsqueeze(0)
    if rank == 3:
        return t.unsqueeze(0)
    if rank == 4:
        return t
    return t.reshape((-1,) + tuple(t.shape[-3:]))


def _sdpa(op, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    fn = "scaled_dot_product_attention"
    _check_tensors(fn, (("query", query), ("key", key), ("value", value)))
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"fattn.{fn}: attn_mask must be a torch.Tensor or None, got "
                            f"{type(attn_mask).__name__}")
        if is_causal:
            raise ValueError(f"fattn.{fn}: attn_mask and is_causal=True together are an error "
                             "in torch too; put the causal limit into the mask or drop the mask")
    dropout = dropout_stream(fn, dropout_p, query.device)
    rank = query.dim()
    if rank < 2:
        raise ValueError(f"fattn.{fn}: query must have at least 2 dimensions (…, S, D), got "
                         f"shape {tuple(query.shape)}")
    q = _as_bhsd(fn, "query", query, rank)
    k = _as_bhsd(fn, "key", key, rank)
    v = _as_bhsd(fn, "value", value, rank)
    if key.shape[:-3] != query.shape[:-3] or value.shape[:-3] != query.shape[:-3]:
        raise ValueError(
            f"fattn.{fn}: the batch dimensions must match (fattn does not broadcast them): "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    if key.shape != value.shape[:-1] + key.shape[-1:]:
        raise ValueError(f"fattn.{fn}: key and value must agree in all but the last "
                         f"dimension, got key {tuple(key.shape)} and value {tuple(value.shape)}")
    if key.size(-1) != query.size(-1):
        raise ValueError(f"fattn.{fn}: key's head dim must equal query's: query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}")
    if value.size(-1) != query.size(-1):
        raise NotImplementedError(
            f"fattn.{fn}: value's head dim ({value.size(-1)}) must equal query's "
            f"({query.size(-1)}); fattn has no separate value head dim")
    _check_heads(fn, q.size(1), k.size(1), enable_gqa, "enable_gqa=True")
    mask = _mask_as_bhsd(fn, attn_mask, query, key, rank) if attn_mask is not None else None
    out, _ = op(q, k, v, bool(is_causal), False, scale, "auto", mask, *NO_VARIANTS, *dropout)
    return out.view(query.shape) if rank != 4 else out


def _mask_as_bhsd(fn, attn_mask, query, key, rank):
    """attn_mask, broadcastable to (…, L, S), as the operator takes it: up to 4 dimensions,
    size-1 dimensions broadcast by stride 0 (a view); more leading batch dimensions are
    expanded and merged like query's."""
    target = tuple(query.shape[:-1]) + (key.size(-2),)
    if attn_mask.dim() > rank:
        raise ValueError(f"fattn.{fn}: attn_mask {tuple(attn_mask.shape)} has more dimensions "
                         f"than the scores {target}")
    for got, want in zip(reversed(attn_mask.shape), reversed(target)):
        if got not in (1, want):
            raise ValueError(f"fattn.{fn}: attn_mask {tuple(attn_mask.shape)} does not "
                             f"broadcast to the scores (…, L, S) = {target}")
    if rank <= 4:
        return attn_mask
    return attn_mask.expand(target).reshape((-1,) + target[-3:])


def _flash(op, q, k, v, *, causal=False, softmax_scale=None, layout="bshd", return_lse=False,
           dropout_p=0.0, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
           fn="flash_attention", return_attn_probs=False):
    """flash_attention; with return_attn_probs (FlashAttention's flash_attn_func) it returns
    (out, lse, S_dmask), S_dmask None without dropout (fattn._attn_probs)."""
    _check_tensors(fn, (("q", q), ("k", k), ("v", v)))
    left, right = window_of(fn, window_size)
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"fattn.{fn}: {name} must be a torch.Tensor or None, got "
                            f"{type(t).__name__}")
    dropout = dropout_stream(fn, dropout_p, q.device)
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"fattn.{fn}: layout must be 'bshd' (batch, seq, heads, head_dim) or "
                         f"'bhsd' (batch, heads, seq, head_dim), got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fattn.{fn}: {name} must have 4 dimensions "
                             f"({', '.join(layout.upper())}), got shape {tuple(t.shape)}")
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    _check_heads(fn, q.size(1), k.size(1), True, "")
    out, lse = op(q, k, v, bool(causal), bool(causal), softmax_scale, "auto", None, left, right,
                  float(softcap), alibi_slopes, per_head(sinks, q), *dropout)
    probs = None
    if return_attn_probs and dropout[0] > 0.0:
        probs = _attn_probs.dense(q, k, dropout, softmax_scale, causal, (left, right),
                                  float(softcap), alibi_slopes)
    if layout == "bshd":
        out = out.transpose(1, 2)
    if return_attn_probs:
        return out, lse, probs
    return (out, lse) if return_lse else out


# The variants' defaults (window_left, window_right, softcap, alibi_slopes, sinks), where a
# call passes the dropout arguments after them.
NO_VARIANTS = (-1, -1, 0.0, None, None)


def dropout_stream(fn: str, dropout_p, device) -> tuple:
    """The operator's (dropout_p, dropout_seed, dropout_offset) for one call: p checked in
    [0, 1); with p > 0 a fresh 64-bit seed drawn from the default generator of the
    tensors' device, as a one-element int64 tensor there (torch.manual_seed makes the calls
    reproducible, each call draws a new mask, as torch's dropout does, and torch.compile
    traces the draw); the forward's autograd formula hands the same (seed, offset) to the
    backward, which regenerates the mask (src/model/dropout.hpp)."""
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"fattn.{fn}: dropout_p must be in [0, 1), got {dropout_p}")
    if p == 0.0:
        return p, None, 0
    return p, torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64, device=device), 0


def dropout_mask(batch, heads, q_len, kv_len, dropout_p, seed, offset=0):
    """The dropout mask (batch, heads, q_len, kv_len) bool of a call whose stream is (seed,
    offset): True where P[b, h, i, j] survives. For tests and for reproducing fattn's dropout
    elsewhere (b counts varlen's packed sequences; src/model/dropout.hpp defines it)."""
    return _C.dropout_mask(int(batch), int(heads), int(q_len), int(kv_len), float(dropout_p),
                           int(seed), int(offset))  # int(): a seed tensor's value too


def window_of(fn: str, window_size):
    """FlashAttention's window_size = (left, right) as the operator's two ints."""
    if len(tuple(window_size)) != 2:
        raise ValueError(f"fattn.{fn}: window_size must be (left, right), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def sliding_window(size, causal=True) -> tuple[int, int]:
    """The operator's (window_left, window_right) for transformers' and vLLM's
    sliding_window = size: a query sees itself and the size − 1 keys before it (and, not
    causal, every key after it). None or 0: no window, (-1, -1)."""
    if not size:
        return -1, -1
    return int(size) - 1, 0 if causal else -1


def per_head(values, q):
    """Per-head values (sinks: Hq logits) in the dtype the operator reads them in, the
    logsumexp's (float32; float64 for float64 q); the gradient flows back through the cast."""
    if isinstance(values, torch.Tensor) and values.dtype != lse_dtype(q):
        return values.to(lse_dtype(q))
    return values


def _attention_forward(op, Q, K, V):
    fn = "attention_forward"
    _check_tensors(fn, (("Q", Q), ("K", K), ("V", V)))
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if t.dim() != 4:
            raise ValueError(f"fattn.{fn}: {name} must be [B, H, S, D], got shape "
                             f"{tuple(t.shape)}")
    if not (Q.shape == K.shape == V.shape):
        raise ValueError(f"fattn.{fn}: Q, K and V must have one shape [B, H, S, D], got "
                         f"{tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)}")
    out, _ = op(Q, K, V, False, False, None, "auto")
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by fattn.

    query (…, Hq, L, D), key and value (…, Hkv, S, D): 4-D (B, H, S, D), 3-D (H, S, D),
    2-D (S, D) or more leading batch dimensions, any strides (no copies up to 4-D).
    is_causal: torch's (top-left) causal mask, query i sees keys j <= i.
    scale: default 1/sqrt(D). enable_gqa: allow Hq a multiple of Hkv, as in torch.
    attn_mask: torch's: boolean (True takes part) or additive in query's dtype, broadcastable
    to (…, Hq, L, S), read where it lies (broadcast dimensions are not expanded). A row
    whose mask hides every key gives 0 (torch's math backend gives NaN there). The mask
    gets no gradient. dropout_p in [0, 1): each probability kept with probability 1 - p
    and scaled by 1/(1 - p), or dropped, before P·V (torch's semantics; a fresh mask each
    call from the default generator, the backward regenerating it: fattn.dropout_mask
    gives it for tests). Pass dropout_p=0.0 outside training, as with torch.
    """
    return _sdpa(torch.ops.fattn.attention, query, key, value, attn_mask, dropout_p, is_causal,
                 scale, enable_gqa)


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, layout="bshd",
                    return_lse=False, dropout_p=0.0, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None):
    """FlashAttention's convention: q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D) with
    layout="bshd" (the default; layout="bhsd" for (B, H, S, D)); Hq a multiple of Hkv
    (MQA/GQA); causal aligned bottom-right (query i sees keys j <= i + Sk - Sq; a query
    that sees no key gives 0). Returns the output in q's layout, and with
    return_lse=True also the (B, Hq, Sq) float32 logsumexp of the scaled scores.
    The options are keyword-only (flash_attn_func's 4th positional argument is dropout_p).
    window_size=(left, right): query i sees keys j with i + Sk − Sq − left <= j <=
    i + Sk − Sq + right (−1: unbounded), combined with causal. softcap > 0: scores ←
    softcap·tanh(scores/softcap). alibi_slopes (Hq) or (B, Hq), float32: scores −=
    slope·|i + Sk − Sq − j|. sinks (Hq): one logit per head that joins the softmax
    denominator (gpt-oss); it gets a gradient. The CPU kernels take all of them (CUDA: not yet).
    dropout_p in [0, 1): attention dropout, as scaled_dot_product_attention's.
    """
    return _flash(torch.ops.fattn.attention, q, k, v, causal=causal,
                  softmax_scale=softmax_scale, layout=layout, return_lse=return_lse,
                  dropout_p=dropout_p, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, sinks=sinks)


def attention_forward(Q, K, V):
    """O = softmax(Q Kᵀ / sqrt(D)) V for float32 [B, H, S, D] tensors, the plain
    three-tensor signature: non-causal, default scale. Returns a contiguous [B, H, S, D]
    tensor for contiguous inputs."""
    return _attention_forward(torch.ops.fattn.attention, Q, K, V)


def bind(op):
    """The three entry points bound to another build's operator (fattn.jit)."""
    return (functools.partial(_sdpa, op), functools.partial(_flash, op),
            functools.partial(_attention_forward, op))


def extra_bytes(query, key, value, is_causal=False, causal_bottom_right=False, impl="auto"):
    """Bytes of working memory ``torch.ops.fattn.attention`` allocates for these
    (B, H, S, D) tensors with ``torch.get_num_threads()`` threads (fattn::extra_bytes):
    the naive implementation's Sq×Sk score buffer, the fused one's per-thread tiles."""
    return _C.extra_bytes(query, key, value, is_causal, causal_bottom_right, impl)


def backward_extra_bytes(query, key, value, is_causal=False, causal_bottom_right=False,
                         impl="auto"):
    """Bytes of working memory ``torch.ops.fattn.attention_backward`` allocates for these
    (B, H, S, D) tensors (fattn::backward_extra_bytes): O(S) for the fused backward, the
    naive one's P and dS (two Sq×Sk matrices per head)."""
    return _C.backward_extra_bytes(query, key, value, is_causal, causal_bottom_right, impl)


def flops(batch, q_heads, q_len, kv_len, head_dim, causal=None):
    """FLOPs of one forward pass as fattn-bench counts them: 4·D per visible (query, key)
    pair (Q·Kᵀ and P·V). causal: None, "top_left" or "bottom_right"."""
    if causal is None:
        pairs = q_len * kv_len
    else:
        offset = kv_len - q_len if causal == "bottom_right" else 0
        pairs = sum(min(kv_len, max(0, i + 1 + offset)) for i in range(q_len))
    return 4 * batch * q_heads * pairs * head_dim


__all__ = ["scaled_dot_product_attention", "flash_attention", "attention_forward",
           "extra_bytes", "backward_extra_bytes", "flops"]
