"""FlashAttention's KV-cache and variable-length entry points, computed by fattn on the CPU.

    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                        cache_seqlens=lens, causal=True)
    out = fattn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, causal=True)

Same names, layouts and semantics as ``flash_attn`` 2 (``flash_attn_interface.py``), around
the operators ``torch.ops.fattn.attention_kvcache``, ``torch.ops.fattn.attention_varlen``
and, for the varlen function over a paged cache (``block_table``, ``seqused_k``),
``torch.ops.fattn.attention_varlen_kvcache`` (python/csrc/kv_ops.cpp). The tensors are
passed to them as strided views: no copies.

These wrappers check what the operators cannot see (Python types, the int32 index tensors'
dtypes, devices, ranks, FlashAttention's arguments fattn does not support); every size,
length, offset and block-table entry is checked by the C++ library, before anything is
written: a call that raises leaves the KV cache as it was.

Errors:
  NotImplementedError  valid for FlashAttention but not supported by fattn: dropout over
                       a paged cache, dtypes other than float32, bfloat16 and float16
                       (float64 too in the varlen function), devices other than the CPU,
                       inputs requiring grad in flash_attn_with_kvcache
  ValueError           an invalid call: mismatched devices or dtypes, a wrong rank, an index
                       tensor that is not int32, max_seqlen_q/k below the longest sequence
  TypeError            an argument that is not a tensor (or an int where one is allowed)
  RuntimeError         raised by the operator, its message starting "fattn: " (e.g. an
                       append past the cache's capacity, a block-table entry out of range);
                       sizes there are counted in the operator's (B, H, S, D) view (packed
                       tensors: (1, H, total, D)), k_new and v_new are the k and v arguments.
                       On CUDA tensors the Triton path's fattn.triton.ArgumentError (a
                       RuntimeError and a ValueError, "fattn.triton.<function>: ..."), for
                       the same inputs (tests/python/test_cuda_dispatch.py).
"""
from __future__ import annotations

import functools

import torch

from . import _attn_probs, rotary
from ._layouts import PAGE_MULTIPLE
from .cuda_dispatch import decode_head_dims, triton_available
from .functional import (CPU_KERNEL_DTYPES, check_one_device_and_dtype, dropout_stream, per_head,
                         refuse_grad, window_of)

# The C++ KV-cache and varlen entry points run on the CPU (meta is the fake kernel's); on
# CUDA the Triton kernels run them where triton is installed, and the C++ decode kernel runs
# the 16-bit KV caches it takes where the extension has the CUDA backend
# (fattn/cuda_dispatch.py; the rest then says that triton is missing).
_DEVICE_TYPES = (("cpu", "meta", "cuda") if triton_available() or decode_head_dims()
                 else ("cpu", "meta"))
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


def _check_tensor_type(fn: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fattn.{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_floats(fn: str, tensors, dtypes, rank, layouts) -> None:
    """Tensor type, rank (one for all, or a dict by name), one device and one dtype for the
    attention operands, (name, tensor) pairs; layouts gives each one's dimensions ("(B, Sq,
    Hq, D)") for the message."""
    for name, t in tensors:
        _check_tensor_type(fn, name, t)
        want = rank[name] if isinstance(rank, dict) else rank
        if t.dim() != want:
            raise ValueError(f"fattn.{fn}: {name} must have {want} dimensions {layouts[name]}, "
                             f"got shape {tuple(t.shape)}")
    check_one_device_and_dtype(fn, tensors)
    first_name, first = tensors[0]
    if first.device.type not in _DEVICE_TYPES:
        raise NotImplementedError(f"fattn.{fn}: {first_name} is on {first.device}, but fattn's "
                                  "KV-cache and varlen entry points run on the CPU, and on "
                                  "CUDA with triton installed (16-bit KV caches also with "
                                  "fattn's CUDA backend)")
    if first.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise NotImplementedError(f"fattn.{fn}: {first_name}.dtype is {first.dtype}, but "
                                  f"fattn takes {allowed} here (convert with .float())")


def _check_int32(fn: str, name: str, t, rank: int, shape: str, device) -> None:
    _check_tensor_type(fn, name, t)
    if t.dtype != torch.int32:
        raise ValueError(f"fattn.{fn}: {name}.dtype must be torch.int32, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"fattn.{fn}: {name} must have {rank} dimension{'s' * (rank > 1)} "
                         f"{shape}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"fattn.{fn}: {name} is on {t.device} but q is on {device}; all "
                         "inputs must be on one device")


def _unsupported(fn: str, **given) -> None:
    """NotImplementedError naming the first FlashAttention argument fattn does not support
    (given as name=(value, is_default))."""
    for name, (value, is_default) in given.items():
        if not is_default:
            raise NotImplementedError(f"fattn.{fn}: {name} is not supported by fattn "
                                      f"(got {value!r}); leave it at its default")


def _with_kvcache(op, q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                  cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                  block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                  return_softmax_lse=False, sinks=None):
    fn = "flash_attn_with_kvcache"
    left, right = window_of(fn, window_size)
    cache_layout = "(num_blocks, block_size, Hkv, D)" if block_table is not None else \
        "(B, S_cache, Hkv, D)"
    layouts = {"q": "(B, Sq, Hq, D)", "k_cache": cache_layout, "v_cache": cache_layout,
               "k": "(B, S_new, Hkv, D)", "v": "(B, S_new, Hkv, D)"}
    operands = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    operands += [(name, t) for name, t in (("k", k), ("v", v)) if t is not None]
    _check_floats(fn, operands, CPU_KERNEL_DTYPES, 4, layouts)
    refuse_grad(fn, operands, "flash_attn_with_kvcache has no backward pass (inference "
                              "only, as in FlashAttention)")
    if block_table is not None:
        _check_int32(fn, "block_table", block_table, 2, "(B, max_blocks_per_seq)", q.device)
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, torch.Tensor):
            _check_int32(fn, "cache_seqlens", cache_seqlens, 1, "(B,)", q.device)
        elif isinstance(cache_seqlens, (int, torch.SymInt)) and not isinstance(cache_seqlens, bool):
            if not _INT32_MIN <= cache_seqlens <= _INT32_MAX:
                raise ValueError(f"fattn.{fn}: cache_seqlens = {cache_seqlens} does not fit "
                                 "in int32")
            # an int: every sequence holds that many keys
            cache_seqlens = torch.full((q.size(0),), cache_seqlens, dtype=torch.int32,
                                       device=q.device)
        else:
            raise TypeError(f"fattn.{fn}: cache_seqlens must be an int or an int32 tensor of "
                            f"shape (B,), got {type(cache_seqlens).__name__}")
    if rotary_cos is not None or rotary_sin is not None:
        q, k = rotary.apply(fn, q, k, rotary_cos, rotary_sin, cache_seqlens,
                            bool(rotary_interleaved), bool(causal) or (left, right) != (-1, -1))

    def call(q, k_cache, v_cache, k, v, cache_seqlens, block_table, alibi_slopes):
        return op(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                  None if k is None else k.transpose(1, 2),
                  None if v is None else v.transpose(1, 2),
                  cache_seqlens, block_table, bool(causal), softmax_scale, int(num_splits),
                  "auto", left, right, float(softcap), alibi_slopes, per_head(sinks, q))

    if cache_batch_idx is None and cache_leftpad is None:
        out, lse = call(q, k_cache, v_cache, k, v, cache_seqlens, block_table, alibi_slopes)
    else:
        out, lse = _indexed_cache(fn, call, q, k_cache, v_cache, k, v, cache_seqlens,
                                  cache_batch_idx, cache_leftpad, block_table, alibi_slopes)
    out = out.transpose(1, 2)
    return (out, lse) if return_softmax_lse else out


def _indexed_cache(fn, call, q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                   cache_leftpad, block_table, alibi_slopes):
    """The call with sequence b on cache row cache_batch_idx[b] (default b), its keys starting
    at cache_leftpad[b] (default 0): the cache row is a page of block_size S_cache in one call
    where no sequence is left-padded and the page-size rule allows it, else sequence by
    sequence on views of its row from its first key. On CUDA the one call's rows are checked
    on the device, as block-table entries; otherwise the indices are read on the host once,
    to check them."""
    if block_table is not None:
        raise NotImplementedError(f"fattn.{fn}: cache_batch_idx and cache_leftpad take a "
                                  "(B_cache, S_cache, Hkv, D) cache, not a paged one (as in "
                                  "FlashAttention)")
    b, cache_rows, capacity = q.size(0), k_cache.size(0), k_cache.size(1)
    if cache_batch_idx is not None:
        _check_int32(fn, "cache_batch_idx", cache_batch_idx, 1, "(B,)", q.device)
    if (q.is_cuda and cache_batch_idx is not None and cache_leftpad is None
            and capacity % PAGE_MULTIPLE == 0):
        # Each row one page, its index checked on the device with the block table's (a
        # device-side assertion; no host synchronisation: a decode step stays capturable).
        if cache_batch_idx.size(0) != b:
            raise ValueError(f"fattn.{fn}: cache_batch_idx must hold {b} rows of k_cache, got "
                             f"{cache_batch_idx.size(0)}")
        return call(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx.reshape(b, 1),
                    alibi_slopes)
    rows = list(range(b))
    if cache_batch_idx is not None:
        rows = cache_batch_idx.tolist()
        if len(rows) != b or any(not 0 <= r < cache_rows for r in rows):
            raise ValueError(f"fattn.{fn}: cache_batch_idx must hold {b} rows of k_cache "
                             f"(each in [0, {cache_rows})), got {rows}")
    pads = [0] * b
    if cache_leftpad is not None:
        _check_int32(fn, "cache_leftpad", cache_leftpad, 1, "(B,)", q.device)
        pads = cache_leftpad.tolist()
        lengths = cache_seqlens.tolist() if cache_seqlens is not None else [capacity] * b
        if len(pads) != b or any(not 0 <= p <= n for p, n in zip(pads, lengths)):
            raise ValueError(f"fattn.{fn}: cache_leftpad must hold {b} first keys, each in "
                             f"[0, cache_seqlens[b]] = {lengths}, got {pads}")
    if not any(pads) and capacity % PAGE_MULTIPLE == 0:  # each row one page
        table = torch.tensor(rows, dtype=torch.int32, device=q.device).view(b, 1)
        return call(q, k_cache, v_cache, k, v, cache_seqlens, table, alibi_slopes)
    outs, lses = [], []
    for s, (row, pad) in enumerate(zip(rows, pads)):
        one = slice(s, s + 1)
        outs_lse = call(q[one], k_cache[row:row + 1, pad:], v_cache[row:row + 1, pad:],
                        None if k is None else k[one], None if v is None else v[one],
                        None if cache_seqlens is None else cache_seqlens[one] - pad, None,
                        alibi_slopes[one] if alibi_slopes is not None and alibi_slopes.dim() == 2
                        else alibi_slopes)
        outs.append(outs_lse[0])
        lses.append(outs_lse[1])
    return torch.cat(outs), torch.cat(lses)


def _longest(cu_seqlens) -> int:
    if cu_seqlens.numel() < 2:
        return 0
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def _key_lengths(cu_seqlens_k, seqused_k):
    """The keys of each sequence: seqused_k, or the cu_seqlens_k differences."""
    if seqused_k is not None:
        return int(seqused_k.max()) if seqused_k.numel() else 0
    return _longest(cu_seqlens_k)


def _varlen(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
            alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
            sinks=None, seqused_k=None, cache_op=None):
    fn = "flash_attn_varlen_func"
    left, right = window_of(fn, window_size)
    paged = block_table is not None
    if paged:
        layouts = {"q": "(total_q, Hq, D)", "k": "(num_blocks, block_size, Hkv, D)",
                   "v": "(num_blocks, block_size, Hkv, D)"}
    else:
        layouts = {"q": "(total_q, Hq, D)", "k": "(total_k, Hkv, D)", "v": "(total_k, Hkv, D)"}
    _check_floats(fn, [("q", q), ("k", k), ("v", v)], CPU_KERNEL_DTYPES + (torch.float64,),
                  {"q": 3, "k": 4 if paged else 3, "v": 4 if paged else 3}, layouts)
    if q.device.type == "cuda" and not triton_available():
        refuse_grad(fn, [("q", q), ("k", k), ("v", v)], "fattn's backward pass runs on CUDA "
                                                        "tensors in Triton, and triton is not "
                                                        "installed")
    _check_int32(fn, "cu_seqlens_q", cu_seqlens_q, 1, "(B + 1,)", q.device)
    if cu_seqlens_k is not None or not paged or seqused_k is None:  # else not needed
        _check_int32(fn, "cu_seqlens_k", cu_seqlens_k, 1, "(B + 1,)", q.device)
    if seqused_k is not None:
        _check_int32(fn, "seqused_k", seqused_k, 1, "(B,)", q.device)
    if paged:
        _check_int32(fn, "block_table", block_table, 2, "(B, max_blocks)", q.device)
    # fattn does not need the maxima, but FlashAttention sizes its grid by them: a value
    # below the longest sequence is a caller's bug. Reading the offsets is data-dependent,
    # so the check runs in eager mode only (not while torch.compile traces).
    if not torch.compiler.is_compiling():
        for name, given, longest in (
                ("max_seqlen_q", max_seqlen_q, lambda: _longest(cu_seqlens_q)),
                ("max_seqlen_k", max_seqlen_k, lambda: _key_lengths(cu_seqlens_k, seqused_k))):
            if q.device.type == "meta":
                continue
            most = longest()
            if given < most:
                source = ("seqused_k" if name == "max_seqlen_k" and seqused_k is not None
                          else "cu_seqlens_" + name[-1])
                raise ValueError(f"fattn.{fn}: {name} = {given} is less than the longest "
                                 f"sequence in {source}, {most}")
    if paged or seqused_k is not None:
        # Keys in a cache (pages, or packed rows of which seqused_k are used): inference
        # only, as FlashAttention's paged varlen; an output of inputs that require grad
        # raises when differentiated. No dropout, refused before a seed is drawn.
        if dropout_p != 0.0:
            raise NotImplementedError(f"fattn.{fn}: dropout_p must be 0.0 with block_table or "
                                      f"seqused_k (a cache serves inference), got {dropout_p}")
        out, lse = cache_op(q, k.transpose(1, 2) if paged else k,
                            v.transpose(1, 2) if paged else v, cu_seqlens_q, cu_seqlens_k,
                            seqused_k, block_table, bool(causal), softmax_scale, "auto", left,
                            right, float(softcap), alibi_slopes, per_head(sinks, q))
    else:
        stream = dropout_stream(fn, dropout_p, q.device)
        out, lse = op(q, k, v, cu_seqlens_q, cu_seqlens_k, bool(causal), softmax_scale, "auto",
                      left, right, float(softcap), alibi_slopes, per_head(sinks, q), *stream)
        if return_attn_probs and stream[0] > 0.0:
            probs = _attn_probs.varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, stream, softmax_scale, causal,
                                       (left, right), float(softcap), alibi_slopes)
            return out, lse, probs
    # deterministic: fattn's backward always is (each sequence's gradients in a fixed order).
    return (out, lse, None) if return_attn_probs else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, sinks=None):
    """Attention of q against a KV cache, after appending k and v to it in place
    (FlashAttention 2's ``flash_attn_with_kvcache``; CPU, float32/bfloat16/float16,
    inference only).

    q: (B, Sq, Hq, D). k_cache, v_cache: (B, S_cache, Hkv, D), or with block_table a paged
    cache (num_blocks, block_size, Hkv, D), block_size a multiple of 16 (FlashAttention:
    256). Hq a multiple of Hkv (MQA/GQA: query head h reads kv head h // (Hq / Hkv)). Any
    strides; nothing is copied.

    k, v: (B, S_new, Hkv, D) or None. Given, they are written into k_cache and v_cache *in
    place* at positions cache_seqlens[b] .. cache_seqlens[b] + S_new - 1 of sequence b
    (pages looked up in block_table), and attention then runs over the
    cache_seqlens[b] + S_new keys. Appending needs cache_seqlens, and room in the cache.

    cache_seqlens: int, or (B,) int32 tensor: keys of each sequence already in the cache
    (an int: the same for every sequence; 0 allowed). None: every position of the cache.
    block_table: (B, max_blocks_per_seq) int32: keys [n·block_size, (n+1)·block_size) of
    sequence b live on page block_table[b, n]. Only the pages a sequence uses are read.

    causal: the mask is aligned bottom-right to each sequence's own length after the
    append: query i of Sq sees keys j <= i + L_b - Sq (L_b the sequence's keys); a query
    that sees no key (or a sequence with no key) gives 0, with logsumexp -inf.
    softmax_scale: default 1/sqrt(D). num_splits: the key splits of fattn's decode kernel
    (Options::kv_splits): 0 picks them from the problem and the thread count, 1 does not
    split, n > 1 splits each sequence's keys into n chunks merged by their logsumexps.

    Returns out (B, Sq, Hq, D), and with return_softmax_lse=True also the logsumexp of the
    scaled scores, (B, Hq, Sq) float32.

    window_size=(left, right), softcap, alibi_slopes ((Hq) or (B, Hq) float32): as
    FlashAttention's, aligned to each sequence's own length; sinks (Hq): gpt-oss's
    per-head logits in the softmax denominator (README, docs/variants.md).

    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2), rotary_dim a multiple of 16 at most
    D: the new keys k are rotated at positions cache_seqlens[b] + t before the append, q at
    cache_seqlens[b] + i with causal or a window, else all at cache_seqlens[b];
    rotary_interleaved: dims (0, 1), (2, 3), ... rotate together, else (i, i + rotary_dim / 2)
    (fattn/rotary.py; FlashAttention's semantics). Needs k, v and cache_seqlens.
    cache_batch_idx (B,) int32: sequence b reads and appends to row cache_batch_idx[b] of a
    (B_cache, S_cache, Hkv, D) cache. cache_leftpad (B,) int32: sequence b's keys start at
    position cache_leftpad[b] of its row (<= cache_seqlens[b]): the causal alignment, the
    window and ALiBi count from there, rotary positions do not. Neither takes a paged cache
    (as in FlashAttention). Both read their indices on the host once to check them; with no
    left padding and S_cache a multiple of 16 the call runs as one (each row a page), else
    sequence by sequence.

    Not supported (NotImplementedError naming the argument): inputs that require grad under
    grad mode (no backward, as in FlashAttention). Every argument is validated before the
    append: a call that raises leaves k_cache and v_cache untouched.
    """
    return _with_kvcache(torch.ops.fattn.attention_kvcache, q, k_cache, v_cache, k, v,
                         rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                         block_table, softmax_scale, causal, window_size, softcap,
                         rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, sinks)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           sinks=None, seqused_k=None):
    """Attention over a batch of sequences packed along one axis, without padding
    (FlashAttention 2's ``flash_attn_varlen_func``; CPU; differentiable), or against a paged
    KV cache (``block_table``, ``seqused_k``: chunked prefill and mixed prefill/decode
    batches; inference only).

    q: (total_q, Hq, D), k, v: (total_k, Hkv, D), Hq a multiple of Hkv (MQA/GQA), any
    strides. cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 offsets, from 0, non-decreasing, to
    total_q and total_k: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
    of q, its keys and values the rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of k and v.
    Empty sequences are allowed; a query without keys gives 0 (logsumexp -inf).
    max_seqlen_q, max_seqlen_k: the longest query and key sequence; fattn does not need
    them, but a value below the longest sequence raises ValueError (checked in eager mode;
    skipped while torch.compile traces, since it reads the offsets).

    causal: aligned bottom-right per sequence: query i of a sequence with Sq queries and Sk
    keys sees keys j <= i + Sk - Sq. softmax_scale: default 1/sqrt(D).

    float32 runs fattn's kernels (each sequence the one fattn picks for its shape); float64
    runs the float64 reference (for torch.autograd.gradcheck). The gradients with respect to
    q, k and v are computed by fattn's backward, sequence by sequence; it is always
    deterministic, so ``deterministic`` changes nothing.

    Returns out (total_q, Hq, D). With return_attn_probs=True it returns
    (out, softmax_lse, S_dmask): softmax_lse is the (Hq, total_q) logsumexp of the scaled
    scores (float32; float64 for float64 inputs), which carries no gradient (as in
    FlashAttention); S_dmask, with dropout_p > 0, FlashAttention's (B, Hq, max_seqlen_q,
    max_seqlen_k) (each rounded up to a multiple of 128) probabilities of sequence b at
    [b, :, :Sq_b, :Sk_b], scaled as FlashAttention's kernel leaves them, negated where
    dropout dropped them (formed after the call from the scores and the call's mask:
    fattn._attn_probs), else None.

    window_size, softcap, alibi_slopes ((Hq) or (B, Hq)) and sinks (Hq, with a gradient):
    FlashAttention's and gpt-oss's semantics, per sequence (README, docs/variants.md).

    block_table: (B, max_blocks_per_seq) int32: k and v are then a paged cache
    (num_blocks, block_size, Hkv, D), block_size a multiple of 16 (FlashAttention: 256; vLLM:
    16), and sequence b's L_b keys are keys [n·block_size, (n+1)·block_size) on page
    block_table[b, n] — L_b the cu_seqlens_k differences (cu_seqlens_k then counts keys,
    not rows), or seqused_k[b]. The pages are read where they lie (no gather into a
    contiguous copy); a table entry a sequence does not reach is never read.
    seqused_k: (B,) int32: sequence b uses its first seqused_k[b] keys (of its pages, or of
    its rows in k and v; cu_seqlens_k may then be None with a block_table). With either,
    the call is inference only (as FlashAttention's paged varlen): its output raises when
    differentiated. Both are checked on the host (every page a sequence uses in [0,
    num_blocks), seqused_k[b] within what the sequence holds).

    dropout_p in [0, 1): attention dropout in training (each probability kept with
    probability 1 - p and scaled by 1/(1 - p); sequence b's mask counts b as its batch
    index, fattn.dropout_mask). Not with block_table or seqused_k (NotImplementedError).
    """
    return _varlen(torch.ops.fattn.attention_varlen, q, k, v, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, deterministic, return_attn_probs, block_table, sinks,
                   seqused_k, cache_op=torch.ops.fattn.attention_varlen_kvcache)


def bind(ops):
    """flash_attn_with_kvcache and flash_attn_varlen_func bound to another build's
    operators (``ops``: ``torch.ops.<namespace>``, e.g. fattn.jit's)."""
    return (functools.partial(_with_kvcache, ops.attention_kvcache),
            functools.partial(_varlen, ops.attention_varlen,
                              cache_op=ops.attention_varlen_kvcache))


__all__ = ["flash_attn_with_kvcache", "flash_attn_varlen_func"]
