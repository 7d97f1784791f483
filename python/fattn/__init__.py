"""fattn — exact, IO-aware scaled-dot-product attention for PyTorch.

    import fattn
    out = fattn.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's semantics
    out = fattn.flash_attention(q, k, v, causal=True)                   # FlashAttention's
    out = fattn.attention_forward(Q, K, V)                              # [B, H, S, D] float32
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                        cache_seqlens=lens, causal=True)  # KV cache, in place
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)  # packed sequences
    out = fattn.flash_attn_func(q, k, v, dropout_p=0.1, causal=True)  # FlashAttention 2's names
    out, lse = torch.ops.fattn.attention(q, k, v, is_causal, causal_bottom_right, scale, impl)
    out = fattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)     # masks, and:
    out = fattn.flash_attention(q, k, v, window_size=(w, 0), softcap=30.0, sinks=sinks)

Optional modules, imported on use: ``fattn.transformers`` (a Hugging Face attention
backend), ``fattn.distributed`` (ring attention over torch.distributed), ``fattn.triton``
(a Triton cross-check kernel).

The operator ``torch.ops.fattn.attention`` is registered by the C++ extension ``fattn._C``
(built from the same sources as the C++ library), with a fake kernel for
``torch.compile`` and an autograd formula (``torch.ops.fattn.attention_backward``, the
fused CPU backward), so training works on the CPU. On the CPU it runs float32, bfloat16 and
float16 on ``torch.get_num_threads()`` threads of torch's own pool; float64 runs the float64
reference (for ``torch.autograd.gradcheck``). ``torch.ops.fattn.attention_kvcache`` (in-place
append, inference only) and ``torch.ops.fattn.attention_varlen`` (differentiable) back
FlashAttention's ``flash_attn_with_kvcache`` and ``flash_attn_varlen_func``
(``fattn.kvcache``).
``fattn.jit.load()`` builds the same sources with ``torch.utils.cpp_extension.load``
(under another operator namespace); ``python -m fattn.bench`` compares fattn with torch.
"""
import torch  # first: torch's libraries (and its OpenMP runtime) are loaded before ours

from . import _C  # registers torch.ops.fattn.attention and its CPU kernel
from . import _registry

_registry.register(_C.op_namespace)

from . import jit  # noqa: E402
from .functional import (  # noqa: E402
    attention_forward,
    backward_extra_bytes,
    dropout_mask,
    extra_bytes,
    flash_attention,
    flops,
    scaled_dot_product_attention,
)
from .flash_attn_interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .kvcache import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402

__version__ = _C.version()


def num_threads() -> int:
    """Threads the CPU operator uses: torch.get_num_threads() (set it with
    torch.set_num_threads)."""
    return _C.num_threads()


def release_cached_memory() -> None:
    """Frees the working memory fattn's CPU kernels keep between calls (one block, as large
    as the largest call's: the naive path's Sq×Sk buffer at its largest). The next call
    allocates afresh."""
    _C.release_cached_memory()


def best_cpu_isa() -> str:
    """The instruction set fattn's CPU kernels use on this machine for long sequences (amx,
    avx512, avx2, portable); with amx, sequences under 512 keys run avx512."""
    return _C.best_cpu_isa()


def forward_plan(q, k, v, is_causal: bool = False, causal_bottom_right: bool = False,
                 impl: str = "auto", kv_splits: int = 0) -> dict:
    """What fattn's CPU operator runs for attention(q, k, v) — q (B, Hq, Sq, D), k and v
    (B, Hkv, Sk, D), CPU tensors — on this machine, checked as the call would be: ``impl``
    (auto resolved), ``isa``, ``products`` and ``products_reason``, and ``decode``, where the
    decode kernel runs (few query rows against many keys), how it cuts and reads the call:
    ``scores`` ("direct", "transposed", "query_lanes"; "bf16_dot ..." on vdpbf16ps),
    ``reads_in_place``, ``key_tile``, ``rows`` (query rows per kv head), ``heads_per_item``,
    ``splits`` (key chunks), ``prefetch_tiles`` (how many key tiles ahead its software
    prefetch asks for; 0: none), ``prefetch_level`` (the cache level it fills: 1 L1, 2 L2;
    0: none), ``items`` and the ``reason`` for each; None otherwise."""
    return _C.forward_plan(q, k, v, is_causal, causal_bottom_right, impl, kv_splits)


def bf16_products() -> tuple[str, str]:
    """(products, reason): what bfloat16 inputs on avx512 multiply on in this process —
    "bf16_dot" (vdpbf16ps) or "fma" (widened to float32 FMAs) — and why: FATTN_CPU_BF16
    where set, else the faster of the two timed on one core at the first call (about
    5 ms; docs/16bit.md)."""
    return tuple(_C.bf16_products())


__all__ = [
    "scaled_dot_product_attention",
    "flash_attention",
    "attention_forward",
    "extra_bytes",
    "backward_extra_bytes",
    "flops",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "dropout_mask",
    "num_threads",
    "best_cpu_isa",
    "bf16_products",
    "forward_plan",
    "release_cached_memory",
    "jit",
    "__version__",
]
