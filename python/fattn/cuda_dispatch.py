"""The operators' CUDA kernels: each asks fattn.dispatch which GPU kernel runs its call.

The choice is fattn.dispatch's table (fattn/dispatch/table.json: per entry, architecture,
dtype, head dim and variants, the candidate kernels in order with the measurement behind
the order) and its verification records: the default is the first candidate that takes the
call and whose current machine code a GPU run verified on this architecture; where none is
verified the first that takes the call runs with a warning (FATTN_REQUIRE_VERIFIED=1: an
error), naming `python -m fattn.selftest`. `plan(...)` answers which kernel a call runs and
why without running it. Nothing falls back to torch: a call no GPU kernel covers raises
NotImplementedError naming what is missing.
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from . import dispatch
from ._layouts import empty_like_output

TRITON = "triton"
CUDA_CPP = "cuda_cpp"
CPP_IMPLS = ("fused", "naive", "reference")  # the C++ CUDA kernels a caller may name
# the operators' entry names -> the table's
ENTRIES = {"attention": "forward", "attention_varlen": "varlen", "attention_kvcache": "kvcache",
           "attention_backward": "backward", "attention_varlen_backward": "varlen_backward"}


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


def _cpp_by_name(entry: str, impl: str, attn_mask: bool) -> dispatch.Plan:
    """impl="fused"/"naive"/"reference": the C++ kernel by name (the forward only)."""
    if entry != "attention" or attn_mask:
        raise NotImplementedError(
            f"fattn: impl={impl!r} names a CUDA C++ kernel, which runs the forward without "
            f"attn_mask only (no KV cache or packed sequences); this call is "
            f"{entry}{' with attn_mask' if attn_mask else ''}: use impl='auto'")
    if not cpp_available():
        raise NotImplementedError(
            f"fattn: impl={impl!r} names a CUDA C++ kernel, but this build of fattn has no "
            "CUDA backend (build it where nvcc and a CUDA torch are installed)")
    return dispatch.Plan(impl, CUDA_CPP, False, None,
                         f"impl={impl!r} asks for the CUDA C++ kernel by name")


def plan(entry: str = "attention", impl: str = "auto", variants: bool = False,
         head_dim: int | None = None, dtype: torch.dtype | None = None,
         capability: tuple[int, int] | None = None, attn_mask: bool = False,
         window: tuple[int, int] | None = None, softcap: bool = False, alibi: bool = False,
         sinks: bool = False, warn: bool = False, dropout: bool = False,
         seqused_k: bool = False) -> dispatch.Plan:
    """The GPU kernel of an operator's call: entry "attention", "attention_kvcache",
    "attention_varlen", "attention_backward" or "attention_varlen_backward"; impl as the
    operator's; variants: the call has a window, softcap, ALiBi or sinks (give window,
    softcap, alibi, sinks for the exact ones; variants alone stands for a left window);
    head_dim, dtype and the device's compute capability (major, minor); dropout: dropout_p
    > 0; seqused_k: a varlen call's seqused_k given. Answers without a GPU (for capability
    (9, 0), say). warn: the once-per-process warning for an unverified kernel (what the
    operators do)."""
    if entry not in ENTRIES:
        raise ValueError(f"fattn: entry must be one of {', '.join(ENTRIES)}, got {entry!r}")
    if impl in CPP_IMPLS:
        return _cpp_by_name(entry, impl, attn_mask)
    if impl not in ("auto", TRITON, "decode") and impl not in dispatch.kernels():
        raise NotImplementedError(f"fattn: impl={impl!r} is not a CUDA implementation (auto, "
                                  f"triton, {', '.join(CPP_IMPLS)}, or a kernel of "
                                  f"fattn.dispatch's table)")
    if window is None:
        window = (0, -1) if variants and not (softcap or alibi or sinks) else (-1, -1)
    call = dispatch.Call(ENTRIES[entry], dispatch.dtype_name(dtype or torch.float16), head_dim,
                         dispatch.architecture_of(capability), tuple(window), softcap, alibi,
                         sinks, attn_mask, dropout=dropout, seqused_k=seqused_k)
    return _plan_cached(call, impl, warn)


@functools.lru_cache(maxsize=4096)
def _plan_cached(call: dispatch.Call, impl: str, warn: bool) -> dispatch.Plan:
    # a call's plan is a function of the call (the records are read once per process): the
    # operators ask it per call, so the host pays for it once per kind of call
    return dispatch.plan(call, impl, warn=warn)


def forget_plans() -> None:
    """After new verification records (fattn.selftest): plan again."""
    from . import _C
    _plan_cached.cache_clear()
    dispatch.records.reload()
    _C.forget_kvcache_plans()
    _told_cpp.clear()


_told_cpp: set[str] = set()  # the architectures whose verified kernels the C++ library has


def _tell_cpp_what_is_verified(capability) -> None:
    """The C++ library's Impl::automatic chooses among its own kernels by the same records as
    plan() (the user's own included), so that impl="auto" runs what the plan said; told once
    per architecture this process runs on."""
    arch = dispatch.architecture_of(capability)
    if arch in _told_cpp or not cpp_available():
        return
    from . import _C
    _told_cpp.add(arch)
    _C.set_cuda_verified_kernels(sorted(k for a in _told_cpp
                                        for k in dispatch.verified_cpp_kernels(a)))


def kvcache_planner(major, minor, dtype, head_dim, window_left, window_right, softcap, alibi,
                    sinks) -> str:
    """The kernel a kind of KV-cache call on CUDA runs: the C++ operator asks once per kind of
    call (python/csrc/kvcache_planner.hpp), since the verification records are read here."""
    return plan("attention_kvcache", head_dim=head_dim, dtype=getattr(torch, dtype),
                capability=(major, minor), window=(window_left, window_right), softcap=softcap,
                alibi=alibi, sinks=sinks, warn=True).kernel


# --- the operators' CUDA kernels -----------------------------------------------------------
def _plan_of(entry, impl, q, window_left, window_right, softcap, alibi_slopes, sinks,
             attn_mask=None, dropout_p=0.0, seqused_k=None):
    """The plan of an operator's call on q's device, warning where its kernel is unverified."""
    if q.is_cuda:
        _tell_cpp_what_is_verified(_capability(q))
    return plan(entry, impl, head_dim=q.size(-1), dtype=q.dtype, capability=_capability(q),
                attn_mask=attn_mask is not None, window=(window_left, window_right),
                softcap=softcap != 0.0, alibi=alibi_slopes is not None, sinks=sinks is not None,
                warn=True, dropout=dropout_p > 0.0, seqused_k=seqused_k is not None)


# The C++ operator's impl for a kernel the plan chose: its Impl::automatic runs the table's
# first C++ candidate, impl="fused" the mma.sync (float16/bfloat16) or TF32 (float32) ones.
_CPP_IMPL_OF = {"fused_mma": "fused", "fused_tf32x3": "fused", "fused_tf32": "fused"}


def _capability(q):
    """The compute capability of q's device (None for a CPU tensor: the glue's tests)."""
    return torch.cuda.get_device_capability(q.device) if q.is_cuda else None


def _triton():
    import fattn.triton  # imported on the first GPU call: triton is optional
    return fattn.triton


def attention(q, k, v, is_causal=False, causal_bottom_right=False, scale=None, impl="auto",
              attn_mask=None, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
              sinks=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0, ns="fattn"):
    """The CUDA kernel of <ns>::attention (the operator's schema; (B, H, S, D) views).
    Dropout runs on the Triton kernels (the C++ ones take none)."""
    chosen = _plan_of("attention", impl, q, window_left, window_right, softcap, alibi_slopes,
                      sinks, attn_mask, dropout_p)
    dropout = dict(dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset)
    if chosen.engine == CUDA_CPP and dropout_p == 0.0:
        cpp_impl = impl if impl in CPP_IMPLS else _CPP_IMPL_OF.get(chosen.kernel, "auto")
        return getattr(torch.ops, ns).cuda_attention(q, k, v, is_causal, causal_bottom_right,
                                                     scale, cpp_impl, window_left, window_right,
                                                     softcap, alibi_slopes, sinks)
    out = empty_like_output(q)
    _, lse = _triton().attention(q, k, v, attn_mask=attn_mask, causal=is_causal,
                                 causal_bottom_right=causal_bottom_right,
                                 window_size=(window_left, window_right), softcap=softcap,
                                 sinks=sinks, alibi_slopes=alibi_slopes, scale=scale,
                                 return_lse=True, out=out, **dropout)
    return out, lse


def attention_kvcache(q, k_cache, v_cache, k_new=None, v_new=None, cache_seqlens=None,
                      block_table=None, causal=False, scale=None, kv_splits=0, impl="auto",
                      window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                      sinks=None):
    """The Triton kernels of <ns>::attention_kvcache on CUDA: its arguments as they are
    (fattn.triton's kvcache_attention takes the operator's (B, H, S, D) views). Registered
    as <ns>::triton_attention_kvcache, which the C++ operator calls for what its decode
    kernel does not take, and as attention_kvcache itself in a build without the C++ one."""
    # the C++ operator asked its planner already (kvcache_planner); without it this is the
    # operator's CUDA kernel and plans (and warns) itself
    _plan_of("attention_kvcache", TRITON if cpp_available() and impl in ("auto", "decode")
             else impl, q, window_left, window_right, softcap, alibi_slopes, sinks)
    return _triton().kvcache_attention(q, k_cache, v_cache, k_new, v_new, cache_seqlens,
                                       block_table, causal, window_left, window_right, softcap,
                                       sinks, alibi_slopes, scale, int(kv_splits))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None,
                     impl="auto", window_left=-1, window_right=-1, softcap=0.0,
                     alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=None,
                     dropout_offset=0):
    """<ns>::attention_varlen on CUDA: packed (total, H, D) rows."""
    _plan_of("attention_varlen", impl, q, window_left, window_right, softcap, alibi_slopes, sinks,
             dropout_p=dropout_p)
    return _triton().attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                      window_size=(window_left, window_right), softcap=softcap,
                                      sinks=sinks, alibi_slopes=alibi_slopes, scale=scale,
                                      return_lse=True, dropout_p=dropout_p,
                                      dropout_seed=dropout_seed, dropout_offset=dropout_offset)


def attention_varlen_kvcache(q, k, v, cu_seqlens_q, cu_seqlens_k=None, seqused_k=None,
                             block_table=None, causal=False, scale=None, impl="auto",
                             window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                             sinks=None):
    """<ns>::attention_varlen_kvcache on CUDA: packed queries against pages or packed rows
    (the varlen row of the dispatch table: the Triton forward)."""
    _plan_of("attention_varlen", impl, q, window_left, window_right, softcap, alibi_slopes, sinks,
             seqused_k=seqused_k)
    return _triton().attention_varlen_kvcache(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                              block_table, causal=causal,
                                              window_left=window_left, window_right=window_right,
                                              softcap=softcap, sinks=sinks,
                                              alibi_slopes=alibi_slopes, scale=scale)


def attention_backward(dout, q, k, v, out, lse, dlse=None, is_causal=False,
                       causal_bottom_right=False, scale=None, impl="auto", attn_mask=None,
                       window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                       sinks=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0, ns="fattn"):
    """<ns>::attention_backward on CUDA: the C++ Hopper backward where it takes the call, else
    the Triton backward (both deterministic; dropout: Triton's); dq, dk, dv laid out as the
    operator lays out outputs like q, k, v."""
    chosen = _plan_of("attention_backward", "auto" if impl in CPP_IMPLS else impl, q,
                      window_left, window_right, softcap, alibi_slopes, sinks, attn_mask, dropout_p)
    if chosen.engine == CUDA_CPP and dropout_p == 0.0:
        return getattr(torch.ops, ns).cuda_attention_backward(
            dout, q, k, v, out, lse, dlse, is_causal, causal_bottom_right, scale, window_left,
            window_right, softcap, alibi_slopes, sinks)
    dq, dk, dv = (empty_like_output(t) for t in (q, k, v))
    _, _, _, dsinks = _triton().attention_backward(
        dout, q, k, v, out, lse, dlse, attn_mask=attn_mask, causal=is_causal,
        causal_bottom_right=causal_bottom_right, window_size=(window_left, window_right),
        softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes, scale=scale, dq=dq, dk=dk,
        dv=dv, dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset)
    if dsinks is None:
        dsinks = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsinks


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=False,
                              scale=None, impl="auto", window_left=-1, window_right=-1,
                              softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                              dropout_seed=None, dropout_offset=0):
    """<ns>::attention_varlen_backward on CUDA: packed (total, H, D) gradients."""
    _plan_of("attention_varlen_backward", impl, q, window_left, window_right, softcap,
             alibi_slopes, sinks, dropout_p=dropout_p)
    dq, dk, dv, dsinks = _triton().attention_varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=causal,
        window_size=(window_left, window_right), softcap=softcap, sinks=sinks,
        alibi_slopes=alibi_slopes, scale=scale, dropout_p=dropout_p, dropout_seed=dropout_seed,
        dropout_offset=dropout_offset)
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
               ("attention_varlen_kvcache", attention_varlen_kvcache),
               ("attention_backward", dense_backward),
               ("attention_varlen_backward", attention_varlen_backward)]
    # attention_kvcache's CUDA kernel is the C++ operator's where the extension is built with
    # the CUDA backend (python/csrc/kv_ops.cpp: the decode kernel, or Triton through
    # triton_attention_kvcache); elsewhere the Triton kernels directly.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::attention_kvcache", "CUDA"):
        kernels.append(("attention_kvcache", attention_kvcache))
    else:
        from . import _C
        _C.set_kvcache_planner(kvcache_planner)
    for name, fn in kernels:
        torch.library.register_kernel(f"{ns}::{name}", "cuda", fn)
