"""The forward benchmark of ``python -m fattn.bench``: fattn's fused and naive kernels, torch
SDPA and standard attention, shape by shape (see fattn.bench.cli for the sweeps and columns)."""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

import fattn

from .core import (FLOAT, element_size, fmt_bytes, meminfo_bytes, reference_rows, reps_for,
                   round_robin, standard_attention)

def runner(impl: str, q, k, v, causal: bool):
    if impl == "fattn_fused":
        return lambda: torch.ops.fattn.attention(q, k, v, causal, False, None, "fused")[0]
    if impl == "fattn_naive":
        return lambda: torch.ops.fattn.attention(q, k, v, causal, False, None, "naive")[0]
    if impl == "torch_sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if impl == "torch_standard":
        scale = 1.0 / math.sqrt(q.size(-1))
        return lambda: standard_attention(q, k, v, causal, scale)
    raise ValueError(impl)


def output_bytes(impl: str, b, h, sq, d, size: int = FLOAT) -> int:
    lse = b * h * sq * FLOAT if impl.startswith("fattn") else 0
    return b * h * sq * d * size + lse


def estimate_bytes(impl: str, q, k, v, causal: bool) -> int:
    """Memory one call allocates, inputs excluded (to decide whether it may run)."""
    b, h, sq, d = q.shape
    sk = k.size(2)
    out = output_bytes(impl, b, h, sq, d, q.element_size())
    if impl in ("fattn_fused", "fattn_naive"):
        return out + fattn.extra_bytes(q, k, v, causal, False, impl.split("_")[1])
    if impl == "torch_standard":  # scores and probabilities, live together; the mask
        return out + 2 * b * h * sq * sk * FLOAT + (sq * sk if causal else 0)
    # torch SDPA on the CPU (flash kernel): per-thread blocks and its logsumexp
    return 2 * out + b * h * sq * FLOAT + (64 << 20)


def check_rows(q, k) -> tuple[torch.Tensor, str]:
    b, h, sq, d = q.shape
    if b * h * sq * k.size(2) * d <= (1 << 31):
        return torch.arange(sq), "all"
    n = min(sq, 32)  # first, last and evenly spaced rows of every (b, h)
    return torch.unique(torch.linspace(0, sq - 1, n).round().long()), "sampled"


def bench_shape(sweep, b, h, s, d, causal, impls, args, peak_rss, rows_out):
    gen = torch.Generator().manual_seed(1234 + s + d + int(causal))
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(getattr(torch, args.dtype))
               for _ in range(3))
    rows, err_rows = check_rows(q, k)
    ref = reference_rows(q, k, v, causal, rows)
    flops = fattn.flops(b, h, s, s, d, "top_left" if causal else None)
    budget = 0.7 * meminfo_bytes("MemAvailable")
    results, fns, first, warm = {}, {}, {}, {}
    for impl in impls:
        base = {"impl": impl, "dtype": args.dtype, "B": b, "Hq": h, "Hkv": h, "Sq": s, "Sk": s,
                "D": d, "causal": causal, "causal_alignment": "top_left" if causal else "none",
                "sweep": sweep}
        need = estimate_bytes(impl, q, k, v, causal)
        if need > budget:
            results[impl] = dict(
                base, ms_median=None, ms_min=None, ms_max=None, gflops=None, max_abs_err=None,
                err_rows=None, extra_bytes=None, peak_rss_extra_bytes=None, reps=0,
                estimated_bytes=need,
                skipped=f"out of memory: needs ~{need / 2**30:.1f} GiB, "
                        f"{budget / 2**30:.1f} GiB allowed (70% of MemAvailable)")
            continue
        fn = fns[impl] = runner(impl, q, k, v, causal)
        t0 = time.perf_counter()
        out, peak = peak_rss.measure(fn)  # the first (warm-up) call: memory and error
        first[impl] = time.perf_counter() - t0
        err = (out[:, :, rows].double() - ref).abs().max().item()
        del out
        exact = (fattn.extra_bytes(q, k, v, causal, False, impl.split("_")[1])
                 if impl.startswith("fattn") else None)
        extra_rss = None if peak is None else max(
            0, peak - output_bytes(impl, b, h, s, d, element_size(args.dtype)))
        warm[impl] = dict(base, max_abs_err=None if math.isnan(err) else err, err_rows=err_rows,
                          extra_bytes=exact if exact is not None else extra_rss,
                          extra_bytes_method=("fattn::extra_bytes" if exact is not None
                                              else "peak_rss"),
                          peak_rss_extra_bytes=extra_rss, estimated_bytes=need, skipped=None)
    reps = reps_for(first.values(), args)
    times = {impl: [t * 1e3 for t in ts]
             for impl, ts in zip(fns, round_robin(list(fns.values()), reps))}
    for impl in fns:
        med = statistics.median(times[impl])
        results[impl] = dict(warm[impl], ms_median=med, ms_min=min(times[impl]),
                             ms_max=max(times[impl]), gflops=flops / (med * 1e6), reps=reps)
    ordered = [results[i] for i in impls]
    rows_out.extend(ordered)
    # fattn keeps its working memory between calls (the naive path's S×S buffer, GiBs at
    # large S): give it back before the next shape, so that its memory budget is real.
    fattn.release_cached_memory()
    print_row(sweep, b, h, s, d, causal, impls, results)
    return results


_header_printed = set()


def print_row(sweep, b, h, s, d, causal, impls, res):
    short = {"fattn_fused": "fused", "fattn_naive": "naive", "torch_sdpa": "sdpa",
             "torch_standard": "std"}
    key = (sweep, tuple(impls))
    if key not in _header_printed:
        _header_printed.add(key)
        cols = ["B", "H", "S", "D", "causal"] + [f"{short[i]} ms" for i in impls]
        cols += ["fused GF/s"] + [f"fused vs {short[i]}" for i in impls if i != "fattn_fused"]
        if "torch_sdpa" in impls and "torch_standard" in impls:
            cols.append("sdpa vs std")
        cols += [f"{short[i]} mem" for i in impls] + [f"{short[i]} err" for i in impls]
        print(f"\n== {sweep}   (a vs b: b's median time / a's; above 1x, a is faster)")
        print("  ".join(f"{c:>11}" for c in cols))

    def ms(i):
        r = res.get(i)
        return None if r is None or r["ms_median"] is None else r["ms_median"]

    def ratio(a, c):
        return f"{ms(c) / ms(a):.2f}x" if ms(a) and ms(c) else "-"

    cells = [str(b), str(h), str(s), str(d), "yes" if causal else "no"]
    cells += [f"{ms(i):.2f}" if ms(i) is not None else "OOM-skip" for i in impls]
    fused = res.get("fattn_fused")
    cells.append(f"{fused['gflops']:.1f}" if fused and fused["gflops"] else "-")
    cells += [ratio("fattn_fused", i) for i in impls if i != "fattn_fused"]
    if "torch_sdpa" in impls and "torch_standard" in impls:
        cells.append(ratio("torch_sdpa", "torch_standard"))
    for i in impls:
        r = res[i]
        cells.append(fmt_bytes(r["extra_bytes"]) if not r["skipped"]
                     else "~" + fmt_bytes(r["estimated_bytes"]))
    for i in impls:
        e = res[i]["max_abs_err"]
        cells.append(f"{e:.1e}" if e is not None else "-")
    print("  ".join(f"{c:>11}" for c in cells), flush=True)


# The sweeps, named after their batch and head counts (the JSON's "sweep"): b2h8 is
# B=2, H=8, D 64 and 128, causal and not; b4h32 is B=4, H=32, D=64, non-causal.
SWEEPS = ("b2h8", "b4h32")


def sweeps(args):
    """(sweep, B, H, S, D, causal) tuples of --sweep (or --quick)."""
    if args.quick:
        return [("quick", 1, 2, s, 64, c) for c in (False, True) for s in (64, 128)]
    shapes = []
    if args.sweep in ("b2h8", "all"):
        for d in (64, 128):
            for c in (False, True):
                for s in args.b2h8_s:
                    shapes.append(("b2h8", 2, 8, s, d, c))
    if args.sweep in ("b4h32", "all"):
        for s in args.b4h32_s:
            shapes.append(("b4h32", 4, 32, s, 64, False))
    return shapes
