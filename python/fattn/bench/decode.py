"""Decode (short queries against a KV cache) on the CPU: fattn vs torch SDPA, side by side in
one process: ``python -m fattn.bench --decode`` (or ``python -m fattn.bench_decode``).

Each point: q (B, Hq, Sq, D) against a cache of Sk keys, k and v (B, Hkv, Sk, D) in
FlashAttention's (B, S, H, D) memory layout, float32 (or --dtype), causal bottom-right (the
new queries are the cache's last tokens); fattn through its operator (impl "auto": the
decode kernel for short queries), torch through F.scaled_dot_product_attention(enable_gqa=True) with the
bottom-right mask it needs for Sq > 1 (for Sq = 1 no mask), both on torch's threads.

Columns: median ms of each, the bytes of K and V a call must read, fattn's effective GB/s
and its share of the DRAM triad measured in the same run (a = b + s·c over 3 × 256 MiB,
24 bytes counted per element, as fattn-bench counts it), GFLOP/s (4·D per visible
(query, key) pair), fattn's working memory (fattn::extra_bytes), the speed-up, and the max
abs error of each against float64 on sampled rows. Output: a table, and --out DIR/decode.json.
--isa avx2 (avx512, amx, portable) runs fattn on that instruction set's kernels.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fattn

from .core import DTYPES, add_isa_argument, cpu_name, element_size, use_isa

TRIAD_MIB = 256


def triad_gbs(reps: int = 5) -> float:
    """STREAM triad a = b + s·c on torch's threads, best of reps, 24 bytes per element."""
    n = TRIAD_MIB * 2**20 // 8
    b, c = torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
    a = torch.empty_like(b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - t)
    return 24 * n / best / 1e9


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bottom_right_mask(sq: int, sk: int):
    """Query i sees keys j <= i + sk - sq (None when every query sees every key)."""
    if sq == 1:
        return None
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    return j <= i + (sk - sq)


def sampled_error(out, q, k, v, scale, rows) -> float:
    """Max abs error of out (B, Hq, Sq, D) against float64 on the sampled (b, h, i) rows."""
    group = q.size(1) // k.size(1)
    sk, sq = k.size(2), q.size(2)
    err = 0.0
    for b, h, i in rows:
        keys = sk - sq + i + 1
        s = (k[b, h // group, :keys].double() @ q[b, h, i].double()) * scale
        ref = torch.softmax(s, 0) @ v[b, h // group, :keys].double()
        err = max(err, (out[b, h, i].double() - ref).abs().max().item())
    return err


def bench_point(b, hq, hkv, d, sq, sk, reps, dtype="float32"):
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(b, sq, hq, d, generator=g).to(dt).transpose(1, 2)
    k = torch.randn(b, sk, hkv, d, generator=g).to(dt).transpose(1, 2)
    v = torch.randn(b, sk, hkv, d, generator=g).to(dt).transpose(1, 2)
    scale = d ** -0.5
    mask = bottom_right_mask(sq, sk)
    # Causal bottom-right for every Sq (with one query it sees every key, as with no mask).
    run_fattn = lambda: torch.ops.fattn.attention(q, k, v, True, True, None, "auto")[0]  # noqa: E731
    run_torch = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    fattn_ms, torch_ms = median_ms(run_fattn, reps), median_ms(run_torch, reps)
    rows = [(0, 0, sq - 1), (b - 1, hq - 1, 0), (b // 2, hq // 2, sq // 2)]
    kv_bytes = 2 * b * hkv * sk * d * element_size(dtype)
    pairs = sum(min(sk, sk - sq + i + 1) for i in range(sq))
    flops = 4 * b * hq * pairs * d
    return {
        "dtype": dtype, "B": b, "Hq": hq, "Hkv": hkv, "D": d, "Sq": sq, "Sk": sk,
        "causal": "bottom_right",
        "fattn_ms": fattn_ms, "torch_sdpa_ms": torch_ms, "speedup": torch_ms / fattn_ms,
        "kv_bytes": kv_bytes, "fattn_gbs": kv_bytes / fattn_ms / 1e6,
        "fattn_gflops": flops / fattn_ms / 1e6, "torch_gflops": flops / torch_ms / 1e6,
        "fattn_extra_bytes": fattn.extra_bytes(q, k, v, True, True),
        "fattn_max_abs_err": sampled_error(run_fattn(), q, k, v, scale, rows),
        "torch_max_abs_err": sampled_error(run_torch(), q, k, v, scale, rows),
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench_decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--heads", type=int, default=32, help="query heads Hq")
    p.add_argument("--kv-heads", type=int, nargs="+", default=[8, 32])
    p.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seq", type=int, nargs="+", default=[1, 4, 16], help="query lengths Sq")
    p.add_argument("--seq-kv", type=int, nargs="+",
                   default=[1024, 4096, 16384, 32768, 65536, 131072], help="cache lengths Sk")
    p.add_argument("--max-kv-gib", type=float, default=4.0,
                   help="skip points whose K and V exceed this many GiB")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="of q and the KV cache (the bandwidth counts its bytes)")
    p.add_argument("--threads", type=int, default=0, help="default: torch.get_num_threads()")
    p.add_argument("--quick", action="store_true", help="two tiny points (CI)")
    p.add_argument("--out", default="fattn-bench-py", help="output directory for decode.json")
    add_isa_argument(p)
    args = p.parse_args(argv)
    isa = use_isa(args.isa)
    if args.quick:
        args.batch, args.kv_heads, args.head_dim, args.seq, args.seq_kv = [1], [2], [64], [1, 4], [256]
        args.heads, args.reps = 8, 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    triad = triad_gbs(2 if args.quick else 5)
    print(f"fattn {fattn.__version__} ({isa}) vs torch {torch.__version__} SDPA, "
          f"{threads} threads each; {args.dtype}; DRAM triad {triad:.1f} GB/s (same run)", flush=True)
    print("| B | Hq | Hkv | D | Sq | Sk | K+V MiB | fattn ms | torch ms | speed-up | fattn GB/s | "
          "% triad | fattn GFLOP/s | extra KiB | err fattn | err torch |")
    print("| --- " * 16 + "|")
    results = []
    with torch.inference_mode():
        for b in args.batch:
            for hkv in args.kv_heads:
                for d in args.head_dim:
                    for sk in args.seq_kv:
                        if 2 * b * hkv * sk * d * element_size(args.dtype) > args.max_kv_gib * 2**30:
                            continue
                        for sq in args.seq:
                            r = bench_point(b, args.heads, hkv, d, sq, sk, args.reps, args.dtype)
                            r["pct_triad"] = 100 * r["fattn_gbs"] / triad
                            results.append(r)
                            print(f"| {b} | {args.heads} | {hkv} | {d} | {sq} | {sk} | "
                                  f"{r['kv_bytes'] / 2**20:.0f} | {r['fattn_ms']:.3f} | "
                                  f"{r['torch_sdpa_ms']:.3f} | {r['speedup']:.2f}x | "
                                  f"{r['fattn_gbs']:.1f} | {r['pct_triad']:.0f} % | "
                                  f"{r['fattn_gflops']:.0f} | {r['fattn_extra_bytes'] / 1024:.0f} | "
                                  f"{r['fattn_max_abs_err']:.1e} | {r['torch_max_abs_err']:.1e} |",
                                  flush=True)
    machine = {"device": "cpu", "cpu": cpu_name(),
               "isa": isa, "threads": threads, "bandwidth_gbs": triad,
               "torch": torch.__version__, "fattn": fattn.__version__,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps({"machine": machine, "decode": results}, indent=2))
    print(f"\nwrote {out / 'decode.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
