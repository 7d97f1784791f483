"""fattn's attention backend for vLLM's CPU build (vLLM v1's AttentionBackend interface).

Registered by ``fattn.vllm.register()`` in place of CPU_ATTN (vLLM's CPU platform selects
no other backend for non-MLA models). Per step and layer:

- ``do_kv_cache_update`` writes the step's new keys and values into vLLM's paged cache at
  ``slot_mapping`` (slot = page · block_size + offset), in place, as vLLM's
  reshape-and-cache does; negative slots (padding) are skipped.
- ``forward`` runs fattn's KV-cache operator (``torch.ops.fattn.attention_kvcache``) on
  the cache *where it lies*: the requests with one new token (decode, the front of the
  batch: the builder asks vLLM to order the batch decodes first) in one call,
  ``(num_decodes, Hq, 1, D)`` queries against their pages through vLLM's block table and
  sequence lengths; each request with more new tokens (a prompt, a chunk of chunked
  prefill, a prompt after a prefix-cache hit) in a call of its own, its queries causal
  bottom-right against all of its keys. Nothing is copied but the output rows into vLLM's
  output buffer.

The cache layout. vLLM gives each attention layer of a CPU worker one tensor
``(num_blocks, num_kv_heads, block_size, 2 · head_size)`` (KVCacheLayout LBHNC: the
logical ``[blocks, heads, tokens, content]`` page, contiguous): a cell per (page, head,
token) whose content is the token's key followed by its value, the layout vLLM's KV
interface defines and the one its CPU platform's ``pack_kv_cache`` reads from other
workers. fattn reads that layout as two strided views, no copies:

    k_cache = kv_cache[..., :D].transpose(1, 2)   # (num_blocks, block_size, Hkv, D)
    v_cache = kv_cache[..., D:].transpose(1, 2)   # strides (Hkv·N·2D, 2D, N·2D, 1)

CPU_ATTN instead repacks each page privately, by ISA: with its "vec" kernels (AVX-512/AVX2,
block sizes divisible by 32) the page's first half holds the keys transposed, ``[D][N]``,
the second the values ``[N][D]``; with "amx" (bfloat16 on AMX) the keys of each 32-token
group are VNNI-packed (pairs of head dims interleaved, ``[D/2][32][2]``); "vec16" another
order. The "vec" keys map onto fattn's strided cache too (head-dim stride N, token stride 1)
but every key tile is then staged through a buffer (fattn reads a key row in place only
when its head dims are contiguous), and the AMX packing is no strided view at all (its
interleaved pairs need a fifth dimension). So fattn writes and reads the layout as vLLM's
interface defines it; a cache written by CPU_ATTN is not readable by this backend, nor the
reverse (each process runs one backend; nothing outside the attention backend reads a
page's interior except NIXL's transfer for CPU_ATTN by name).

Variants from the model config: GQA/MQA (Hq a multiple of Hkv, no copies), sliding window
(``sliding_window`` = W: a query sees itself and the W − 1 keys before it, FlashAttention's
``(W − 1, 0)``), logits softcap, attention sinks (gpt-oss: per-head logits in the softmax
denominator), ALiBi slopes. float32, bfloat16, float16; the cache in the model's dtype.

Refused at backend selection (vLLM then names the reason): attention types other than
decoder (encoder, encoder-only, cross-attention), an fp8 KV cache, head sizes outside
16–256, block sizes that are not a multiple of 16, non-causal decoder attention, MLA
(vLLM's CPU platform gives MLA models its own backends; they are not overridden).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

import fattn  # noqa: F401  (registers torch.ops.fattn)
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout

from ..functional import sliding_window as sliding_window_of
from . import NAME

_MIN_HEAD, _MAX_HEAD = 16, 256


class FattnAttentionBackend(AttentionBackend):
    """vLLM's description of the backend: what it supports, its builder and impl."""

    # The cache is written by do_kv_cache_update, before forward (as CPU_ATTN).
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    # The cache in the model's dtype (fattn reads q and the cache in one dtype).
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]  # fattn's paged cache: a block size a multiple of 16

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type["FattnAttentionImpl"]:
        return FattnAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["FattnMetadataBuilder"]:
        return FattnMetadataBuilder

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return _MIN_HEAD <= head_size <= _MAX_HEAD

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Any layout's per-layer view has strides fattn could read; LBHNC (each page's
        # [H, N, C] contiguous) is the one CPU workers allocate, and the one tested.
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class FattnMetadata:
    """One step's batch, shared by every layer of a KV-cache group."""

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # (num_reqs + 1,) int32
    seq_lens: torch.Tensor         # (num_reqs,) int32: keys of each request after this step
    block_table: torch.Tensor      # (num_reqs, max_blocks) int32
    slot_mapping: torch.Tensor     # (num_tokens,) int64
    # Requests [0, num_decodes) have one new token each, at rows [0, num_decodes).
    num_decodes: int = 0
    # The other requests with new tokens: (request, first row, end row).
    chunks: list[tuple[int, int, int]] = field(default_factory=list)


class FattnMetadataBuilder(AttentionMetadataBuilder[FattnMetadata]):
    """Finds the batch's decode prefix and its longer requests once per step (on the
    host: vLLM's CPU worker keeps these tensors in host memory)."""

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # vLLM moves requests with at most this many new tokens to the front of the batch.
        self._init_reorder_batch_threshold(1)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> FattnMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor) or not m.causal:
            raise NotImplementedError("fattn's vLLM backend runs causal decoder attention "
                                      "only (got a non-causal batch)")
        starts = m.query_start_loc_cpu[: m.num_reqs + 1].tolist()
        num_decodes = 0
        while num_decodes < m.num_reqs and starts[num_decodes + 1] - starts[num_decodes] == 1 \
                and starts[num_decodes] == num_decodes:
            num_decodes += 1
        chunks = [(r, starts[r], starts[r + 1]) for r in range(num_decodes, m.num_reqs)
                  if starts[r + 1] > starts[r]]
        return FattnMetadata(
            num_actual_tokens=m.num_actual_tokens,
            num_reqs=m.num_reqs,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            num_decodes=num_decodes,
            chunks=chunks,
        )


class FattnAttentionImpl(AttentionImpl[FattnMetadata]):
    """One attention layer: writes its new keys and values into vLLM's cache and runs
    fattn's KV-cache operator on it."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"fattn's vLLM backend runs decoder attention only, "
                                      f"got attention type {attn_type!r}")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"fattn's vLLM backend keeps the KV cache in the "
                                      f"model's dtype, got kv_cache_dtype={kv_cache_dtype!r}")
        if num_heads % num_kv_heads:
            raise ValueError(f"fattn: {num_heads} query heads are not a multiple of "
                             f"{num_kv_heads} kv heads")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sliding_window = sliding_window
        self.window = sliding_window_of(sliding_window)  # (window_left, window_right)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.alibi_slopes = (None if alibi_slopes is None
                             else torch.tensor(alibi_slopes, dtype=torch.float32))
        if sinks is not None and sinks.shape[0] != num_heads:
            raise ValueError(f"fattn: sinks has {sinks.shape[0]} entries for {num_heads} "
                             "query heads")
        self.sinks = sinks  # the layer's parameter: read (as float32) after weight loading

    # -- the cache ---------------------------------------------------------------------
    def _pages(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's (num_blocks, Hkv, block_size, 2·D) cache as fattn's operator views of its
        keys and values, (num_blocks, Hkv, block_size, D) each, strided, no copies."""
        d = self.head_size
        if kv_cache.dim() != 4 or kv_cache.size(1) != self.num_kv_heads \
                or kv_cache.size(3) != 2 * d or kv_cache.stride(3) != 1:
            raise RuntimeError(f"fattn: expected vLLM's KV cache as (num_blocks, "
                               f"{self.num_kv_heads}, block_size, {2 * d}) with contiguous "
                               f"cells, got shape {tuple(kv_cache.shape)}, strides "
                               f"{kv_cache.stride()}")
        return kv_cache[..., :d], kv_cache[..., d:]

    def do_kv_cache_update(self, layer: torch.nn.Module, key: torch.Tensor,
                           value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """Writes key[t], value[t] (Hkv, D) into the cell of slot slot_mapping[t]:
        page slot // block_size, token slot % block_size; slots < 0 are padding."""
        if kv_cache.numel() == 0:
            return
        n = min(key.size(0), slot_mapping.numel())
        slots = slot_mapping[:n]
        key, value = key[:n], value[:n]
        if n and int(slots.min()) < 0:
            keep = slots >= 0
            slots, key, value = slots[keep], key[keep], value[keep]
        block_size = kv_cache.size(2)
        pages, offsets = slots // block_size, slots % block_size
        d = self.head_size
        # Advanced indices around a slice: the indexed view is (tokens, Hkv, D).
        kv_cache[pages, :, offsets, :d] = key.to(kv_cache.dtype)
        kv_cache[pages, :, offsets, d:] = value.to(kv_cache.dtype)

    # -- attention ---------------------------------------------------------------------
    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: FattnMetadata,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        """query (tokens, Hq, D); the step's keys and values are already in kv_cache;
        output (tokens, Hq, D) is written in place."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fattn's vLLM backend does not fuse output quantization")
        if attn_metadata is None:  # vLLM's profiling and warm-up runs
            return output
        if query.dtype != kv_cache.dtype:
            raise RuntimeError(f"fattn: query is {query.dtype} but the KV cache is "
                               f"{kv_cache.dtype}")
        k_pages, v_pages = self._pages(kv_cache)
        if self.sinks is not None and self.sinks.dtype != torch.float32:
            self.sinks = self.sinks.detach().to(torch.float32)
        m = attn_metadata
        op = torch.ops.fattn.attention_kvcache
        # The operator's fixed arguments: no append (k_new, v_new: None), causal bottom-right
        # to each request's length, fattn's automatic key splits and kernel choice, then
        # the variants.
        variants = (*self.window, self.logits_soft_cap, self.alibi_slopes, self.sinks)
        nd = m.num_decodes
        if nd:
            q = query[:nd].unsqueeze(2)  # (nd, Hq, 1, D)
            out, _ = op(q, k_pages, v_pages, None, None, m.seq_lens[:nd], m.block_table[:nd],
                        True, self.scale, 0, "auto", *variants)
            output[:nd].copy_(out.squeeze(2))
        for r, start, end in m.chunks:
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # (1, Hq, L, D)
            out, _ = op(q, k_pages, v_pages, None, None, m.seq_lens[r:r + 1],
                        m.block_table[r:r + 1], True, self.scale, 0, "auto", *variants)
            output[start:end].copy_(out[0].transpose(0, 1))
        return output
