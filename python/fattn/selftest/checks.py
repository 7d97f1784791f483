"""One case on one kernel: the kernel forced (fattn.triton's functions, or the C++
operators with an impl name), its outputs against the float64 definition, and the rule
that passes them: error <= 2 x torch's error in the dtype + a floor."""
from __future__ import annotations

import dataclasses
import math
import time
import traceback
import warnings
from contextlib import contextmanager

import torch

from fattn import dispatch

from .cases import SHORT, Case
from .definition import cache_definition, definition, packed_definition
from .environment import ON_GPU, architecture
from .inputs import INPUTS, Inputs, fresh_caches
from .routes import TRITON, only_verified

# Bits of mantissa after the leading one: an ulp at 1.0 is 2^-bits (tests/python/test_16bit).
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
# float32's floors and every logsumexp's: fattn.triton's tests' tolerances (test_triton.TOL,
# test_triton_backward.TOL), relative to max(1, the largest reference value).
FLOAT32_TOL = 2e-5
FLOAT32_GRAD_TOL = 5e-5


# --- the rule ----------------------------------------------------------------------------------
def floor(ref: torch.Tensor, dtype: torch.dtype, gradient: bool) -> float:
    """The absolute floor of the bound: an ulp of the dtype at the largest reference value
    (two for gradients); float32: fattn.triton's tests' tolerances."""
    top = ref.abs().max().item() if ref.numel() else 0.0
    if dtype == torch.float32:
        return (FLOAT32_GRAD_TOL if gradient else FLOAT32_TOL) * max(1.0, top)
    return (2.0 if gradient else 1.0) * top * 2.0 ** -MANTISSA_BITS[dtype]


def _max_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got.double() - ref.double()).abs().max().item() if ref.numel() else 0.0


def _ratio(err: float, bound: float) -> float:
    if not math.isfinite(err):
        return math.inf
    return err / bound if bound > 0 else (0.0 if err == 0 else math.inf)


def measure(got, exact, theirs, dtype, gradient=False) -> dict:
    """One output against the rule: error ≤ 2 × torch's error + floor."""
    if got is None or tuple(got.shape) != tuple(exact.shape):
        return {"error": math.inf, "ratio": math.inf,
                "why": f"shape {None if got is None else tuple(got.shape)}, expected "
                       f"{tuple(exact.shape)}"}
    err, err_torch = _max_error(got, exact), _max_error(theirs, exact)
    bound = 2.0 * err_torch + floor(exact, dtype, gradient)
    return {"error": err, "torch_error": err_torch, "bound": bound, "ratio": _ratio(err, bound)}


def measure_lse(got, exact, theirs) -> dict:
    """A logsumexp: -inf exactly where the reference's is, elsewhere the rule with
    fattn.triton's float32 tolerance as the floor."""
    finite = exact.isfinite()
    if got is None or tuple(got.shape) != tuple(exact.shape) or \
            not torch.equal(got.isfinite(), finite):
        return {"error": math.inf, "ratio": math.inf, "why": "shape or -inf rows differ"}
    got, exact, theirs = got[finite], exact[finite], theirs[finite]
    err, err_torch = _max_error(got, exact), _max_error(theirs, exact)
    bound = 2.0 * err_torch + floor(exact, torch.float32, False)
    return {"error": err, "torch_error": err_torch, "bound": bound, "ratio": _ratio(err, bound)}


@contextmanager
def tf32_mode(on: bool):
    """torch's float32 matmuls in TF32 or not: the C++ float32 kernels and fattn's Triton
    kernel follow it, and so does torch's own float32 computation of the bound."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


# --- the kernels, forced -------------------------------------------------------------------
def _triton():
    import fattn.triton  # imported on use: after TRITON_INTERPRET is settled
    return fattn.triton


def _flags(case: Case) -> dict:
    return {"window_left": case.window[0], "window_right": case.window[1],
            "softcap": case.softcap}


def _dropout(case: Case) -> dict:
    """The dropout arguments of fattn.triton's functions (none without dropout)."""
    return {"dropout_p": case.dropout, "dropout_seed": case.dropout_seed,
            "dropout_offset": 0} if case.dropout else {}


def forced_forward(kernel: str, impl: str | None, case: Case, inp: Inputs):
    """(out, lse) of the dense forward on the kernel."""
    causal, bottom_right = case.causal is not None, case.causal == "bottom_right"
    if dispatch.kernels()[kernel]["engine"] == TRITON:
        return _triton().attention(inp.q, inp.k, inp.v, attn_mask=inp.mask, causal=causal,
                                   causal_bottom_right=bottom_right, window_size=case.window,
                                   softcap=case.softcap, sinks=inp.sinks,
                                   alibi_slopes=inp.slopes, return_lse=True, **_dropout(case))
    with only_verified(kernel, architecture()):
        return torch.ops.fattn.cuda_attention(inp.q, inp.k, inp.v, causal, bottom_right, None,
                                              impl, *case.window, case.softcap, inp.slopes,
                                              inp.sinks)


def forced_varlen(kernel: str, impl: str | None, case: Case, inp: Inputs):
    if case.seqused:  # the packed keys as one page per sequence's rows, seqused_k the keys used
        packed = inp.packed
        return _triton().attention_varlen_kvcache(
            inp.q, inp.k, inp.v, packed.cu_q, packed.cu_k, packed.seqused, None,
            causal=case.causal is not None, window_left=case.window[0],
            window_right=case.window[1], softcap=case.softcap, sinks=inp.sinks,
            alibi_slopes=inp.slopes)
    return _triton().attention_varlen(inp.q, inp.k, inp.v, inp.packed.cu_q, inp.packed.cu_k,
                                      causal=case.causal is not None, window_size=case.window,
                                      softcap=case.softcap, sinks=inp.sinks,
                                      alibi_slopes=inp.slopes, return_lse=True, **_dropout(case))


def forced_kvcache(kernel: str, impl: str | None, case: Case, inp: Inputs):
    k_cache, v_cache = fresh_caches(case, inp)
    causal = case.causal is not None
    c = inp.cache
    if dispatch.kernels()[kernel]["engine"] == TRITON:
        return _triton().kvcache_attention(inp.q, k_cache, v_cache, c.k_new, c.v_new, c.lengths,
                                           c.block_table, causal, *case.window, case.softcap,
                                           inp.sinks, inp.slopes)
    return torch.ops.fattn.attention_kvcache(inp.q, k_cache, v_cache, c.k_new, c.v_new,
                                             c.lengths, c.block_table, causal, None, 0, impl,
                                             *case.window, case.softcap, inp.slopes, inp.sinks)


def forced_backward(kernel: str, case: Case, inp: Inputs, out, lse):
    """(dq, dk, dv, dsinks) on the kernel, given the forward's out and lse."""
    causal, bottom_right = case.causal is not None, case.causal == "bottom_right"
    if case.entry == "varlen_backward":
        return _triton().attention_varlen_backward(
            inp.dout, inp.q, inp.k, inp.v, out, lse, inp.packed.cu_q, inp.packed.cu_k,
            causal=causal, window_size=case.window, softcap=case.softcap, sinks=inp.sinks,
            alibi_slopes=inp.slopes, **_dropout(case))
    if dispatch.kernels()[kernel]["engine"] == TRITON:
        return _triton().attention_backward(
            inp.dout, inp.q, inp.k, inp.v, out, lse, attn_mask=inp.mask, causal=causal,
            causal_bottom_right=bottom_right, window_size=case.window, softcap=case.softcap,
            sinks=inp.sinks, alibi_slopes=inp.slopes, **_dropout(case))
    return torch.ops.fattn.cuda_attention_backward(inp.dout, inp.q, inp.k, inp.v, out, lse,
                                                   None, causal, bottom_right, None,
                                                   *case.window, case.softcap, inp.slopes,
                                                   inp.sinks)


def _synchronise():
    if ON_GPU:
        torch.cuda.synchronize()  # an asynchronous fault belongs to the case that caused it


# --- the checks ----------------------------------------------------------------------------
def check_forward(kernel: str, impl: str | None, case: Case, inp: Inputs) -> dict:
    """The dense forward, the packed one or the KV cache's: out and lse against the rule."""
    if case.entry == "forward":
        out, lse = forced_forward(kernel, impl, case, inp)
        references = [definition(inp.q, inp.k, inp.v, case, inp, exact)
                      for exact in (True, False)]
    elif case.entry == "varlen":
        out, lse = forced_varlen(kernel, impl, case, inp)
        references = [packed_definition(inp.q, inp.k, inp.v, case, inp, exact)
                      for exact in (True, False)]
    else:
        out, lse = forced_kvcache(kernel, impl, case, inp)
        references = [cache_definition(case, inp, exact) for exact in (True, False)]
    _synchronise()
    (ref, ref_lse), (theirs, their_lse) = references
    result = {"out": measure(out, ref, theirs, case.dtype),
              "lse": measure_lse(lse, ref_lse, their_lse)}
    if out.dtype != case.dtype:
        result["out"] = {"error": math.inf, "ratio": math.inf,
                         "why": f"out.dtype {out.dtype}, expected {case.dtype}"}
    return result


def _gradients(case: Case, inp: Inputs, exact: bool):
    """(out, lse, [dq, dk, dv(, dsinks)]) by autograd through the definition."""
    leaves = [t.detach().clone().requires_grad_() for t in (inp.q, inp.k, inp.v)]
    sinks = None
    if inp.sinks is not None:
        sinks = inp.sinks.detach().to(torch.float64 if exact else torch.float32)
        sinks.requires_grad_()
        leaves.append(sinks)
    with_sinks = dataclasses.replace(inp, sinks=sinks)
    if case.entry == "varlen_backward":
        out, lse = packed_definition(*leaves[:3], case, with_sinks, exact)
    else:
        out, lse = definition(*leaves[:3], case, with_sinks, exact)
    grads = torch.autograd.grad(out, leaves, inp.dout.to(out.dtype))
    return out.detach(), lse.detach(), list(grads)


def check_backward(kernel: str, impl: str | None, case: Case, inp: Inputs) -> dict:
    """dq, dk, dv (and dsinks) against the rule, given the float64 forward's out and lse
    (rounded as a forward returns them), and the same bits on a second run."""
    out, lse, exact = _gradients(case, inp, exact=True)
    _, _, theirs = _gradients(case, inp, exact=False)
    out = out.to(case.dtype)
    lse = lse.float()
    first = forced_backward(kernel, case, inp, out, lse)
    second = forced_backward(kernel, case, inp, out, lse)
    _synchronise()
    names = ["dq", "dk", "dv", "dsinks"][:len(exact)]
    result = {name: measure(got, ref, their, case.dtype, gradient=True)
              for name, got, ref, their in zip(names, first, exact, theirs)}
    same = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(first, second))
    result["same_bits_twice"] = {"equal": same, "ratio": 0.0 if same else math.inf}
    return result


CHECKS = {"forward": check_forward, "varlen": check_forward, "kvcache": check_forward,
          "backward": check_backward, "varlen_backward": check_backward}


def run_case(kernel: str, impl: str | None, case: Case) -> dict:
    """One case on one kernel: its measurements, passed or not, or the error it raised."""
    start = time.perf_counter()
    entry = {"kernel": kernel, "impl": impl, "case": case.name, "entry": case.entry,
             "dtype": SHORT[case.dtype], "tf32": case.tf32}
    try:
        with tf32_mode(case.tf32), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the unverified kernel's warning
            inp = INPUTS[case.entry](case)
            measured = CHECKS[case.entry](kernel, impl, case, inp)
    except Exception as e:  # the kernel's fault or the environment's: the report shows it
        entry.update(status="error", ratio=math.inf, error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc(limit=8)[-4000:])
    else:
        ratio = max(m["ratio"] for m in measured.values())
        entry.update(status="passed" if ratio <= 1.0 else "failed", ratio=ratio,
                     measurements=measured)
    entry["seconds"] = round(time.perf_counter() - start, 3)
    return entry
