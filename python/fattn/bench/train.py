"""Forward + backward (a training step's attention) on the CPU: fattn vs PyTorch, side by
side in one process. Run as ``python -m fattn.bench --pass train``.

Implementations (the JSON's "impl"), each a forward and the backward of a random dout
through torch.autograd.grad (q, k, v require grad; no parameter update):
  fattn_fused     torch.ops.fattn.attention(impl="fused") and its fused backward
  fattn_naive     impl="naive": 3-stage forward, 4-stage backward through P and dS
  torch_sdpa      F.scaled_dot_product_attention (torch's CPU flash kernels, fwd + bwd)
  torch_standard  matmul -> softmax -> matmul under autograd (S, P kept for backward)
FLOPs: the forward's 4·D per visible (query, key) pair, times 3.5 (backward = 2.5×
forward: dV, dP, dQ, dK GEMMs plus the recomputed scores, as FlashAttention-2 counts it).
Extra memory: the rise of peak RSS over one forward + backward call, less the tensors it
returns (out, dq, dk, dv) — everything the call allocated and freed, autograd's saved
tensors included. fattn also reports its exact working memory (fattn::extra_bytes of the
forward and fattn::backward_extra_bytes; the larger, as one cached block serves both).
Error: max abs error of dq, dk, dv against float64 autograd of the plain formula (small
problems only; "-" above B·H·S²·D = 2^31).
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

import fattn
from .core import FLOAT, IMPLS, fmt_bytes, meminfo_bytes, reps_for, round_robin, standard_attention

SHORT = {"fattn_fused": "fused", "fattn_naive": "naive", "torch_sdpa": "sdpa",
         "torch_standard": "std"}
BACKWARD_FLOP_FACTOR = 2.5


def forward(impl, q, k, v, causal):
    if impl.startswith("fattn"):
        return torch.ops.fattn.attention(q, k, v, causal, False, None, impl.split("_")[1])[0]
    if impl == "torch_sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return standard_attention(q, k, v, causal, 1.0 / math.sqrt(q.size(-1)))


def step(impl, q, k, v, dout, causal):
    """One forward + backward; returns (dq, dk, dv)."""
    out = forward(impl, q, k, v, causal)
    return torch.autograd.grad(out, (q, k, v), dout)


def estimate_bytes(impl, b, h, s, d, causal):
    """Memory one step allocates beyond its inputs (to decide whether it may run)."""
    grads = 4 * b * h * s * d * FLOAT  # out, dq, dk, dv
    square = b * h * s * s * FLOAT
    if impl == "fattn_naive":  # forward scores, then P and dS
        return grads + 3 * square
    if impl == "torch_standard":  # S, P saved; dP, dS in the backward
        return grads + 4 * square + (s * s if causal else 0)
    return grads + (256 << 20)  # O(S) working memory


def reference_grads(q, k, v, dout, causal):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = standard_attention(q, k, v, causal, 1.0 / math.sqrt(q.size(-1)))
    return torch.autograd.grad(out, (q, k, v), dout.double())


def bench_shape(b, h, s, d, causal, impls, args, peak_rss, rows_out):
    gen = torch.Generator().manual_seed(4321 + s + d + int(causal))
    q, k, v, dout = (torch.randn(b, h, s, d, generator=gen).to(getattr(torch, args.dtype))
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    pairs = s * (s + 1) // 2 if causal else s * s
    flops = 4 * b * h * pairs * d * (1 + BACKWARD_FLOP_FACTOR)
    with_error = b * h * s * s * d <= (1 << 31)
    ref = reference_grads(q, k, v, dout, causal) if with_error else None
    budget = 0.7 * meminfo_bytes("MemAvailable")
    results, first = {}, {}
    for impl in impls:
        base = {"impl": impl, "pass": "forward+backward", "dtype": args.dtype, "B": b, "Hq": h,
                "Hkv": h, "Sq": s, "Sk": s, "D": d, "causal": causal,
                "causal_alignment": "top_left" if causal else "none", "flops": flops,
                "sweep": "train"}
        need = estimate_bytes(impl, b, h, s, d, causal)
        if need > budget:
            results[impl] = dict(base, ms_median=None, gflops=None, skipped=(
                f"out of memory: needs ~{need / 2**30:.1f} GiB, {budget / 2**30:.1f} GiB "
                "allowed (70% of MemAvailable)"), estimated_bytes=need)
            continue
        t0 = time.perf_counter()
        grads, peak = peak_rss.measure(lambda: step(impl, q, k, v, dout, causal))
        first[impl] = time.perf_counter() - t0
        err = (max((g.double() - r).abs().max().item() for g, r in zip(grads, ref))
               if ref is not None else None)
        del grads
        returned = 4 * b * h * s * d * q.element_size()
        exact = None
        if impl.startswith("fattn"):
            name = impl.split("_")[1]
            exact = max(fattn.extra_bytes(q, k, v, causal, False, name),
                        fattn.backward_extra_bytes(q, k, v, causal, False, name))
        rss = None if peak is None else max(0, peak - returned)
        # fattn's working memory is cached between calls (a warm call's RSS does not
        # rise): its exact size is the figure; torch's is its peak RSS rise.
        results[impl] = dict(base, max_abs_err=err, skipped=None, estimated_bytes=need,
                             peak_rss_extra_bytes=rss,
                             extra_bytes=exact if exact is not None else rss,
                             extra_bytes_method=("fattn::extra_bytes, backward_extra_bytes"
                                                 if exact is not None else "peak_rss"))
    timed = [i for i in impls if i in first]
    reps = reps_for((first[i] for i in timed), args)
    calls = [lambda impl=impl: step(impl, q, k, v, dout, causal) for impl in timed]
    times = {impl: [t * 1e3 for t in ts] for impl, ts in zip(timed, round_robin(calls, reps))}
    for impl in timed:
        med = statistics.median(times[impl])
        results[impl].update(ms_median=med, ms_min=min(times[impl]), ms_max=max(times[impl]),
                             gflops=flops / (med * 1e6), reps=reps)
    rows_out.extend(results[i] for i in impls)
    fattn.release_cached_memory()  # as the forward benchmark: the next shape gets its whole budget
    print_row(b, h, s, d, causal, impls, results)


_printed = []


def print_row(b, h, s, d, causal, impls, res):
    if not _printed:
        _printed.append(True)
        cols = ["B", "H", "S", "D", "causal"] + [f"{SHORT[i]} ms" for i in impls]
        cols += ["fused GF/s"] + [f"fused vs {SHORT[i]}" for i in impls if i != "fattn_fused"]
        cols += [f"{SHORT[i]} mem" for i in impls] + [f"{SHORT[i]} err" for i in impls]
        print("\n== forward + backward   (a vs b: b's median time / a's; above 1x, a is "
              "faster; mem = extra memory: fattn's working memory (extra_bytes), torch's "
              "peak RSS rise less the returned tensors)")
        print("  ".join(f"{c:>11}" for c in cols))

    def ms(i):
        return res[i].get("ms_median")

    cells = [str(b), str(h), str(s), str(d), "yes" if causal else "no"]
    cells += [f"{ms(i):.2f}" if ms(i) else "OOM-skip" for i in impls]
    fused = res.get("fattn_fused", {})
    cells.append(f"{fused['gflops']:.1f}" if fused.get("gflops") else "-")
    cells += [f"{ms(i) / ms('fattn_fused'):.2f}x" if ms(i) and ms("fattn_fused") else "-"
              for i in impls if i != "fattn_fused"]
    cells += [fmt_bytes(res[i].get("extra_bytes") if i.startswith("fattn")
                        else res[i].get("peak_rss_extra_bytes")) for i in impls]
    cells += [f"{res[i]['max_abs_err']:.1e}" if res[i].get("max_abs_err") is not None else "-"
              for i in impls]
    print("  ".join(f"{c:>11}" for c in cells), flush=True)


def shapes(args):
    if args.quick:
        return [(1, 2, s, 64, c) for c in (False, True) for s in (64, 128)]
    return [(2, 8, s, d, c) for d in (64, 128) for c in (False, True) for s in args.train_s]


def run(args, peak_rss):
    """The training sweep; returns the result rows (bench.json's schema, "pass" added)."""
    impls = [i for i in args.impls if i in IMPLS]
    rows = []
    for shape in shapes(args):
        bench_shape(*shape, impls, args, peak_rss, rows)
    return rows
