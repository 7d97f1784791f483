"""A case's tensors: seeded draws on the device in the case's dtype, dense, packed or as KV
caches (contiguous, or paged in a shuffled order)."""
from __future__ import annotations

import dataclasses

import torch

from .cases import Case
from .environment import device


@dataclasses.dataclass
class Packed:
    """A varlen case's offsets: cu_q, cu_k (B + 1,) int32, and with seqused_k the keys each
    sequence uses (B,) int32."""
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    seqused: torch.Tensor | None = None


@dataclasses.dataclass
class Cache:
    """A kvcache case's caches and appends: the keys of each sequence before the append
    (keys, values: (B, capacity, Hkv, D)), k_new, v_new (B, Hkv, S_new, D) views or None,
    the lengths (B,) int32 and the block table of the shuffled pages (or None)."""
    keys: torch.Tensor
    values: torch.Tensor
    k_new: torch.Tensor | None
    v_new: torch.Tensor | None
    lengths: torch.Tensor
    block_table: torch.Tensor | None


@dataclasses.dataclass
class Inputs:
    """A case's tensors. Dense: q (B, Hq, Sq, D), k, v (B, Hkv, Sk, D) views of (B, S, H, D)
    memory; varlen: (total, H, D) with the offsets in `packed`; kvcache: q (B, Hq, Sq, D)
    view, k and v None, the caches in `cache`. The variants' tensors (sinks, ALiBi slopes,
    the boolean mask, dropout's keep: (B, Hq, Sq, Sk) bool, True where P survives) where the
    case has them."""
    q: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    dout: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    slopes: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    packed: Packed | None = None
    cache: Cache | None = None


class Draw:
    """Seeded N(0, 1) tensors on the device, rounded to the case's dtype."""

    def __init__(self, seed: int):
        self.g = torch.Generator(device=device()).manual_seed(seed)

    def __call__(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g, device=device()).to(dtype)


def _variant_tensors(case: Case, draw: Draw) -> dict:
    hq = case.heads
    slopes = 2.0 ** (-8.0 * torch.arange(1, hq + 1, device=device()) / hq) if case.alibi else None
    return {"sinks": draw(hq) if case.sinks else None,
            "slopes": None if slopes is None else slopes.float()}


def dense_inputs(case: Case) -> Inputs:
    draw = Draw(case.seed)
    b, sq, sk, d = len(case.q_lens), case.q_lens[0], case.k_lens[0], case.head_dim
    q = draw(b, sq, case.heads, d, dtype=case.dtype).transpose(1, 2)
    k, v = (draw(b, sk, case.kv_heads, d, dtype=case.dtype).transpose(1, 2) for _ in range(2))
    mask = draw(b, 1, sq, sk) > -0.5 if case.mask else None  # about 30 % of the pairs hidden
    return Inputs(q, k, v, dout=draw(b, sq, case.heads, d, dtype=case.dtype).transpose(1, 2),
                  mask=mask, keep=_keep(case, b, sq, sk), **_variant_tensors(case, draw))


def _keep(case: Case, b: int, sq: int, sk: int) -> torch.Tensor | None:
    """The mask fattn's kernels draw for the case's dropout stream (fattn.dropout_mask)."""
    if not case.dropout:
        return None
    import fattn
    return fattn.dropout_mask(b, case.heads, sq, sk, case.dropout, case.dropout_seed, 0).to(device())


def _offsets(lens) -> torch.Tensor:
    return torch.tensor([0] + list(lens), device=device()).cumsum(0).to(torch.int32)


def varlen_inputs(case: Case) -> Inputs:
    draw = Draw(case.seed)
    tq, tk, d = sum(case.q_lens), sum(case.k_lens), case.head_dim
    return Inputs(draw(tq, case.heads, d, dtype=case.dtype),
                  draw(tk, case.kv_heads, d, dtype=case.dtype),
                  draw(tk, case.kv_heads, d, dtype=case.dtype),
                  dout=draw(tq, case.heads, d, dtype=case.dtype),
                  keep=_keep(case, len(case.q_lens), max(case.q_lens), max(case.k_lens)),
                  packed=Packed(_offsets(case.q_lens), _offsets(case.k_lens),
                                torch.tensor(case.used_keys(), dtype=torch.int32,
                                             device=device()) if case.seqused else None),
                  **_variant_tensors(case, draw))


def _paged(logical: torch.Tensor, block_table: torch.Tensor, page: int) -> torch.Tensor:
    """(B, capacity, Hkv, D) rows laid into (pages, page, Hkv, D) through block_table."""
    b, capacity, hkv, d = logical.shape
    pages = torch.empty(int(block_table.max()) + 1, page, hkv, d, dtype=logical.dtype,
                        device=logical.device)
    pages[block_table.flatten().long()] = logical.reshape(-1, page, hkv, d)
    return pages


def kvcache_inputs(case: Case) -> Inputs:
    """Each sequence's cache rows past its length are noise the kernel must not read; pages
    in a shuffled order."""
    draw = Draw(case.seed)
    b, sq, hkv, d = len(case.k_lens), case.q_lens[0], case.kv_heads, case.head_dim
    unit = case.page or 16
    capacity = -(-(max(case.k_lens) + case.new_keys) // unit) * unit
    keys, values = (draw(b, capacity, hkv, d, dtype=case.dtype) for _ in range(2))
    block_table = None
    if case.page:
        order = torch.randperm(b * capacity // case.page, generator=torch.Generator().manual_seed(
            case.seed))
        block_table = order.view(b, -1).to(torch.int32).to(device())
    new = [draw(b, case.new_keys, hkv, d, dtype=case.dtype).transpose(1, 2)
           for _ in range(2)] if case.new_keys else [None, None]
    return Inputs(draw(b, sq, case.heads, d, dtype=case.dtype).transpose(1, 2), None, None,
                  cache=Cache(keys, values, new[0], new[1],
                              torch.tensor(case.k_lens, dtype=torch.int32, device=device()),
                              block_table),
                  **_variant_tensors(case, draw))


def fresh_caches(case: Case, inp: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches as the operator's (B, Hkv, S, D) or (pages, Hkv, page, D) views, new ones
    per run: the kernel appends into them."""
    if case.page:
        return tuple(_paged(t, inp.cache.block_table, case.page).transpose(1, 2)
                     for t in (inp.cache.keys, inp.cache.values))
    return tuple(t.clone().transpose(1, 2) for t in (inp.cache.keys, inp.cache.values))


INPUTS = {"forward": dense_inputs, "backward": dense_inputs, "varlen": varlen_inputs,
          "varlen_backward": varlen_inputs, "kvcache": kvcache_inputs}
