"""Whether each engine takes a call: one answer per engine, asked by the dispatch table.

The C++ kernels' rules live in the C++ library (fattn::cuda_refusal: dtypes, head dims this
build compiled, the architectures each runs on, the variants it takes); Python asks the
extension and copies none of them. Triton's kernels take every call of the table's rows.
"""
from __future__ import annotations

import importlib.util

NO_CUDA_BACKEND = "this build of fattn has no CUDA backend (rebuild with -DFATTN_CUDA=ON)"


def triton_refusal(call) -> str:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    return ""


def cpp_refusal(kernel: str, call) -> str:
    """The C++ library's answer for one of its kernels (table.json's name)."""
    from .. import _C
    if not _C.with_cuda:
        return NO_CUDA_BACKEND
    major, minor = (int(call.architecture[3:-1]), int(call.architecture[-1])) \
        if call.architecture else (0, 0)
    return _C.cuda_refusal(kernel, call.entry, call.dtype, int(call.head_dim or 0), major, minor,
                           int(call.window[0]), int(call.window[1]), call.softcap, call.alibi,
                           call.sinks, call.attn_mask, call.allow_tf32)


NO_CPP_DROPOUT = "the C++ kernels take no dropout (the Triton ones do)"


def refusal(kernel: str, call) -> str:
    """"" where the kernel takes the call, else why not."""
    from . import kernels
    engine = kernels()[kernel]["engine"]
    if engine == "triton":
        return triton_refusal(call)
    return NO_CPP_DROPOUT if call.dropout else cpp_refusal(kernel, call)
