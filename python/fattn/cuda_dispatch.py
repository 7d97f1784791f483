"""What runs fattn's operators on CUDA tensors: the dispatch table, in one place.

Two GPU implementations exist: the Triton kernels (fattn.triton: every variant, the KV
cache, packed sequences) and the CUDA C++ kernels of the library (src/cuda: the plain
forward, causal or not, when the extension is built with its CUDA backend). Per call:

  impl       call                                   runs            evidence
  auto       forward (causal or not; a window,      cuda_cpp        H200, 2026-11-28
             softcap, ALiBi or sinks; no           (fused_tma)     (results/h200/gpu/2026-11-28):
             attn_mask), float16 or bfloat16,                       fused_tma 406-520 TFLOP/s
             D = 128, compute capability 9.0,                       against Triton's 326-406 at
             the C++ TMA kernel built at D = 128                    S 4096-16384 (1.0-1.5x),
                                                                    plain and causal; the
                                                                    variants' instantiation
                                                                    is the same kernel
  auto       any other forward                      triton          H100, 2026-11-26
                                                                    (results/h100/2026-11-26):
                                                                    Triton 345-418 TFLOP/s,
                                                                    C++ fused 220-262, at every
                                                                    measured shape (D 64/128,
                                                                    S 4096-16384, causal both);
                                                                    H200: at D = 64 Triton
                                                                    331-345, fused_tma 296-308
  auto       forward without attn_mask, no triton   cuda_cpp        (the only one there; its
             installed                                              kernel must take the call)
  auto,      KV cache, float16 or bfloat16, head    cuda_cpp        not yet measured against
  decode     dim a multiple of 8 up to the          (decode,        Triton's decode; chosen
             largest of decode_head_dims(),         launched by     because it is launched
             16-byte rows                           the C++         from the C++ operator (a
                                                    operator)       call costs the host a few
                                                                    microseconds, Triton's
                                                                    ~0.1 ms: H200 2026-11-28,
                                                                    2 % of HBM at B = 1, 8k)
  auto       any other KV cache                     triton
  triton     any forward                            triton
  fused, naive, reference   forward without         cuda_cpp        (the C++ kernel by name;
                            attn_mask                               the variants on fused_tma
                                                                    and reference only)
  auto       backward, float16 or bfloat16, head    cuda_cpp        not yet measured; chosen
             dim up to 128, causal either           (the Hopper     for the cause of the
             alignment, windows, softcap, ALiBi,    backward,       Triton backward's wrong
             sinks, GQA; no attn_mask; compute      backward_tma)   D = 128 gradients on an
             capability 9.0                                         H200 (2026-11-28) and its
                                                                    0.45-0.55x cuDNN speed
  auto,      any other backward                     triton
  triton

`plan(...)` answers which one a call runs (and why) without running it; every CUDA kernel
registered below asks it. Nothing falls back to torch: a call no GPU implementation covers
raises NotImplementedError naming what is missing.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import torch

from ._layouts import empty_like_output

TRITON = "triton"
CUDA_CPP = "cuda_cpp"
CPP_IMPLS = ("fused", "naive", "reference")  # the C++ CUDA kernels a caller may name


@dataclasses.dataclass(frozen=True)
class Plan:
    kernel: str   # "triton" or "cuda_cpp"
    reason: str


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def cpp_available() -> bool:
    from . import _C
    return bool(_C.with_cuda)


def decode_head_dims() -> tuple[int, ...]:
    """The head dims the C++ CUDA decode kernel of this build is compiled for (empty without
    the CUDA backend); multiples of 8 up to the largest run on it."""
    from . import _C
    return tuple(_C.cuda_decode_head_dims())


def decode_takes(head_dim: int | None, dtype: torch.dtype | None) -> bool:
    """Whether the C++ decode kernel takes a KV-cache call of this head dim and dtype (the
    operator also asks it about the tensors' alignment: fattn::cuda_kvcache_refusal)."""
    dims = decode_head_dims()
    return (dtype in SIXTEEN_BIT and head_dim is not None and head_dim % 8 == 0
            and bool(dims) and head_dim <= dims[-1])


def tma_head_dims() -> tuple[int, ...]:
    """The head dims the C++ Hopper TMA kernel of this build is compiled for (empty without
    the CUDA backend or its sm_90a kernels)."""
    from . import _C
    return tuple(_C.cuda_tma_head_dims())


def backward_head_dims() -> tuple[int, ...]:
    """The head dims the C++ Hopper backward of this build is compiled for (empty without the
    CUDA backend or its sm_90a kernels); smaller ones run on the next one."""
    from . import _C
    return tuple(_C.cuda_backward_head_dims())


def backward_takes(head_dim: int | None, dtype: torch.dtype | None,
                   capability: tuple[int, int] | None, attn_mask: bool) -> bool:
    """Whether the C++ Hopper backward takes a backward of this head dim, dtype and device
    (fattn::cuda_backward_refusal's rule; every variant but attn_mask it takes)."""
    dims = backward_head_dims()
    return (dtype in SIXTEEN_BIT and head_dim is not None and bool(dims) and head_dim <= dims[-1]
            and capability is not None and tuple(capability) == TMA_CAPABILITY
            and not attn_mask)


# Where the C++ kernel beats Triton (the table above): the Hopper TMA kernel's measured head
# dim, 16-bit inputs, compute capability 9.0.
TMA_HEAD_DIMS = (128,)
TMA_CAPABILITY = (9, 0)
SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def plan(entry: str = "attention", impl: str = "auto", variants: bool = False,
         head_dim: int | None = None, dtype: torch.dtype | None = None,
         capability: tuple[int, int] | None = None, attn_mask: bool = False) -> Plan:
    """The GPU implementation of a call: entry "attention", "attention_kvcache",
    "attention_varlen" or "attention_backward"; impl as the operator's; variants: the call has
    a window, softcap, ALiBi or sinks (the C++ TMA kernel, the Hopper backward and the float64
    reference take them, the other C++ kernels a right window only); attn_mask: it has an
    attn_mask (no C++ kernel takes one); head_dim, dtype and the device's compute capability
    (major, minor), where known, choose between the kernels that can run a call. Answers
    without a GPU (CI asks it for capability (9, 0))."""
    dense = entry == "attention" and not attn_mask
    if impl in CPP_IMPLS:
        if not dense:
            raise NotImplementedError(
                f"fattn: impl={impl!r} names a CUDA C++ kernel, which runs the forward without "
                f"attn_mask only (no KV cache or packed sequences); this call is "
                f"{entry}{' with attn_mask' if attn_mask else ''}: use impl='auto'")
        if not cpp_available():
            raise NotImplementedError(
                f"fattn: impl={impl!r} names a CUDA C++ kernel, but this build of fattn has no "
                "CUDA backend (build it where nvcc and a CUDA torch are installed)")
        return Plan(CUDA_CPP, f"impl={impl!r} asks for the CUDA C++ kernel")
    if impl not in ("auto", TRITON, "decode"):
        raise NotImplementedError(f"fattn: impl={impl!r} is not a CUDA implementation (auto, "
                                  f"triton, {', '.join(CPP_IMPLS)})")
    if (entry == "attention_kvcache" and impl in ("auto", "decode") and cpp_available()
            and decode_takes(head_dim, dtype)):
        return Plan(CUDA_CPP, "the C++ decode kernel (src/cuda/decode.cuh), launched by the C++ "
                              "operator without a host synchronisation")
    if (entry == "attention_backward" and impl == "auto" and cpp_available()
            and backward_takes(head_dim, dtype, capability, attn_mask)):
        return Plan(CUDA_CPP, "the C++ Hopper backward (src/cuda/backward_tma.cuh): wgmma on TMA "
                              "tiles, deterministic (no atomics)")
    if (dense and impl == "auto" and head_dim in TMA_HEAD_DIMS and dtype in SIXTEEN_BIT
            and capability is not None and tuple(capability) == TMA_CAPABILITY
            and head_dim in tma_head_dims()):
        return Plan(CUDA_CPP, "the C++ Hopper kernel on TMA loads (fused_tma): 1.0-1.5x the "
                              "Triton kernel at D = 128 on an H200 (2026-11-28)"
                              + ("; its variants' instantiation" if variants else ""))
    if triton_available():
        return Plan(TRITON, "the Triton kernel: every variant, and faster than the C++ kernels "
                            "at every other shape measured (H100 2026-11-26, H200 2026-11-28)")
    if dense and impl == "auto" and cpp_available():
        return Plan(CUDA_CPP, "triton is not installed; the CUDA C++ kernels run the forward "
                              "without attn_mask")
    what = " with attn_mask" if attn_mask else " with variants" if variants else ""
    raise NotImplementedError(
        f"fattn: on CUDA, {entry}{what} runs on fattn's Triton kernels, and triton is not "
        "installed (pip install triton)")


# --- the operators' CUDA kernels -----------------------------------------------------------
def _has_variants(window_left, window_right, softcap, alibi_slopes, sinks) -> bool:
    return (window_left >= 0 or window_right >= 0 or softcap != 0.0
            or alibi_slopes is not None or sinks is not None)


def _capability(q):
    """The compute capability of q's device (None for a CPU tensor: the glue's tests)."""
    return torch.cuda.get_device_capability(q.device) if q.is_cuda else None


def _triton():
    import fattn.triton  # imported on the first GPU call: triton is optional
    return fattn.triton


def attention(q, k, v, is_causal=False, causal_bottom_right=False, scale=None, impl="auto",
              attn_mask=None, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
              sinks=None, ns="fattn"):
    """The CUDA kernel of <ns>::attention (the operator's schema; (B, H, S, D) views)."""
    chosen = plan("attention", impl, _has_variants(window_left, window_right, softcap,
                                                   alibi_slopes, sinks),
                  head_dim=q.size(-1), dtype=q.dtype,
                  capability=_capability(q),
                  attn_mask=attn_mask is not None)
    if chosen.kernel == CUDA_CPP:
        return getattr(torch.ops, ns).cuda_attention(q, k, v, is_causal, causal_bottom_right,
                                                     scale, impl, window_left, window_right,
                                                     softcap, alibi_slopes, sinks)
    out = empty_like_output(q)
    _, lse = _triton().attention(q, k, v, attn_mask=attn_mask, causal=is_causal,
                                 causal_bottom_right=causal_bottom_right,
                                 window_size=(window_left, window_right), softcap=softcap,
                                 sinks=sinks, alibi_slopes=alibi_slopes, scale=scale,
                                 return_lse=True, out=out)
    return out, lse


def attention_kvcache(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None,
                      block_table=None, causal=False, scale=None, kv_splits=0, impl="auto",
                      window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                      sinks=None):
    """The Triton kernels of <ns>::attention_kvcache on CUDA: its arguments as they are
    (fattn.triton's kvcache_attention takes the operator's (B, H, S, D) views). Registered
    as <ns>::triton_attention_kvcache, which the C++ operator calls for what its decode
    kernel does not take, and as attention_kvcache itself in a build without the C++ one."""
    plan("attention_kvcache", TRITON if impl in ("auto", "decode") else impl, True)
    return _triton().kvcache_attention(q, k_cache, v_cache, k_new, v_new, cache_seqlens,
                                       block_table, causal, window_left, window_right, softcap,
                                       sinks, alibi_slopes, scale, int(kv_splits))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None,
                     impl="auto", window_left=-1, window_right=-1, softcap=0.0,
                     alibi_slopes=None, sinks=None):
    """<ns>::attention_varlen on CUDA: packed (total, H, D) rows."""
    plan("attention_varlen", impl, True)
    return _triton().attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                      window_size=(window_left, window_right), softcap=softcap,
                                      sinks=sinks, alibi_slopes=alibi_slopes, scale=scale,
                                      return_lse=True)


def attention_backward(dout, q, k, v, out, lse, dlse=None, is_causal=False,
                       causal_bottom_right=False, scale=None, impl="auto", attn_mask=None,
                       window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                       sinks=None, ns="fattn"):
    """<ns>::attention_backward on CUDA: the C++ Hopper backward where it takes the call, else
    the Triton backward (both deterministic); dq, dk, dv laid out as the operator lays out
    outputs like q, k, v."""
    chosen = plan("attention_backward", "auto" if impl in CPP_IMPLS else impl,
                  _has_variants(window_left, window_right, softcap, alibi_slopes, sinks),
                  head_dim=q.size(-1), dtype=q.dtype,
                  capability=_capability(q),
                  attn_mask=attn_mask is not None)
    if chosen.kernel == CUDA_CPP:
        return getattr(torch.ops, ns).cuda_attention_backward(
            dout, q, k, v, out, lse, dlse, is_causal, causal_bottom_right, scale, window_left,
            window_right, softcap, alibi_slopes, sinks)
    dq, dk, dv = (empty_like_output(t) for t in (q, k, v))
    _, _, _, dsinks = _triton().attention_backward(
        dout, q, k, v, out, lse, dlse, attn_mask=attn_mask, causal=is_causal,
        causal_bottom_right=causal_bottom_right, window_size=(window_left, window_right),
        softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes, scale=scale, dq=dq, dk=dk,
        dv=dv)
    if dsinks is None:
        dsinks = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsinks


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=False,
                              scale=None, impl="auto", window_left=-1, window_right=-1,
                              softcap=0.0, alibi_slopes=None, sinks=None):
    """<ns>::attention_varlen_backward on CUDA: packed (total, H, D) gradients."""
    plan("attention_varlen", impl, True)
    dq, dk, dv, dsinks = _triton().attention_varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=causal,
        window_size=(window_left, window_right), softcap=softcap, sinks=sinks,
        alibi_slopes=alibi_slopes, scale=scale)
    if dsinks is None:
        dsinks = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsinks


def register(ns: str) -> None:
    """Registers the CUDA kernels of <ns>'s operators (the table above)."""
    def dense(*args, **kwargs):
        return attention(*args, **kwargs, ns=ns)

    def dense_backward(*args, **kwargs):
        return attention_backward(*args, **kwargs, ns=ns)

    kernels = [("attention", dense), ("triton_attention_kvcache", attention_kvcache),
               ("attention_varlen", attention_varlen),
               ("attention_backward", dense_backward),
               ("attention_varlen_backward", attention_varlen_backward)]
    # attention_kvcache's CUDA kernel is the C++ operator's where the extension is built with
    # the CUDA backend (python/csrc/kv_ops.cpp: the decode kernel, or Triton through
    # triton_attention_kvcache); elsewhere the Triton kernels directly.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::attention_kvcache", "CUDA"):
        kernels.append(("attention_kvcache", attention_kvcache))
    for name, fn in kernels:
        torch.library.register_kernel(f"{ns}::{name}", "cuda", fn)
