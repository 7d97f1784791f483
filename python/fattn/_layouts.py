"""The operators' layouts and dtypes, one rule for every kernel of an operator: the C++ CPU
kernels (python/csrc/ops.cpp's empty_output, src/model/validate_kvcache.cpp), their fake
kernels (_registry.py) and the CUDA kernels (cuda_dispatch.py, fattn.triton)."""
from __future__ import annotations

import torch

# A paged KV cache's block_size (keys per page) is a multiple of this on every device: the
# CPU kernels' rule (src/model/validate_kvcache.cpp), held by fattn.triton too, so that one
# cache is valid on both.
PAGE_MULTIPLE = 16


def output_is_bshd(q: torch.Tensor) -> bool:
    """The layout rule of python/csrc/ops.cpp (empty_output): (B, S, H, D) memory when q's
    heads are closer in memory than its rows, else contiguous (B, H, S, D)."""
    return q.size(1) > 1 and q.size(2) > 1 and q.stride(1) < q.stride(2)


def empty_like_output(t):
    """An uninitialised tensor laid out as the C++ operator lays out an output like t."""
    b, h, s, d = t.shape
    if output_is_bshd(t):
        return t.new_empty((b, s, h, d)).transpose(1, 2)
    return t.new_empty((b, h, s, d))


def lse_dtype(q):
    """The logsumexp's dtype, also that of per-head values (sinks, ALiBi slopes) and
    their gradients: float32, float64 for float64 problems."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32
