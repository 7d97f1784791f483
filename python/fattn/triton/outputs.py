"""What a tensor fattn.triton writes must be, when the caller gives it (out, dq, dk, dv, a
KV cache being appended to): its shape, dtype and device, no two of its elements at one
address, and no byte shared with a tensor the same call reads. The rules and their words
are the C++ library's (src/model/validate.cpp: expect_no_self_overlap, expect_disjoint),
so a bad destination reads the same on every device."""
from __future__ import annotations

import torch

from .problem import check


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses t's elements lie in."""
    size = t.element_size()
    low = high = 0
    for n, stride in zip(t.shape, t.stride()):
        if n == 0:
            return t.data_ptr(), t.data_ptr()
        reach = (n - 1) * stride * size
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return t.data_ptr() + low, t.data_ptr() + high + size


def check_no_self_overlap(fn: str, name: str, t: torch.Tensor) -> None:
    """No two index tuples of t at one address: sorted by stride, each dimension steps over
    everything the smaller ones span."""
    span = 1
    for d in sorted(range(t.dim()), key=lambda d: abs(t.stride(d))):
        if t.size(d) == 1:
            continue
        check(abs(t.stride(d)) >= span, fn,
              f"{name} has overlapping elements (stride({d}) = {t.stride(d)} is smaller than "
              f"the {span} elements its inner dimensions span)")
        span += abs(t.stride(d)) * (t.size(d) - 1)


def check_disjoint(fn: str, out_name: str, out: torch.Tensor, in_name: str,
                   t: torch.Tensor) -> None:
    if t is None or out.numel() == 0 or t.numel() == 0 or out.device != t.device:
        return
    (a0, a1), (b0, b1) = _extent(out), _extent(t)
    check(not (a0 < b1 and b0 < a1), fn,
          f"{out_name} must not overlap {in_name} (the kernels read inputs while writing "
          "outputs)")


def check_destination(fn: str, name: str, t, shape: tuple, dtype: torch.dtype,
                      device: torch.device, reads: list) -> None:
    """A tensor the call writes: `shape`, `dtype`, on `device`, its elements apart, and
    disjoint from every (name, tensor) of `reads`."""
    check(isinstance(t, torch.Tensor), fn, f"{name} must be a torch.Tensor, got "
                                           f"{type(t).__name__}")
    check(tuple(t.shape) == tuple(shape), fn, f"{name} must have shape {tuple(shape)}, got "
                                              f"{tuple(t.shape)}")
    check(t.dtype == dtype, fn, f"{name} must have dtype {dtype}, got {t.dtype}")
    check(t.device == device, fn, f"{name} is on {t.device} but q is on {device}")
    check_no_self_overlap(fn, name, t)
    for in_name, source in reads:
        check_disjoint(fn, name, t, in_name, source)
