"""fattn.triton's entry points: dense attention, packed variable-length batches, and a KV
cache with in-place append. Each one validates its arguments (ArgumentError, a ValueError
naming the argument, the expected and the given value) before anything is written, then
runs one Problem (problem.py)."""
from __future__ import annotations

import math

import torch

from . import problem
from .._layouts import PAGE_MULTIPLE
from .outputs import check_destination, check_disjoint, check_no_self_overlap
from .problem import (DTYPES, HEAD_DIMS, ArgumentError, Problem, check, check_lengths,
                      check_variants, run_backward, run_forward, window_pair)


def _check_operands(fn, named, rank, layout):
    """rank: one for all, or a dict by name."""
    for name, t in named:
        check(isinstance(t, torch.Tensor), fn,
              f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want = rank[name] if isinstance(rank, dict) else rank
        check(t.dim() == want, fn, f"{name} must have {want} dimensions {layout[name]}, got "
                                   f"shape {tuple(t.shape)}")
    first_name, first = named[0]
    for name, t in named[1:]:
        check(t.device == first.device, fn,
              f"{name} is on {t.device} but {first_name} is on {first.device}; all inputs must "
              "be on one device")
        check(t.dtype == first.dtype, fn, f"{name}.dtype is {t.dtype} but {first_name}.dtype "
                                          f"is {first.dtype}; all inputs must have one dtype")
    check(first.dtype in DTYPES, fn, f"{first_name}.dtype must be float32, float16 or bfloat16, "
                                     f"got {first.dtype}")
    check(first.is_cuda or problem.interpreted(), fn,
          f"{first_name} is on {first.device}, expected a CUDA device (CPU tensors run only "
          "under Triton's interpreter, TRITON_INTERPRET=1 before triton is imported)")


def _check_heads_and_dim(fn, hq, hkv, d, dk, dv, k_name="k", v_name="v"):
    """The C++ library's words (src/model/validate.cpp), sizes counted as in its (B, H, S,
    D) views (packed tensors: (1, H, total, D)), so a call reads the same on every device."""
    for name, got in ((k_name, dk), (v_name, dv)):
        check(got == d, fn, f"{name}.size(3) (head dim) must equal q.size(3) = {d}, got {got}")
    check(HEAD_DIMS[0] <= d <= HEAD_DIMS[1], fn,
          f"q.size(3) (head dim) must be in [{HEAD_DIMS[0]}, {HEAD_DIMS[1]}], got {d}")
    check(hkv > 0 and hq % hkv == 0, fn, f"q.size(1) (query heads) must be a multiple of "
                                         f"{k_name}.size(1) (kv heads) = {hkv}, got {hq}")


def _scale(fn, scale, d):
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    check(math.isfinite(scale), fn, f"scale must be finite, got {scale}")
    return scale


def _mask_view(fn, attn_mask, q, sk):
    """attn_mask broadcast to (B, Hq, Sq, Sk) without a copy."""
    b, hq, sq, _ = q.shape
    check(isinstance(attn_mask, torch.Tensor), fn,
          f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    check(attn_mask.device == q.device, fn,
          f"attn_mask is on {attn_mask.device} but q is on {q.device}")
    check(attn_mask.dtype in (torch.bool, q.dtype), fn,
          f"attn_mask must have dtype bool or q's dtype {q.dtype}, got {attn_mask.dtype}")
    full = (b, hq, sq, sk)
    check(1 <= attn_mask.dim() <= 4, fn, f"attn_mask must have 1 to 4 dimensions broadcastable "
                                         f"to {full}, got shape {tuple(attn_mask.shape)}")
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    for d, name in enumerate(("batch", "query heads", "query sequence", "key sequence")):
        check(shape[d] in (1, full[d]), fn,
              f"attn_mask's {name} dimension must be 1 (broadcast) or {full[d]}, got shape "
              f"{tuple(attn_mask.shape)}")
    return attn_mask.detach().reshape(shape).expand(full)


def _dense_problem(fn, q, k, v, attn_mask, causal, causal_bottom_right, window_size, softcap,
                   sinks, alibi_slopes, scale, out, block_m, block_n, lse=None):
    """The checked Problem of a (B, H, S, D) call (forward or backward); out and lse
    allocated unless given (the backward's lse is checked by the caller)."""
    _check_operands(fn, [("q", q), ("k", k), ("v", v)], 4,
                    {"q": "(B, Hq, Sq, D)", "k": "(B, Hkv, Sk, D)", "v": "(B, Hkv, Sk, D)"})
    b, hq, sq, d = q.shape
    hkv, sk = k.size(1), k.size(2)
    check(k.size(0) == b and v.size(0) == b, fn,
          f"q, k and v must have one batch size, got {b}, {k.size(0)}, {v.size(0)}")
    check(v.shape[:3] == k.shape[:3], fn, f"v's (batch, heads, seq) must equal k's, got "
                                          f"{tuple(v.shape)} and {tuple(k.shape)}")
    _check_heads_and_dim(fn, hq, hkv, d, k.size(3), v.size(3))
    check(causal or not causal_bottom_right, fn,
          "causal_bottom_right=True needs causal=True (it picks the causal mask's alignment)")
    check_lengths(fn, **{"q.size(2)": sq, "k.size(2)": sk})
    left, right, softcap, sinks, alibi = check_variants(fn, q, *window_pair(fn, window_size),
                                                        softcap, sinks, alibi_slopes, b)
    mask = None if attn_mask is None else _mask_view(fn, attn_mask, q, sk)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    return Problem(q, k, v, out, lse, batch=b, q_len=sq, kv_len=sk, scale=_scale(fn, scale, d),
                   causal=(2 if causal_bottom_right else 1) if causal else 0,
                   window_left=left, window_right=right, mask=mask, mask_source=attn_mask,
                   softcap=softcap, alibi=alibi, sinks=sinks, block_m=block_m, block_n=block_n)


def _with_dropout(fn, p, dropout_p, dropout_seed, dropout_offset):
    """p with attention dropout (dropout.py): dropout_p in [0, 1), the stream's 64-bit seed
    (a one-element int64 tensor, read by the kernels from device memory, as torch's own
    dropout reads its state: CUDA graphs replay fresh seeds; or an int) and its offset in
    [0, 2^32)."""
    check(0.0 <= float(dropout_p) < 1.0, fn, f"dropout_p must be in [0, 1), got {dropout_p}")
    check(0 <= int(dropout_offset) < 2 ** 32, fn,
          f"dropout_offset must be in [0, 2^32), got {dropout_offset}")
    p.dropout_p = float(dropout_p)
    p.dropout_offset = int(dropout_offset)
    if p.dropout_p == 0.0:
        return p
    check(dropout_seed is not None, fn, f"dropout_p = {dropout_p} needs dropout_seed")
    if not isinstance(dropout_seed, torch.Tensor):
        dropout_seed = torch.tensor(int(dropout_seed), dtype=torch.int64)
    check(dropout_seed.dtype == torch.int64 and dropout_seed.numel() == 1, fn,
          f"dropout_seed must be an int or a one-element int64 tensor, got "
          f"{dropout_seed.dtype} {tuple(dropout_seed.shape)}")
    p.dropout_seed = dropout_seed.reshape(1).to(p.q.device)
    return p


def attention(q, k, v, attn_mask=None, causal=False, causal_bottom_right=False,
              window_size=(-1, -1), softcap=0.0, sinks=None, alibi_slopes=None, scale=None,
              return_lse=False, out=None, block_m=None, block_n=None, dropout_p=0.0,
              dropout_seed=None, dropout_offset=0):
    """softmax(q·kᵀ·scale [+ variants]) v for (B, H, S, D) tensors (see the package's
    docstring). `out` (optional): a (B, Hq, Sq, D) tensor of q's dtype to write into;
    block_m/block_n override the tile sizes (tests). dropout_p > 0: attention dropout with
    the stream (dropout_seed, dropout_offset), the CPU kernels' mask (dropout.py)."""
    p = _dense_problem("attention", q, k, v, attn_mask, causal, causal_bottom_right,
                       window_size, softcap, sinks, alibi_slopes, scale, out, block_m, block_n)
    if out is not None:
        check_destination("attention", "out", out, q.shape, q.dtype, q.device,
                          [("q", q), ("k", k), ("v", v)])
    _with_dropout("attention", p, dropout_p, dropout_seed, dropout_offset)
    run_forward(p)
    return (p.out, p.lse) if return_lse else p.out


def _check_gradient_inputs(fn, p, dout, out, lse, dlse, lse_shape, packed_shape=None):
    shape_q = packed_shape or tuple(p.q.shape)
    for name, t, shape, dtype in (("dout", dout, shape_q, p.q.dtype),
                                  ("out", out, shape_q, p.q.dtype),
                                  ("lse", lse, lse_shape, torch.float32),
                                  ("dlse", dlse, lse_shape, torch.float32)):
        if t is None and name == "dlse":
            continue
        check(isinstance(t, torch.Tensor), fn, f"{name} must be a tensor")
        check(t.device == p.q.device, fn, f"{name} is on {t.device} but q is on {p.q.device}")
        check(tuple(t.shape) == shape, fn, f"{name} must have shape {shape}, got "
                                           f"{tuple(t.shape)}")
        check(t.dtype == dtype, fn, f"{name}.dtype must be {dtype}, got {t.dtype}")


def attention_backward(dout, q, k, v, out, lse, dlse=None, attn_mask=None, causal=False,
                       causal_bottom_right=False, window_size=(-1, -1), softcap=0.0,
                       sinks=None, alibi_slopes=None, scale=None, dq=None, dk=None, dv=None,
                       block_m=None, block_n=None, tiles=None, dropout_p=0.0, dropout_seed=None,
                       dropout_offset=0):
    """The gradients of attention(q, k, v, ...) -> (out, lse) given dout and optionally
    dlse (the logsumexp's gradient): (dq, dk, dv, dsinks), dsinks float32 of sinks' shape
    (None without sinks). The options must be the forward's; out and lse its results.
    dq, dk, dv (optional): tensors shaped as q, k, v to write into. Deterministic: the same
    bits run to run (no atomics). tiles (benchmarks): ((block_m, block_n, num_warps,
    num_stages) of the dK/dV kernel, the same of the dQ kernel) instead of problem.py's
    BACKWARD_TILES."""
    fn = "attention_backward"
    p = _dense_problem(fn, q, k, v, attn_mask, causal, causal_bottom_right, window_size,
                       softcap, sinks, alibi_slopes, scale, out, block_m, block_n, lse=lse)
    _with_dropout(fn, p, dropout_p, dropout_seed, dropout_offset)
    if tiles is not None:
        def power_of_two(x, least):
            return isinstance(x, int) and x >= least and x & (x - 1) == 0
        check(len(tiles) == 2 and all(
            len(t) == 4 and power_of_two(t[0], 16) and power_of_two(t[1], 16)
            and power_of_two(t[2], 1) and isinstance(t[3], int) and t[3] >= 1 for t in tiles),
            fn, "tiles must be two (block_m, block_n, num_warps, num_stages) tuples: blocks "
                f"powers of two >= 16, warps a power of two, stages >= 1; got {tiles!r}")
        p.backward_tiles = tuple(tuple(t) for t in tiles)
    _check_gradient_inputs(fn, p, dout, out, lse, dlse, tuple(q.shape[:3]))
    reads = [("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse),
             ("dlse", dlse)]
    for name, given, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if given is not None:
            check_destination(fn, name, given, like.shape, like.dtype, q.device, reads)
            reads.append((name, given))
    # laid out as the inputs where they are dense (FlashAttention's (B, S, H, D) stays so:
    # its heads D elements apart, within the kernels' 32-bit head offsets)
    grads = tuple(torch.empty_like(t) if g is None else g for t, g in ((q, dq), (k, dk), (v, dv)))
    dsinks = run_backward(p, dout, dlse, *grads)
    return grads + (dsinks,)


def _check_offsets(fn, name, cu, total, batch, device):
    check(isinstance(cu, torch.Tensor), fn, f"{name} must be an int32 tensor")
    check(cu.dtype == torch.int32, fn, f"{name}.dtype must be torch.int32, got {cu.dtype}")
    check(cu.dim() == 1 and cu.numel() >= 1, fn,
          f"{name} must have shape (B + 1,), got {tuple(cu.shape)}")
    check(cu.device == device, fn, f"{name} is on {cu.device} but q is on {device}")
    if batch is not None:
        check(cu.numel() == batch + 1, fn, f"{name} must have {batch + 1} entries like "
                                           f"cu_seqlens_q, got {cu.numel()}")
    host = cu.tolist()  # one read of the offsets: every later check is on the host
    check(host[0] == 0, fn, f"{name}[0] must be 0, got {host[0]}")
    for n in range(1, len(host)):
        check(host[n] >= host[n - 1], fn,
              f"{name} must be non-decreasing, got {name}[{n - 1}] = {host[n - 1]} > "
              f"{name}[{n}] = {host[n]}")
    check(total is None or host[-1] == total, fn,  # None: keys on pages
          f"{name}[-1] must equal the packed rows {total}, got {host[-1]}")
    return max((host[n + 1] - host[n] for n in range(len(host) - 1)), default=0)


def _varlen_problem(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    window_size, softcap, sinks, alibi_slopes, scale, out, block_m, block_n,
                    lse=None):
    """The checked Problem of packed (total, H, D) sequences: (B, H, total, D) views with
    batch stride 0, the rows of sequence b from the offsets."""
    _check_operands(fn, [("q", q), ("k", k), ("v", v)], 3,
                    {"q": "(total_q, Hq, D)", "k": "(total_k, Hkv, D)",
                     "v": "(total_k, Hkv, D)"})
    total_q, hq, d = q.shape
    total_k, hkv = k.size(0), k.size(1)
    check(v.shape[:2] == k.shape[:2], fn, f"v's (total_k, heads) must equal k's, got "
                                          f"{tuple(v.shape)} and {tuple(k.shape)}")
    _check_heads_and_dim(fn, hq, hkv, d, k.size(2), v.size(2))
    longest_q = _check_offsets(fn, "cu_seqlens_q", cu_seqlens_q, total_q, None, q.device)
    batch = cu_seqlens_q.numel() - 1
    longest_k = _check_offsets(fn, "cu_seqlens_k", cu_seqlens_k, total_k, batch, q.device)
    for name, given, longest in (("max_seqlen_q", max_seqlen_q, longest_q),
                                 ("max_seqlen_k", max_seqlen_k, longest_k)):
        check(given is None or given >= longest, fn,
              f"{name} = {given} is less than the longest sequence, {longest}")
    check_lengths(fn, total_q=total_q, total_k=total_k)
    left, right, softcap, sinks, alibi = check_variants(fn, q, *window_pair(fn, window_size),
                                                        softcap, sinks, alibi_slopes, batch)
    if out is None:
        out = torch.empty((total_q, hq, d), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    return Problem(packed(q, batch), packed(k, batch), packed(v, batch), packed(out, batch),
                   lse.unsqueeze(0).expand(batch, -1, -1), batch=batch, q_len=longest_q,
                   kv_len=longest_k, scale=_scale(fn, scale, d), causal=2 if causal else 0,
                   window_left=left, window_right=right, softcap=softcap, alibi=alibi,
                   sinks=sinks, lengths=2, seq_q=cu_seqlens_q.contiguous(),
                   seq_k=cu_seqlens_k.contiguous(),
                   block_m=block_m, block_n=block_n)


def packed(t, batch):
    """(total, H, D) -> (B, H, total, D) with batch stride 0 (rows from the offsets)."""
    return t.transpose(0, 1).unsqueeze(0).expand(batch, -1, -1, -1)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                     causal=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                     alibi_slopes=None, scale=None, return_lse=False, out=None, block_m=None,
                     block_n=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """Sequences packed along one axis (FlashAttention's flash_attn_varlen_func): q
    (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens_q/k (B + 1,) int32 offsets.
    causal and the window are aligned bottom-right per sequence. Returns out (total_q, Hq,
    D) and with return_lse the (Hq, total_q) float32 logsumexp. No padding is computed: a
    tile past its sequence's queries does nothing."""
    p = _varlen_problem("attention_varlen", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, window_size, softcap, sinks, alibi_slopes, scale,
                        out, block_m, block_n)
    if out is not None:
        check_destination("attention_varlen", "out", out, q.shape, q.dtype, q.device,
                          [("q", q), ("k", k), ("v", v)])
    _with_dropout("attention_varlen", p, dropout_p, dropout_seed, dropout_offset)
    if p.batch > 0:
        run_forward(p, "attention_varlen")
    out, lse = p.out[0].transpose(0, 1), p.lse[0]
    return (out, lse) if return_lse else out


def attention_varlen_kvcache(q, k, v, cu_seqlens_q, cu_seqlens_k=None, seqused_k=None,
                             block_table=None, causal=False, window_left=-1, window_right=-1,
                             softcap=0.0, sinks=None, alibi_slopes=None, scale=None,
                             block_m=None, block_n=None):
    """The operator attention_varlen_kvcache on the GPU (python/csrc/kv_ops.cpp's schema):
    packed queries q (total_q, Hq, D) against keys in a cache — pages (num_blocks, Hkv,
    block_size, D) with block_table (B, max_blocks) int32, or packed rows (total_k, Hkv, D);
    seqused_k (B,) int32: the keys each sequence uses (else the cu_seqlens_k differences).
    The same rules as the CPU's, the lengths and pages checked on the device (as
    kvcache_attention's). Returns out (total_q, Hq, D) and lse (Hq, total_q) float32."""
    fn = "flash_attn_varlen_func"
    paged = block_table is not None
    layout = "(num_blocks, Hkv, block_size, D)" if paged else "(total_k, Hkv, D)"
    rank = 4 if paged else 3
    _check_operands(fn, [("q", q), ("k", k), ("v", v)], {"q": 3, "k": rank, "v": rank},
                    {"q": "(total_q, Hq, D)", "k": layout, "v": layout})
    check(v.shape == k.shape, fn, f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    total_q, hq, d = q.shape
    hkv = k.size(1)
    _check_heads_and_dim(fn, hq, hkv, d, k.size(-1), v.size(-1))
    longest_q = _check_offsets(fn, "cu_seqlens_q", cu_seqlens_q, total_q, None, q.device)
    batch = cu_seqlens_q.numel() - 1
    if seqused_k is not None:
        check(isinstance(seqused_k, torch.Tensor) and seqused_k.dtype == torch.int32
              and tuple(seqused_k.shape) == (batch,), fn,
              f"seqused_k must be an int32 tensor of shape ({batch},), got "
              f"{getattr(seqused_k, 'dtype', type(seqused_k).__name__)} "
              f"{tuple(getattr(seqused_k, 'shape', ()))}")
        check(seqused_k.device == q.device, fn,
              f"seqused_k is on {seqused_k.device} but q is on {q.device}")
    if paged:
        page = k.size(2)
        capacity = _check_page_table(fn, block_table, batch, "k", page, q.device,
                                     "cu_seqlens_q.size(0) - 1")
        if seqused_k is None:
            check(cu_seqlens_k is not None, fn, "a paged varlen call needs cu_seqlens_k or "
                                                "seqused_k (the keys of each sequence)")
            _check_offsets(fn, "cu_seqlens_k", cu_seqlens_k, None, batch, q.device)
            lengths, lengths_name = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]), "cu_seqlens_k"
        else:
            lengths, lengths_name = seqused_k, "seqused_k"
        _check_cache_indices(fn, lengths, 0, capacity, block_table, k.size(0), page,
                             lengths_name, "k")
    else:
        check(cu_seqlens_k is not None, fn,
              "cu_seqlens_k must be given for keys packed in k and v (no block_table)")
        _check_offsets(fn, "cu_seqlens_k", cu_seqlens_k, k.size(0), batch, q.device)
        capacity = k.size(0)
        if seqused_k is not None:
            room = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
            _check_cache_indices(fn, seqused_k, 0, room, None, 0, 1, "seqused_k", "k")
    check_lengths(fn, total_q=total_q, capacity=capacity)
    left, right, softcap, sinks, alibi = check_variants(fn, q, window_left, window_right,
                                                        softcap, sinks, alibi_slopes, batch)
    out = torch.empty((total_q, hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    if batch > 0:
        keys = (k, v) if paged else (packed(k, batch), packed(v, batch))
        # the kernels step through the offsets one int32 at a time: a strided view as its
        # values. Pages with seqused_k read no key offsets (as the CPU's, which neither reads
        # nor checks cu_seqlens_k then): cu_seqlens_q stands in, B + 1 entries on q's device.
        starts = (cu_seqlens_q if paged and seqused_k is not None else cu_seqlens_k).contiguous()
        run_forward(Problem(packed(q, batch), *keys, packed(out, batch),
                            lse.unsqueeze(0).expand(batch, -1, -1), batch=batch,
                            q_len=longest_q, kv_len=capacity, scale=_scale(fn, scale, d),
                            causal=2 if causal else 0, window_left=left, window_right=right,
                            softcap=softcap, alibi=alibi, sinks=sinks,
                            lengths=3 if seqused_k is not None else 2,
                            seq_q=cu_seqlens_q.contiguous(), seq_k=starts,
                            seq_used=None if seqused_k is None else seqused_k.contiguous(),
                            block_table=block_table,
                            block_m=block_m, block_n=block_n), fn)
    return out, lse


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=False,
                              window_size=(-1, -1), softcap=0.0, sinks=None, alibi_slopes=None,
                              scale=None, block_m=None, block_n=None, dropout_p=0.0,
                              dropout_seed=None, dropout_offset=0):
    """The gradients of attention_varlen (its options; out and lse (Hq, total_q) its
    results): (dq, dk, dv, dsinks), packed as q, k, v."""
    fn = "attention_varlen_backward"
    p = _varlen_problem(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, None, None, causal,
                        window_size, softcap, sinks, alibi_slopes, scale, out, block_m, block_n,
                        lse=lse if isinstance(lse, torch.Tensor) and lse.dim() == 2 else None)
    _with_dropout(fn, p, dropout_p, dropout_seed, dropout_offset)
    _check_gradient_inputs(fn, p, dout, out, lse, None, (q.size(1), q.size(0)),
                           packed_shape=tuple(q.shape))
    grads = tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dsinks = None
    if p.batch > 0:
        dsinks = run_backward(p, packed(dout, p.batch), None,
                              *(packed(g, p.batch) for g in grads))
    elif sinks is not None:
        dsinks = torch.zeros(sinks.shape, dtype=torch.float32, device=q.device)
    return grads + (dsinks,)


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                           block_table=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           sinks=None, alibi_slopes=None, scale=None, num_splits=0,
                           return_lse=False, block_m=None, block_n=None):
    """Attention of q against a KV cache after appending k and v in place
    (FlashAttention's flash_attn_with_kvcache, its layouts and meaning): q (B, Sq, Hq, D);
    k_cache, v_cache (B, S_cache, Hkv, D), or pages (num_blocks, block_size, Hkv, D) with
    block_table (B, pages per sequence) int32; k, v (B, S_new, Hkv, D) written at
    cache_seqlens[b] ... (int or (B,) int32; None: the whole cache). causal and the window
    are aligned bottom-right to each sequence's length after the append. num_splits: key
    splits (0: chosen from the problem and the GPU; 1: none). Returns out (B, Sq, Hq, D)
    and with return_lse the (B, Hq, Sq) float32 logsumexp. Every argument is checked before
    the append: a call that raises leaves the caches as they were. The tensors go to
    kvcache_attention as the operator's (B, H, S, D) views, and its messages count sizes
    there, as the CPU kernels' do; k and v are named k_new and v_new."""
    def view(t):  # (B, S, H, D) -> (B, H, S, D); anything else to the checks as it is
        return t.transpose(1, 2) if isinstance(t, torch.Tensor) and t.dim() == 4 else t

    left, right = window_pair("attention_with_kvcache", window_size)
    out, lse = kvcache_attention(view(q), view(k_cache), view(v_cache), view(k), view(v),
                                 cache_seqlens, block_table, causal, left, right, softcap, sinks,
                                 alibi_slopes, scale, num_splits, block_m, block_n)
    out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def kvcache_attention(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None,
                      block_table=None, causal=False, window_left=-1, window_right=-1,
                      softcap=0.0, sinks=None, alibi_slopes=None, scale=None, num_splits=0,
                      block_m=None, block_n=None):
    """The operator attention_kvcache on the GPU, its arguments as its schema has them
    (python/csrc/kv_ops.cpp): q (B, Hq, Sq, D); k_cache, v_cache (B, Hkv, S_cache, D), or
    pages (num_blocks, Hkv, block_size, D) with block_table; k_new, v_new (B, Hkv, S_new,
    D); any strides. Returns (out, lse): out (B, Hq, Sq, D) over (B, Sq, Hq, D) memory (the
    layout FlashAttention's callers read), lse (B, Hq, Sq) float32."""
    fn = "attention_with_kvcache"
    paged = block_table is not None
    cache_layout = "(num_blocks, Hkv, block_size, D)" if paged else "(B, Hkv, S_cache, D)"
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    check((k_new is None) == (v_new is None), fn,
          "k_new and v_new must be given together (or neither)")
    if k_new is not None:
        named += [("k_new", k_new), ("v_new", v_new)]
    _check_operands(fn, named, 4, {"q": "(B, Hq, Sq, D)", "k_cache": cache_layout,
                                   "v_cache": cache_layout, "k_new": "(B, Hkv, S_new, D)",
                                   "v_new": "(B, Hkv, S_new, D)"})
    b, hq, sq, d = q.shape
    hkv = k_cache.size(1)
    check(v_cache.shape == k_cache.shape, fn, f"v_cache must have k_cache's shape "
                                              f"{tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    _check_heads_and_dim(fn, hq, hkv, d, k_cache.size(3), v_cache.size(3), "k_cache", "v_cache")
    check(isinstance(num_splits, int) and num_splits >= 0, fn,
          f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    page = k_cache.size(2)
    if paged:
        capacity = _check_page_table(fn, block_table, b, "k_cache", page, q.device)
    else:
        check(k_cache.size(0) == b, fn,
              f"k_cache.size(0) (batch) must equal q.size(0) = {b}, got {k_cache.size(0)}")
        capacity = page
    new = 0
    if k_new is not None:
        expected = (b, hkv, k_new.size(2), d)
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            check(tuple(t.shape) == expected, fn, f"{name} must have shape (B, Hkv, S_new, D) "
                                                  f"= {expected}, got {tuple(t.shape)}")
        new = k_new.size(2)
        check(cache_seqlens is not None, fn,
              "k_new and v_new need cache_seqlens: the position at which to append")
        # the append writes the caches: they must be fit to be written (the CPU's rules)
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            check_no_self_overlap(fn, name, cache)
        check_disjoint(fn, "k_cache", k_cache, "v_cache", v_cache)
        for cache_name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            for new_name, rows in (("k_new", k_new), ("v_new", v_new)):
                check_disjoint(fn, cache_name, cache, new_name, rows)
    lengths = _cache_lengths(fn, cache_seqlens, b, q.device)
    check_lengths(fn, capacity=capacity, **{"q.size(2)": sq})
    left, right, softcap, sinks, alibi = check_variants(fn, q, window_left, window_right,
                                                        softcap, sinks, alibi_slopes, b)
    _check_cache_indices(fn, lengths, new, capacity, block_table,
                         k_cache.size(0) if paged else 0, page)
    if new > 0:
        _append(k_cache, v_cache, k_new, v_new, lengths, block_table, new)
    out = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    seq_k = None if lengths is None else (lengths + new).to(torch.int32)
    run_forward(Problem(q, k_cache, v_cache, out, lse, batch=b, q_len=sq, kv_len=capacity,
                        scale=_scale(fn, scale, d), causal=2 if causal else 0, window_left=left,
                        window_right=right, softcap=softcap, alibi=alibi, sinks=sinks,
                        lengths=0 if seq_k is None else 1, seq_k=seq_k,
                        block_table=block_table, num_splits=num_splits, block_m=block_m,
                        block_n=block_n), fn)
    return out, lse


def _check_page_table(fn, block_table, batch, cache_name, page, device,
                      batch_source="q.size(0)"):
    """block_table (batch, pages per sequence) int32 on q's device, pages of a multiple of
    PAGE_MULTIPLE keys (the cache named cache_name's size(2)); returns the keys a sequence
    can hold."""
    check(isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int32
          and block_table.dim() == 2, fn,
          "block_table must be an int32 tensor of shape (B, pages per sequence), got "
          f"{getattr(block_table, 'dtype', type(block_table).__name__)} "
          f"{tuple(getattr(block_table, 'shape', ()))}")
    check(block_table.size(0) == batch, fn, f"block_table.size(0) (batch) must equal "
                                            f"{batch_source} = {batch}, got {block_table.size(0)}")
    check(block_table.device == device, fn,
          f"block_table is on {block_table.device} but q is on {device}")
    check(page > 0 and page % PAGE_MULTIPLE == 0, fn,
          f"{cache_name}.size(2) (block_size, keys per page) must be a multiple of "
          f"{PAGE_MULTIPLE} with a block_table, got {page}")
    # the kernels step through a sequence's pages one int32 at a time
    check(block_table.stride(1) == 1 or block_table.size(1) <= 1, fn,
          f"block_table.stride(1) must be 1 (contiguous rows), got {block_table.stride(1)}")
    return block_table.size(1) * page


def _cache_lengths(fn, cache_seqlens, b, device):
    """cache_seqlens (an int, or a (B,) int32 tensor on q's device) as a (B,) int32 tensor;
    None stays None (the whole cache)."""
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)
    check(isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dtype == torch.int32
          and tuple(cache_seqlens.shape) == (b,), fn,
          f"cache_seqlens must be an int or an int32 tensor of shape ({b},), got "
          f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)} "
          f"{tuple(getattr(cache_seqlens, 'shape', ()))}")
    check(cache_seqlens.device == device, fn,
          f"cache_seqlens is on {cache_seqlens.device} but q is on {device}")
    return cache_seqlens


# Device types on which the cache indices are checked without a host synchronisation.
DEVICE_SIDE_CHECKS = ("cuda",)

# What the key lengths of a cache may be, by the argument that gives them: the rule a
# device-side check states. The words here and in the host's messages below are those of
# fattn's C++ checks (src/model/validate_kvcache.cpp, validate_varlen.cpp; the CUDA decode
# kernel's device-side checks, src/cuda/decode.cuh), so a bad entry reads the same on every
# device (tests/python/test_triton_cache.py compares them).
_LENGTH_RULES = {
    "cache_seqlens": "every cache_seqlens entry must be >= 0 and, with the new keys "
                     "(k_new.size(2)), fit the cache's capacity (k_cache.size(2), or "
                     "block_table.size(1) x block_size)",
    "seqused_k": "every seqused_k entry must be >= 0 and at most the keys its sequence has "
                 "(its rows in cu_seqlens_k, or block_table.size(1) x block_size)",
    "cu_seqlens_k": "every sequence's keys (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) must fit "
                    "its pages (block_table.size(1) x block_size)",
}


# A paged append's rule: the words of the CUDA decode kernel's device-side check.
_APPEND_RULE = ("two sequences append to one slot of a page (block_table): each new key of "
                "k_new needs a slot of its own")


def _table_rule(cache_name):
    rule = (f"every block_table entry a sequence uses must be a page of {cache_name} "
            f"(0 <= entry < {cache_name}.size(0)")
    if cache_name == "k_cache":
        rule += "; flash_attn_with_kvcache's cache_batch_idx entries are checked as these"
    return rule + ")"


def _length_message(lengths_name, n, length, new, room, paged):
    """The host's words for entry n of the lengths, which breaks its rule."""
    if lengths_name == "cache_seqlens":
        if length < 0:
            return f"cache_seqlens[{n}] must be >= 0, got {length}"
        return (f"cache_seqlens[{n}] + k_new.size(2) = {length} + {new} = {length + new} keys "
                f"exceed the cache's capacity of {room} keys per sequence ("
                + ("block_table.size(1) × block_size" if paged else "k_cache.size(2)") + ")")
    if lengths_name == "seqused_k":
        most = ("block_table.size(1) × block_size, the keys a sequence's pages hold" if paged
                else "its rows in cu_seqlens_k")
        return f"seqused_k[{n}] must be in [0, {room}] ({most}), got {length}"
    return (f"sequence {n} has {length} keys (cu_seqlens_k[{n + 1}] - cu_seqlens_k[{n}]), "
            f"more than its pages hold: block_table.size(1) × block_size = {room}")


def _check_cache_indices(fn, lengths, new, capacity, block_table, pages, page,
                         lengths_name="cache_seqlens", cache_name="k_cache"):
    """Every length within the cache (capacity: an int, or per sequence a tensor) and every
    page a sequence uses within the cache's `pages`, before anything is written. The checks
    run on the tensors' device. On CUDA their verdict stays there: torch._assert_async stops
    the stream with a device-side assert whose message states the rule, raised at the next
    synchronisation, and nothing queued after it (the append, the attention) runs; a decode
    step never waits for the GPU and can be captured in a CUDA graph. Elsewhere the verdict
    comes to the host in one read and the error names the entry too."""
    b = block_table.size(0) if block_table is not None else (
        lengths.numel() if lengths is not None else 0)
    length_bad = table_bad = None
    if lengths is not None:
        length_bad = (lengths < 0) | (lengths + new > capacity)
    if block_table is not None:
        used = (torch.full((b,), capacity, dtype=torch.int64, device=block_table.device)
                if lengths is None else lengths.to(torch.int64) + new)
        used = torch.minimum(used, torch.tensor(capacity, device=used.device))
        slots = torch.arange(block_table.size(1), device=block_table.device)
        in_use = slots.view(1, -1) * page < used.view(-1, 1)
        table_bad = ((block_table < 0) | (block_table >= pages)) & in_use
    slots_sorted = same_slot = None
    if block_table is not None and new > 0 and block_table.size(1) > 0:  # else no room at all
        slots_sorted, same_slot = _append_slots(lengths, new, capacity, block_table, page)
    rules = [(bad, rule) for bad, rule in ((length_bad, _LENGTH_RULES[lengths_name]),
                                           (table_bad, _table_rule(cache_name)),
                                           (same_slot, _APPEND_RULE))
             if bad is not None]
    if not rules:
        return
    if rules[0][0].device.type in DEVICE_SIDE_CHECKS:
        for bad, rule in rules:
            torch._assert_async(~bad.any(), f"fattn.triton.{fn}: {rule}")
        return
    if not any(torch.stack([bad.any() for bad, _ in rules]).tolist()):
        return
    if length_bad is not None and bool(length_bad.any()):
        n = int(length_bad.nonzero()[0, 0])
        room = int(capacity[n]) if isinstance(capacity, torch.Tensor) else capacity
        check(False, fn, _length_message(lengths_name, n, int(lengths[n]), new, room,
                                         block_table is not None))
    if bool(table_bad.any()):
        n, slot = (int(x) for x in table_bad.nonzero()[0])
        check(False, fn, f"block_table[{n}][{slot}] = {int(block_table[n, slot])} is outside "
                         f"[0, {pages}) ({cache_name}.size(0), the cache's pages), and sequence "
                         f"{n} uses that block")
    first = int(same_slot.nonzero()[0, 0])
    a, c = sorted(int(slots_sorted.indices[first + x]) // new for x in (0, 1))
    check(False, fn, f"sequences {a} and {c} both append to slots of page "
                     f"{int(slots_sorted.values[first]) // page} (block_table): the append "
                     "would write one key twice")


def _append_slots(lengths, new, capacity, block_table, page):
    """The cache slots (page · page size + position in the page) the appended keys of a
    paged append take, sorted (stably: .values, and .indices into the (B, new) keys), and
    where two keys take one, (B·new − 1,) bool (true at the first of each equal pair). A
    sequence whose length breaks its own rule takes no slot here (its length's error speaks
    for it)."""
    b = lengths.numel()
    fits = ((lengths >= 0) & (lengths.to(torch.int64) + new <= capacity)).view(b, 1)
    positions = lengths.to(torch.int64).view(b, 1) + torch.arange(new, device=lengths.device)
    positions = torch.where(fits, positions, 0)
    pages = torch.gather(block_table.to(torch.int64), 1, positions // page)
    outside = -1 - torch.arange(b * new, device=lengths.device).view(b, new)  # all distinct
    slots = torch.where(fits, pages * page + positions % page, outside)
    ordered = slots.flatten().sort(stable=True)
    return ordered, ordered.values[1:] == ordered.values[:-1]


def _append(k_cache, v_cache, k_new, v_new, lengths, block_table, new):
    """Writes k_new, v_new (B, Hkv, S_new, D) at positions lengths[b] + t of each sequence
    of the (B, Hkv, S_cache, D) caches, or of their pages (num_blocks, Hkv, block_size, D)."""
    b = k_new.size(0)
    positions = lengths.to(torch.int64).view(b, 1) + torch.arange(new, device=k_new.device)
    rows_k, rows_v = k_new.transpose(1, 2), v_new.transpose(1, 2)  # (B, S_new, Hkv, D)
    if block_table is None:
        batch = torch.arange(b, device=k_new.device).view(b, 1).expand(b, new)
        k_cache.transpose(1, 2)[batch, positions] = rows_k
        v_cache.transpose(1, 2)[batch, positions] = rows_v
    else:
        page = k_cache.size(2)
        pages = torch.gather(block_table.to(torch.int64), 1, positions // page)
        k_cache.transpose(1, 2)[pages, positions % page] = rows_k
        v_cache.transpose(1, 2)[pages, positions % page] = rows_v
