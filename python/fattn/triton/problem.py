"""The Triton path's model: a validated forward Problem, its schedule, and its launch.

Every entry point (attention, attention_varlen, attention_with_kvcache) checks its own
arguments, then describes the call as a Problem of (B, H, S, D) views and runs it through
run_forward: the tile configuration, GQA packing and key splits are decided here, once,
and the one kernel of forward.py is launched with the matching constexpr switches.
"""
from __future__ import annotations

import dataclasses
import math
import weakref

import torch
import triton

from . import forward as kernels
from .visibility import UNBOUNDED

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 256)  # inclusive; padded to a power of two inside the kernel
# One lane of the split combine per split, a power of two up to this (and one key tile each)
MAX_SPLITS = 128


class ArgumentError(ValueError, RuntimeError):
    """An invalid argument of a fattn.triton call; the message names it, what was expected
    and what was given. A RuntimeError as the C++ operators' errors are (and torch's and
    FlashAttention's for such inputs), and a ValueError."""


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Rows (queries, or query-head × query pairs when packed) and keys of one program's
    tile, and Triton's launch options (None: Triton's default)."""
    block_m: int
    block_n: int
    num_warps: int | None = None
    num_stages: int | None = None


def tile_config(head_dim: int, packed: bool, on_gpu: bool, block_m=None, block_n=None):
    """The tile sizes. Dense problems, D <= 128: 64 × 64 with Triton's default warps and
    stages — the configuration measured on an H100 (2026-11-26, float16, D = 128, S >= 4096:
    409-418 TFLOP/s, 1.2x SDPA flash). D > 128 halves the key tile (the accumulator's and
    the K/V tiles' registers; not yet measured). A packed decode tile has 16 rows (tl.dot's
    smallest M: the query heads of one kv head, e.g. 4 × Sq at GQA 4:1) and 64 keys (not
    yet measured). Under the interpreter the same sizes run (the numpy work per tile does
    not depend on them much); tests pass smaller ones to cover tile edges."""
    if packed:
        config = TileConfig(16, 64)
    elif head_dim > 128:
        config = TileConfig(64, 32)
    else:
        config = TileConfig(64, 64)
    return dataclasses.replace(config, block_m=block_m or config.block_m,
                               block_n=block_n or config.block_n)


@dataclasses.dataclass
class Problem:
    """One forward call as the kernel sees it. q, out: (B, Hq, Sq, D) views; k, v: (B, Hkv,
    Sk, D), or pages (num_blocks, Hkv, block_size, D) with block_table; varlen: B = 1 views
    of the packed rows with seq_q/seq_k the cu_seqlens. lse: (B, Hq, Sq) float32 view."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    batch: int                  # sequences
    q_len: int                  # queries per sequence (varlen: the longest)
    kv_len: int                 # keys per sequence (cache: its capacity; varlen: the longest)
    scale: float
    causal: int = 0             # 0 none, 1 top-left, 2 bottom-right
    window_left: int = -1
    window_right: int = -1
    mask: torch.Tensor | None = None     # (B, Hq, Sq, Sk) view (stride 0: broadcast)
    mask_source: torch.Tensor | None = None  # the caller's mask (keys the cover's cache)
    softcap: float = 0.0
    alibi: torch.Tensor | None = None    # (B|1, Hq) float32 (stride 0 over a broadcast batch)
    sinks: torch.Tensor | None = None    # (Hq,) float32
    lengths: int = 0            # 0 uniform, 1 seq_k = keys per sequence, 2 cu_seqlens,
    seq_q: torch.Tensor | None = None  # 3 cu_seqlens and seq_used keys (seqused_k)
    seq_k: torch.Tensor | None = None
    seq_used: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    dropout_p: float = 0.0      # attention dropout (dropout.py), its stream (seed, offset)
    dropout_seed: torch.Tensor | None = None  # (1,) int64 on the device
    dropout_offset: int = 0
    num_splits: int = 0         # 0: chosen here; 1: no split
    block_m: int | None = None
    block_n: int | None = None
    backward_tiles: tuple | None = None  # backward_tiles' `tiles` (benchmark sweeps)

    @property
    def q_heads(self):
        return self.q.size(1)

    @property
    def kv_heads(self):
        return self.k.size(1)

    @property
    def head_dim(self):
        return self.q.size(3)


def interpreted() -> bool:
    """Whether fattn's kernels run under Triton's interpreter (TRITON_INTERPRET=1 when
    triton was imported): the only way they take CPU tensors."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernels._forward_kernel, InterpretedFunction)


def check(condition: bool, fn: str, message: str) -> None:
    if not condition:
        raise ArgumentError(f"fattn.triton.{fn}: {message}")


def check_lengths(fn: str, **lengths) -> None:
    """Sequence lengths below the band's open ends (visibility.UNBOUNDED)."""
    for name, value in lengths.items():
        check(value < UNBOUNDED, fn, f"{name} must be below {UNBOUNDED}, got {value}")


def window_pair(fn: str, window_size) -> tuple[int, int]:
    """FlashAttention's window_size = (left, right) as the operator's window_left and
    window_right (checked by check_variants)."""
    try:  # indexing, not a generator: this runs on every call (~1 us less)
        if len(window_size) != 2:
            raise ValueError
        left, right = int(window_size[0]), int(window_size[1])
    except (TypeError, ValueError):
        raise ArgumentError(f"fattn.triton.{fn}: window_size must be a pair of ints (left, "
                            f"right), got {window_size!r}") from None
    return left, right


def check_variants(fn: str, q, window_left: int, window_right: int, softcap, sinks,
                   alibi_slopes, batch: int):
    """The window, softcap, sinks and alibi_slopes against q's heads (q.size(1): (B, Hq, S,
    D) and packed (total, Hq, D) alike); returns (window_left, window_right, softcap,
    sinks (Hq,) float32, alibi (B, Hq) with batch stride 0 for (Hq,) slopes)."""
    for name, value in (("window_left", window_left), ("window_right", window_right)):
        check(value >= -1, fn, f"{name} must be >= -1 (-1: unbounded), got {value}")
    # A window at least as long as any sequence (lengths are below UNBOUNDED) hides
    # nothing on its side: as UNBOUNDED, the band's int32 arithmetic cannot wrap.
    left, right = min(int(window_left), UNBOUNDED), min(int(window_right), UNBOUNDED)
    softcap = float(softcap)
    check(math.isfinite(softcap) and softcap >= 0.0, fn,
          f"softcap must be finite and > 0 (0: off), got {softcap:g}")
    hq = q.size(1)
    if sinks is not None:
        check(isinstance(sinks, torch.Tensor), fn,
              f"sinks must be a tensor of shape ({hq},), got {type(sinks).__name__}")
        check(tuple(sinks.shape) == (hq,), fn,
              f"sinks must have shape (query heads,) = ({hq},), got {tuple(sinks.shape)}")
        check(sinks.device == q.device, fn, f"sinks is on {sinks.device} but q is on {q.device}")
        sinks = sinks.detach().to(torch.float32).contiguous()
    if alibi_slopes is not None:
        check(isinstance(alibi_slopes, torch.Tensor), fn, "alibi_slopes must be a tensor")
        check(alibi_slopes.device == q.device, fn,
              f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
        check(alibi_slopes.dtype == torch.float32, fn,
              f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
        shape = tuple(alibi_slopes.shape)
        check(shape in ((hq,), (batch, hq)), fn,
              f"alibi_slopes must have shape (query heads,) = ({hq},) or (batch, query heads) "
              f"= ({batch}, {hq}), got {shape}")
        alibi_slopes = alibi_slopes.view(1, hq).expand(batch, hq) if len(shape) == 1 \
            else alibi_slopes
    return left, right, softcap, sinks, alibi_slopes


# --- the attn_mask's per-tile cover ---------------------------------------------------------
# 0: every pair of the tile hidden (the tile is skipped), 1: none changed (the mask is not
# read), 2: mixed. Computed once per mask and tile size, on the mask's device, over the mask
# as stored (a broadcast dim stays 1, its cover stride 0); kept for the next call with the
# same tensor object at the same version (a model's layers share one mask).
_COVER_CACHE: dict = {}
_COVER_CACHE_SIZE = 8


def mask_cover(mask: torch.Tensor, block_m: int, block_n: int, source=None) -> torch.Tensor:
    """(B, H, ceil(Sq/block_m), ceil(Sk/block_n)) int8 for a (B, H, Sq, Sk) mask view,
    stride 0 where the mask is broadcast. source: the caller's tensor the view was made of
    (its identity and version key the cache; default the view itself)."""
    source = mask if source is None else source
    key = (id(source), source._version, tuple(mask.shape), mask.stride(), block_m, block_n)
    hit = _COVER_CACHE.get(key)
    if hit is not None and hit[0]() is source:
        return hit[1]
    b, h, sq, sk = mask.shape
    stored = mask[tuple(slice(0, 1) if mask.stride(d) == 0 and mask.size(d) > 1 else slice(None)
                        for d in range(4))]
    if stored.dtype == torch.bool:
        visible, changed = stored, ~stored
    else:
        visible, changed = stored != float("-inf"), stored != 0
    # a dim the mask broadcasts (one row, or one key for all) is one tile of one element,
    # the same cover for every tile of the view
    rows = block_m if stored.size(2) > 1 else 1
    cols = block_n if stored.size(3) > 1 else 1
    tiles_m, tiles_n = triton.cdiv(stored.size(2), rows), triton.cdiv(stored.size(3), cols)
    pad = (0, tiles_n * cols - stored.size(3), 0, tiles_m * rows - stored.size(2))
    # padding: hidden and changed, so a partial tile is never called unchanged wrongly
    visible = torch.nn.functional.pad(visible, pad, value=False)
    changed = torch.nn.functional.pad(changed, pad, value=True)
    shape = (stored.size(0), stored.size(1), tiles_m, rows, tiles_n, cols)
    any_visible = visible.reshape(shape).any(dim=5).any(dim=3)
    any_changed = changed.reshape(shape).any(dim=5).any(dim=3)
    cover = torch.where(any_visible, 1 + any_changed.to(torch.int8), 0).to(torch.int8)
    # stride 0 where broadcast
    cover = cover.expand(b, h, triton.cdiv(sq, block_m), triton.cdiv(sk, block_n))
    if len(_COVER_CACHE) >= _COVER_CACHE_SIZE:
        _COVER_CACHE.pop(next(iter(_COVER_CACHE)))
    _COVER_CACHE[key] = (weakref.ref(source), cover)
    return cover


# --- scheduling --------------------------------------------------------------------------
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_splits(programs: int, key_tiles: int, device: torch.device) -> int:
    """Key splits for a call of `programs` tiles over at most `key_tiles` key tiles each:
    enough programs for two waves of the GPU's multiprocessors, at least 4 key tiles per
    split (FlashAttention 2's rule of thumb for split-KV; the GPU command measures decode
    beside cuDNN). One split on the CPU (the interpreter) and for calls that fill the GPU."""
    target = 2 * _multiprocessors(device)
    if programs >= target:
        return 1
    return max(1, min(triton.cdiv(target, programs), key_tiles // 4, MAX_SPLITS))


def _precision(p: Problem) -> tuple[str, bool]:
    """(tl.dot input precision for float32, upcast 16-bit products to float32)."""
    if not p.q.is_cuda:  # the interpreter: numpy products, float32 for 16-bit values
        return "ieee", p.q.dtype != torch.float32
    # float32: 3xTF32 (float32-level accuracy on tensor cores) unless torch allows TF32
    # for float32 matmuls, as fattn's CUDA C++ path decides
    return ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"), False


def launch_options(config: TileConfig) -> dict:
    """Triton's launch options of a tile configuration (those it leaves to Triton omitted)."""
    return {k: v for k, v in (("num_warps", config.num_warps),
                              ("num_stages", config.num_stages)) if v is not None}


def dropout_args(p: Problem, dummy) -> tuple:
    """The kernels' (SEED, offset, threshold, scale) of p's dropout (dummy: a pointer for
    SEED without dropout, never read)."""
    from .dropout import threshold_of
    if p.dropout_p == 0.0:
        return dummy, 0, 0, 1.0
    return (p.dropout_seed, int(p.dropout_offset), threshold_of(p.dropout_p),
            1.0 / (1.0 - p.dropout_p))


def run_forward(p: Problem, fn: str = "attention") -> None:
    """Launches the forward kernel (and the split combine) for a validated Problem,
    writing p.out and p.lse (fn: the entry point, for the words of an error)."""
    if p.out.numel() == 0:
        return
    check_head_offsets(fn, p, [("q", p.q), ("out", p.out), ("attn_mask", p.mask)],
                       [("k", p.k), ("v", p.v)])
    group = p.q_heads // p.kv_heads
    # GQA packing: the query heads of one kv head share a tile's K/V loads, where a tile of
    # queries alone would be mostly empty (decode); not with an attn_mask (its cover is per
    # head) nor for varlen (whose sequences have their own lengths)
    packed = (p.mask is None and p.lengths < 2 and p.dropout_p == 0.0 and group > 1
              and p.q_len * group <= 64
              and p.q_len < 16)
    config = tile_config(p.head_dim, packed, p.q.is_cuda, p.block_m, p.block_n)
    rows = p.q_len * group if packed else p.q_len
    tiles_m = triton.cdiv(rows, config.block_m)
    heads = p.kv_heads if packed else p.q_heads
    splits = p.num_splits
    if p.lengths >= 2 or p.mask is not None:
        splits = 1
    elif splits == 0:
        splits = choose_splits(tiles_m * p.batch * heads, triton.cdiv(p.kv_len, config.block_n),
                               p.q.device)
    splits = max(1, min(splits, MAX_SPLITS))
    precision, upcast = _precision(p)
    mask_kind, mask, cover = 0, p.mask, None
    if mask is not None:
        mask_kind = 1 if mask.dtype == torch.bool else 2
        cover = mask_cover(mask, config.block_m, config.block_n, p.mask_source)
    dummy = p.lse  # stands for the pointers a call does not use (never read)
    if splits > 1:
        o_part = torch.empty((splits,) + tuple(p.out.shape), dtype=torch.float32,
                             device=p.q.device)
        lse_part = torch.empty((splits,) + tuple(p.lse.shape), dtype=torch.float32,
                               device=p.q.device)
        o_dst, lse_dst = o_part[0], lse_part[0]
        o_split, lse_split = o_part.stride(0), lse_part.stride(0)
    else:
        o_dst, lse_dst, o_split, lse_split = p.out, p.lse, 0, 0

    def strides(t, n):
        return t.stride() if t is not None else (0,) * n

    # The kernel the GPU run verified (forward.py) where the call has no dropout and no
    # seqused_k; the one that takes them otherwise.
    full = p.dropout_p > 0.0 or p.lengths == 3
    extra = ((p.seq_used if p.seq_used is not None else dummy,) if full else ())
    kernel = kernels._forward_full_kernel if full else kernels._forward_kernel
    kernel[(tiles_m, p.batch * heads, splits)](
        p.q, p.k, p.v, o_dst, lse_dst,
        mask if mask is not None else dummy, cover if cover is not None else dummy,
        p.alibi if p.alibi is not None else dummy, p.sinks if p.sinks is not None else dummy,
        p.seq_q if p.seq_q is not None else dummy, p.seq_k if p.seq_k is not None else dummy,
        *extra, p.block_table if p.block_table is not None else dummy,
        *p.q.stride(), *p.k.stride(), *p.v.stride(), *o_dst.stride(), *lse_dst.stride(),
        o_split, lse_split, *strides(mask, 4), *strides(cover, 4), *strides(p.alibi, 2),
        p.block_table.stride(0) if p.block_table is not None else 0,
        p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim,
        p.k.size(2) if p.block_table is not None else 1, splits,
        float(p.scale), float(p.softcap) or 1.0, p.window_left, p.window_right,
        *(dropout_args(p, dummy) if full else ()),
        CAUSAL=p.causal, WINDOW=p.window_left >= 0 or p.window_right >= 0, MASK_KIND=mask_kind,
        SOFTCAP=p.softcap != 0.0, ALIBI=p.alibi is not None, SINKS_ON=p.sinks is not None,
        **(dict(DROPOUT=p.dropout_p > 0.0) if full else {}),
        LENGTHS=p.lengths, PAGED=p.block_table is not None, PACK_GQA=packed,
        SPLIT=splits > 1, PRECISION=precision, UPCAST=upcast,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_D=max(16, triton.next_power_of_2(p.head_dim)),
        **launch_options(config))
    if splits > 1:
        kernels._combine_kernel[(p.batch * p.q_heads * p.q_len,)](
            o_part, lse_part, p.out, p.lse, *o_part.stride(), *lse_part.stride(),
            *p.out.stride(), *p.lse.stride(), p.q_heads, p.q_len, p.head_dim, splits,
            SPLITS=triton.next_power_of_2(splits),
            BLOCK_D=max(16, triton.next_power_of_2(p.head_dim)))


# The backward's tiles per padded head dim (BLOCK_D): (dK/dV kernel, dQ kernel). The dK/dV
# program holds its keys' K, V, dK and dV (two float32 accumulators of BLOCK_N × BLOCK_D),
# so it takes more keys than queries, the dQ program the reverse. Chosen without a GPU
# (2026-11-28, triton 3.6, ptxas for sm_90a, float16): the largest tiles of the
# candidates compiled by `python -m fattn.triton.compile_check --backward-sweep` that use
# wgmma for every product and spill no register (at D = 128, 32 × 64 on 4 warps spilled
# 644 bytes; on 8 warps with 2 stages none). Not yet timed: `python -m fattn.bench --gpu
# --backward-tiles ...` sweeps candidates beside the default in one run.
BACKWARD_TILES = {
    64: (TileConfig(32, 128, num_warps=8, num_stages=3), TileConfig(64, 32, num_warps=4)),
    128: (TileConfig(32, 64, num_warps=8, num_stages=2),
          TileConfig(64, 32, num_warps=8, num_stages=3)),
    256: (TileConfig(16, 32, num_warps=8, num_stages=2),
          TileConfig(32, 32, num_warps=8, num_stages=2)),
}


# The dK/dV kernel's tiles with dropout (its Philox words in registers beside dK and dV):
# the default tiles spill there (ptxas for sm_90a, bfloat16, 2026-12-06: 16 bytes at D = 64,
# 108 at 128, 24 at 256); half the queries (or, at D = 256, the keys) per program spill
# none. The dQ kernel's tiles do not spill with dropout.
BACKWARD_DROPOUT_DKDV = {
    64: TileConfig(16, 128, num_warps=8, num_stages=3),
    128: TileConfig(16, 64, num_warps=8, num_stages=2),
    256: TileConfig(16, 16, num_warps=8, num_stages=2),
}


def backward_tiles(head_dim: int, block_m=None, block_n=None, tiles=None, dropout=False):
    """(dK/dV tile, dQ tile) for head_dim: BACKWARD_TILES' row of the padded head dim;
    block_m/block_n override both kernels' sizes (tests: tile edges), tiles =
    ((block_m, block_n, num_warps, num_stages) of dK/dV, the same of dQ) replaces them
    (benchmark sweeps)."""
    if tiles is not None:
        return tuple(TileConfig(*t) for t in tiles)
    padded = max(16, triton.next_power_of_2(head_dim))
    row = min(d for d in BACKWARD_TILES if d >= padded)
    dkdv, dq = BACKWARD_TILES[row]
    if dropout:
        dkdv = BACKWARD_DROPOUT_DKDV[row]
    return (dataclasses.replace(dkdv, block_m=block_m or dkdv.block_m,
                                block_n=block_n or dkdv.block_n),
            dataclasses.replace(dq, block_m=block_m or dq.block_m,
                                block_n=block_n or dq.block_n))


# Rows of one Δ program: a 64 × D tile of O and of dO (FlashAttention's preprocess tiles are
# 64-128 rows); a memory-bound pass, one read of each.
DELTA_ROWS = 64


def row_deltas(out, dout, dlse):
    """Δ = rowsum(dout ∘ out) − dlse, (B, H, S) float32 contiguous, from (B, H, S, D) views
    (_delta_kernel: no float32 copies of the 16-bit tensors)."""
    from . import backward as kernels_bwd
    b, h, s, d = out.shape
    delta = torch.empty((b, h, s), dtype=torch.float32, device=out.device)
    if delta.numel() == 0:
        return delta
    dlse_strides = dlse.stride() if dlse is not None else (0, 0, 0)
    kernels_bwd._delta_kernel[(triton.cdiv(s, DELTA_ROWS), b * h)](
        out, dout, dlse if dlse is not None else delta, delta, *out.stride(), *dout.stride(),
        *dlse_strides, *delta.stride(), h, s, d, HAS_DLSE=dlse is not None,
        BLOCK_M=DELTA_ROWS, BLOCK_D=max(16, triton.next_power_of_2(d)))
    return delta


# The kernels address a head as its index times the head stride in 32 bits (the batch and
# row offsets are 64-bit): tensors whose last head lies 2^31 elements in or further are
# refused rather than addressed wrongly. 64-bit head offsets changed the H200-verified
# kernels' machine code (fattn.dispatch.status) and spilled 28-40 bytes of registers in the
# dK/dV kernel's variants (fattn.triton.compile_check, sm_90): a change for a GPU run to
# measure.
_HEAD_OFFSET_LIMIT = 2 ** 31


def check_head_offsets(fn: str, p: Problem, query_side, key_side) -> None:
    """(name, tensor) pairs of (B, H, S, D)-shaped views of the query heads and of the kv
    heads: (H − 1) × stride(1) below _HEAD_OFFSET_LIMIT, or a stride Triton passes as 64
    bits anyway."""
    for pairs, heads in ((query_side, p.q.size(1)), (key_side, p.k.size(1))):
        for name, t in pairs:
            if t is None or t.dim() != 4 or t.size(1) < 2:
                continue
            stride = abs(t.stride(1))
            reach = stride * (heads - 1)
            check(stride >= _HEAD_OFFSET_LIMIT or reach < _HEAD_OFFSET_LIMIT, fn,
                  f"{name}'s heads lie {stride} elements apart: the Triton kernels address "
                  f"its {heads} heads in 32 bits (at most {_HEAD_OFFSET_LIMIT - 1} elements), "
                  f"and ({heads} - 1) × {stride} = {reach}; lay it out as (B, S, H, D) (heads "
                  "D elements apart)")


def run_backward(p: Problem, dout, dlse, dq, dk, dv):
    """dq, dk, dv (views shaped as p.q, p.k, p.v) of the forward Problem p, whose out and
    lse are the forward's results; returns the sinks' gradient (float32) or None."""
    from . import backward as kernels_bwd
    # Δ = rowsum(dO ∘ O) − dlse, float32, laid out as lse (packed sequences: (Hq, total)
    # behind a batch stride of 0)
    if p.lengths == 2:
        delta = row_deltas(p.out[0:1], dout[0:1], None).expand(p.batch, -1, -1)
        lse = p.lse[0].float().contiguous().unsqueeze(0).expand(p.batch, -1, -1)
    else:
        delta = row_deltas(p.out, dout, dlse)
        lse = p.lse.float().contiguous()
    dsinks = None
    if p.sinks is not None:  # −Σ_rows P_sink·Δ, P_sink = e^(sink − lse)
        rows = lse[0:1] if p.lengths == 2 else lse
        deltas = delta[0:1] if p.lengths == 2 else delta
        p_sink = torch.exp(p.sinks.view(1, -1, 1) - rows).nan_to_num(0.0)  # −inf − −inf
        dsinks = -(p_sink * deltas).sum(dim=(0, 2))
    if dq.numel() == 0 or p.k.size(2) == 0 or p.batch == 0:
        dq.zero_()
        dk.zero_()
        dv.zero_()
        return dsinks
    check_head_offsets("attention_backward", p,
                       [("q", p.q), ("dout", dout), ("dq", dq), ("attn_mask", p.mask)],
                       [("k", p.k), ("v", p.v), ("dk", dk), ("dv", dv)])
    precision, upcast = _precision(p)
    dkdv_tiles, dq_tiles = backward_tiles(p.head_dim, p.block_m, p.block_n, p.backward_tiles,
                                          dropout=p.dropout_p > 0.0)
    block_d = max(16, triton.next_power_of_2(p.head_dim))
    dummy = lse

    def variant_args(tiles):
        mask, cover = p.mask, None
        if mask is not None:
            cover = mask_cover(mask, tiles.block_m, tiles.block_n, p.mask_source)
        strides = (lambda t, n: t.stride() if t is not None else (0,) * n)
        return ((mask if mask is not None else dummy, cover if cover is not None else dummy,
                 p.alibi if p.alibi is not None else dummy,
                 p.seq_q if p.seq_q is not None else dummy,
                 p.seq_k if p.seq_k is not None else dummy),
                (*strides(mask, 4), *strides(cover, 4), *strides(p.alibi, 2)))

    common = dict(CAUSAL=p.causal, WINDOW=p.window_left >= 0 or p.window_right >= 0,
                  MASK_KIND=0 if p.mask is None else (1 if p.mask.dtype == torch.bool else 2),
                  SOFTCAP=p.softcap != 0.0, ALIBI=p.alibi is not None, LENGTHS=p.lengths,
                  DROPOUT=p.dropout_p > 0.0, PRECISION=precision, UPCAST=upcast, BLOCK_D=block_d)
    scalars = (p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, float(p.scale),
               float(p.softcap) or 1.0, p.window_left, p.window_right, *dropout_args(p, lse))
    pointers, strides = variant_args(dkdv_tiles)
    kernels_bwd._dkdv_kernel[(triton.cdiv(p.kv_len, dkdv_tiles.block_n), p.batch * p.kv_heads)](
        p.q, p.k, p.v, dout, lse, delta, dk, dv, *pointers,
        *p.q.stride(), *p.k.stride(), *p.v.stride(), *dout.stride(), *lse.stride(),
        *dk.stride(), *dv.stride(), *strides, *scalars,
        BLOCK_M=dkdv_tiles.block_m, BLOCK_N=dkdv_tiles.block_n, **common,
        **launch_options(dkdv_tiles))
    pointers, strides = variant_args(dq_tiles)
    kernels_bwd._dq_kernel[(triton.cdiv(p.q_len, dq_tiles.block_m), p.batch * p.q_heads)](
        p.q, p.k, p.v, dout, lse, delta, dq, *pointers,
        *p.q.stride(), *p.k.stride(), *p.v.stride(), *dout.stride(), *lse.stride(),
        *dq.stride(), *strides, *scalars,
        BLOCK_M=dq_tiles.block_m, BLOCK_N=dq_tiles.block_n, **common,
        **launch_options(dq_tiles))
    return dsinks
