"""The attention variants on the CPU, each beside what it should cost: ``python -m fattn.bench
--variants``.

Rows (float32, or --dtype; fattn's fused kernel; all in one process, the calls of one row
alternating round-robin so that load from elsewhere hits all alike):
  mask_all_true   a boolean (B, 1, 1, S) mask of all True vs no mask: what reading a mask
                  costs (fattn: one byte compare per key tile; the tile is left unchanged)
  mask_padding    a boolean (B, 1, 1, S) padding mask hiding the last quarter of the keys:
                  fattn vs torch SDPA with the same mask
  window          window_size=(W, 0), causal: fattn's time vs the causal time scaled by
                  (visible pairs / causal pairs) — the same GFLOP/s on visible pairs
                  gives 1.0. torch has no window: beside it, torch SDPA with the (S, S)
                  boolean mask the window means (up to --torch-max-s keys; above, "-")
  softcap         softcap=30 vs the plain kernel
  alibi           ALiBi slopes (Hq) vs the plain kernel
  decode_window   one new token against a KV cache of --decode-s keys with window (W, 0)
                  vs the whole cache, scaled by (W+1)/Sk (flash_attn_with_kvcache)
Output: a table, and variants.json ({"machine": …, "results": […]}) in --out.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fattn
from .core import DTYPES, Contention, machine_info, round_robin


def timed(calls, reps, budget):
    """Median seconds of each call, run round-robin after one warm-up call each."""
    for c in calls:
        c()
    times = [[] for _ in calls]
    start = time.perf_counter()
    while len(times[0]) < reps[0] or (len(times[0]) < reps[1] and
                                       time.perf_counter() - start < budget):
        for t, one in zip(times, round_robin(calls, 1)):
            t.extend(one)
    return [statistics.median(t) for t in times]


def fused(q, k, v, causal=False, **variants):
    """fattn's fused kernel (causal: bottom-right, the window's alignment)."""
    return torch.ops.fattn.attention(q, k, v, causal, causal, None, "fused", **variants)[0]


def window_pairs(s, w):
    """Visible (query, key) pairs of causal attention with window (w, 0), Sq = Sk = s."""
    return sum(min(i, w) + 1 for i in range(s))


def rows(args):
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)

    def qkv(b, h, s, d):
        return [torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3)]

    reps = (args.min_reps, args.max_reps)
    for d in args.head_dims:
        b, h, s = 2, 8, args.mask_s
        q, k, v = qkv(b, h, s, d)
        ones = torch.ones(b, 1, 1, s, dtype=torch.bool)
        plain_t, masked_t = timed([lambda: fused(q, k, v), lambda: fused(q, k, v, attn_mask=ones)],
                                  reps, args.budget)
        yield dict(row="mask_all_true", B=b, H=h, S=s, D=d, fattn_s=masked_t,
                   baseline_s=plain_t, ratio=masked_t / plain_t, baseline="fattn, no mask")
        pad = torch.arange(s).view(1, 1, 1, s) < s - s // 4
        pad = pad.expand(b, 1, 1, s)
        ours, theirs = timed([lambda: fused(q, k, v, attn_mask=pad),
                              lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad)],
                             reps, args.budget)
        yield dict(row="mask_padding", B=b, H=h, S=s, D=d, fattn_s=ours, baseline_s=theirs,
                   ratio=theirs / ours, baseline="torch SDPA, same mask (speedup)")
        for name, kw in (("softcap", dict(softcap=30.0)),
                         ("alibi", dict(alibi_slopes=torch.exp2(-8 * torch.arange(1, h + 1) / h)))):
            plain_t, variant_t = timed([lambda: fused(q, k, v), lambda: fused(q, k, v, **kw)],
                                       reps, args.budget)
            yield dict(row=name, B=b, H=h, S=s, D=d, fattn_s=variant_t, baseline_s=plain_t,
                       ratio=variant_t / plain_t, baseline="fattn, plain")
    for s in args.window_s:
        b, h, d, w = 1, args.window_heads, 128, args.window
        q, k, v = qkv(b, h, s, d)
        calls = [lambda: fused(q, k, v, causal=True, window_left=w, window_right=0),
                 lambda: fused(q, k, v, causal=True)]
        mask = None
        if s <= args.torch_max_s:
            i = torch.arange(s).view(-1, 1)
            j = torch.arange(s).view(1, -1)
            mask = (j <= i) & (j >= i - w)
            calls.append(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        times = timed(calls, (1, 3), args.budget)
        predicted = times[1] * window_pairs(s, w) / (s * (s + 1) / 2)
        yield dict(row="window", B=b, H=h, S=s, D=d, W=w, fattn_s=times[0], baseline_s=predicted,
                   ratio=times[0] / predicted, causal_s=times[1],
                   torch_mask_s=times[2] if mask is not None else None,
                   baseline="causal time x visible/causal pairs")


def decode_rows(args):
    """One new token against a KV cache (B=1, Hq=32, Hkv=8, D=128): window (W, 0) vs the
    whole cache; at the same GB/s the ratio to (W+1)/Sk of the whole-cache time is 1."""
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(1)
    hq, hkv, d, w = 32, 8, 128, args.window
    for sk in args.decode_s:
        q = torch.randn(1, 1, hq, d, generator=g).to(dtype)
        k_cache, v_cache = (torch.randn(1, sk, hkv, d, generator=g).to(dtype) for _ in range(2))
        lens = torch.tensor([sk], dtype=torch.int32)

        def step(window):
            return fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                 causal=True, window_size=window)
        windowed, whole = timed([lambda: step((w, 0)), lambda: step((-1, -1))],
                                (args.min_reps, args.max_reps), args.budget)
        predicted = whole * min(sk, w + 1) / sk
        yield dict(row="decode_window", B=1, H=hq, S=sk, D=d, W=w, fattn_s=windowed,
                   baseline_s=predicted, ratio=windowed / predicted, whole_cache_s=whole,
                   baseline="whole-cache time x (W+1)/Sk")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench --variants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, few calls (CI)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--mask-s", type=int, default=2048, help="S of the mask/softcap/alibi rows")
    p.add_argument("--window", type=int, default=4096, help="W of the window rows")
    p.add_argument("--window-s", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--window-heads", type=int, default=4)
    p.add_argument("--decode-s", type=int, nargs="+", default=[65536],
                   help="KV-cache lengths of the decode_window rows (Sq = 1)")
    p.add_argument("--torch-max-s", type=int, default=8192,
                   help="longest S for torch's masked SDPA beside the window rows")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--budget", type=float, default=3.0)
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=15)
    p.add_argument("--out", default="fattn-bench-variants")
    args = p.parse_args(argv)
    if args.quick:
        args.head_dims, args.mask_s, args.window, args.window_s = [32], 256, 64, [384]
        args.decode_s = [1024]
        args.torch_max_s, args.budget, args.min_reps, args.max_reps = 384, 0.05, 2, 3
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    print(f"fattn {fattn.__version__} ({fattn.best_cpu_isa()}) vs torch {torch.__version__}, "
          f"{threads} threads; {args.dtype}; times in ms (median)", flush=True)
    print(f"{'row':<14} {'B':>2} {'H':>3} {'S':>6} {'D':>4} {'fattn':>10} {'baseline':>10} "
          f"{'ratio':>7}  baseline")
    contention = Contention()
    results = []
    with torch.inference_mode():
        for r in itertools.chain(rows(args), decode_rows(args)):
            r["dtype"] = args.dtype
            results.append(r)
            extra = ""
            if r["row"] == "decode_window":
                extra = f" (W={r['W']}; whole cache {r['whole_cache_s'] * 1e3:.2f} ms)"
            if r["row"] == "window":
                extra = f" (W={r['W']}; causal {r['causal_s'] * 1e3:.1f} ms" + (
                    f", torch SDPA with the window's mask {r['torch_mask_s'] * 1e3:.1f} ms)"
                    if r["torch_mask_s"] is not None else ")")
            print(f"{r['row']:<14} {r['B']:>2} {r['H']:>3} {r['S']:>6} {r['D']:>4} "
                  f"{r['fattn_s'] * 1e3:>10.2f} {r['baseline_s'] * 1e3:>10.2f} "
                  f"{r['ratio']:>7.3f}  {r['baseline']}{extra}", flush=True)
    machine = machine_info(threads, args, contention.result())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.json").write_text(json.dumps({"machine": machine, "results": results},
                                                  indent=1))
    print(f"\nwrote {out / 'variants.json'}")
    return 0
