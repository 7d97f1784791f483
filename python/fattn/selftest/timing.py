"""A kernel's speed on a GPU: TFLOP/s of its first forward or backward case at a larger
shape, beside torch's SDPA on the same tensors."""
from __future__ import annotations

import dataclasses
import warnings

import torch

from .cases import Case
from .checks import forced_backward, forced_forward, tf32_mode
from .._visibility import visible_pairs
from .environment import triton_unusable
from .inputs import Inputs, dense_inputs


TIMING_SHAPE = dict(batch=2, heads=16, seq=4096)
TIMING_RUNS = 5


def _milliseconds(fn) -> float:
    """The mean of a few timed runs after two untimed ones (the first compiles)."""
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(TIMING_RUNS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / TIMING_RUNS


def _sdpa_milliseconds(case: Case, inp: Inputs) -> float:
    """torch's SDPA on the same tensors (no variants: the plain or causal call)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal = case.causal is not None
    if case.entry == "forward":
        return _milliseconds(lambda: sdpa(inp.q, inp.k, inp.v, is_causal=causal))
    q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out = sdpa(q, k, v, is_causal=causal)
    return _milliseconds(lambda: torch.autograd.grad(out, (q, k, v), inp.dout,
                                                     retain_graph=True))


def timing_forward(case: Case, inp: Inputs):
    """The forward's out and lse for timing a backward: the Triton kernel called directly
    (the operator would ask for verification), else the operator's choice."""
    if not triton_unusable():
        return forced_forward("triton_forward", None, case, inp)
    return torch.ops.fattn.attention(inp.q, inp.k, inp.v, case.causal is not None,
                                     case.causal == "bottom_right", None, "auto", None,
                                     *case.window, case.softcap, inp.slopes, inp.sinks)


def time_kernel(kernel: str, impl: str | None, case: Case) -> dict:
    """TFLOP/s of the kernel on its first case's call at a larger shape, beside SDPA's
    (backward: 2.5 × the forward's products, FlashAttention's count)."""
    s, b, h = TIMING_SHAPE["seq"], TIMING_SHAPE["batch"], TIMING_SHAPE["heads"]
    big = dataclasses.replace(case, heads=h, kv_heads=h, q_lens=(s,) * b, k_lens=(s,) * b,
                              mask=False)
    with tf32_mode(big.tf32), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        inp = dense_inputs(big)
        pairs = visible_pairs(s, s, big.causal, big.window, inp.q.device).sum().item()
        flops = 4.0 * b * h * big.head_dim * pairs * (2.5 if big.entry == "backward" else 1.0)
        sdpa_pairs = s * (s + 1) / 2 if big.causal else s * s
        sdpa_flops = flops * sdpa_pairs / pairs
        if big.entry == "forward":
            ms = _milliseconds(lambda: forced_forward(kernel, impl, big, inp))
        else:
            out, lse = timing_forward(big, inp)
            ms = _milliseconds(lambda: forced_backward(kernel, big, inp, out, lse))
        sdpa_ms = _sdpa_milliseconds(big, inp)
    return {"case": big.name, "ms": ms, "tflops": flops / ms / 1e9,
            "sdpa_ms": sdpa_ms, "sdpa_tflops": sdpa_flops / sdpa_ms / 1e9}
