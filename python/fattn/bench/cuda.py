"""fattn vs PyTorch SDPA on a GPU, side by side in one process: ``python -m fattn.bench_cuda``.

Implementations (the JSON's "impl"), each for every dtype it supports:
  fattn_naive       torch.ops.fattn.attention(impl="naive"): 3 kernels, Sq×Sk in HBM
  fattn_fused       impl="auto": 3xTF32 tensor cores (float32), mma.sync (float16, bfloat16)
  fattn_fused_tf32  float32 only: impl="auto" with torch.backends.cuda.matmul.allow_tf32 on,
                    which fattn honours (TF32 mode: Q·Kᵀ in TF32, P·V with V split)
  sdpa_flash        F.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION forced
  sdpa_efficient    ... EFFICIENT_ATTENTION
  sdpa_cudnn        ... CUDNN_ATTENTION
  sdpa_math         ... MATH (torch's unfused reference path)
A backend that rejects a dtype or shape is reported as skipped with torch's reason, not
replaced by another one.

Suites (Sq = Sk = S, Hq = Hkv = H, contiguous (B, H, S, D)):
  b2h8   B=2, H=8, D=64, S in {128, 512, 1024, 4096}, causal and not
  flash  FlashAttention's sweep at hidden 2048: D=64 × 32 heads and D=128 × 16 heads,
         S in {512, …, 16384}, B = 16384 / S, causal and not
  quick  tiny shapes (a smoke test; with --device cpu it runs without a GPU)

Method: CUDA-event timing of each call on the current stream; 2 warm-up calls; inputs
rotated over enough sets to cover 3× the L2 so that no call finds its data in L2; the
implementations alternate round-robin; median, min, max over the timed calls (adaptive
count, --budget seconds per implementation and shape). TFLOP/s counts 4·D FLOPs per
visible (query, key) pair. Peak memory: torch.cuda.max_memory_allocated over one call
less the memory before it (the call's own allocations: outputs, workspaces). Error: max
abs error of 8 sampled query rows against float64. Out-of-memory is caught and reported
("skipped"): where the naive path and the math backend run out of the GPU's memory.

Output: a table, and in --out DIR bench_cuda.json (fattn-bench's schema: {"machine":
{device, driver, cuda, torch_version, date, ...}, "results": [...]}) and bench_cuda.csv.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fattn
from .core import reference_rows

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_math": SDPBackend.MATH}
IMPLS = ("fattn_naive", "fattn_fused", "fattn_fused_tf32") + tuple(SDPA_BACKENDS)
# The suites (the JSON's "suite"; see Suites above).
SUITES = ("b2h8", "flash", "quick")
L2_COVER = 3          # input sets span this many L2 sizes
ERROR_ROWS = 8        # sampled query rows checked against float64


def shapes(suite: str):
    """(suite, B, H, S, D, causal) tuples."""
    out = []
    if suite in ("b2h8", "all"):
        out += [("b2h8", 2, 8, s, 64, c) for c in (False, True) for s in (128, 512, 1024, 4096)]
    if suite in ("flash", "all"):
        for d, h in ((64, 32), (128, 16)):
            for c in (False, True):
                out += [("flash", 16384 // s, h, s, d, c) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    if suite == "quick":
        out += [("quick", 1, 2, s, 64, c) for c in (False, True) for s in (64, 128)]
    return out


def call_of(impl: str, q, k, v, causal: bool):
    if impl == "fattn_fused_tf32":
        if q.dtype != torch.float32:
            raise RuntimeError("float32 only (TF32 is a float32 mode)")

        def run_tf32():
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return torch.ops.fattn.attention(q, k, v, causal, False, None, "auto")[0]
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
        return run_tf32
    if impl.startswith("fattn"):
        name = "naive" if impl == "fattn_naive" else "auto"
        return lambda: torch.ops.fattn.attention(q, k, v, causal, False, None, name)[0]
    backend = SDPA_BACKENDS[impl]

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


class Timer:
    """CUDA events on the current stream, or perf_counter on the CPU (smoke tests)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def peak_bytes(device, fn):
    """(result, bytes the call allocated at its peak beyond what was allocated before)."""
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


def input_sets(b, h, s, d, dtype, device, l2_bytes):
    one = 4 * b * h * s * d * torch.tensor([], dtype=dtype).element_size()  # q, k, v, out
    n = max(1, min(8, math.ceil(L2_COVER * l2_bytes / one)))
    g = torch.Generator(device="cpu").manual_seed(1234 + s + d)
    return [tuple(torch.randn(b, h, s, d, generator=g).to(device=device, dtype=dtype)
                  for _ in range(3)) for _ in range(n)]


def bench_shape(shape, dtypes, impls, args, device, l2_bytes, rows_out):
    suite, b, h, s, d, causal = shape
    pairs = s * (s + 1) // 2 if causal else s * s
    flops = 4 * b * h * pairs * d
    for dname in dtypes:
        dtype = DTYPES[dname]
        try:
            sets = input_sets(b, h, s, d, dtype, device, l2_bytes)
        except torch.OutOfMemoryError:
            print(f"  {suite} B={b} H={h} S={s} D={d} {dname}: inputs do not fit", flush=True)
            continue
        rows = torch.unique(torch.linspace(0, s - 1, min(s, ERROR_ROWS)).round().long()).to(device)
        ref = reference_rows(*sets[0], causal, rows)
        base = {"dtype": dname, "B": b, "Hq": h, "Hkv": h, "Sq": s, "Sk": s, "D": d,
                "causal": causal, "causal_alignment": "top_left" if causal else "none",
                "suite": suite, "flops": flops}
        results, calls = {}, {}
        for impl in impls:
            row = dict(base, impl=impl, skipped=None)
            caught = []
            try:
                fn = call_of(impl, *sets[0], causal)
                with warnings.catch_warnings(record=True) as caught:  # SDPA says why it refuses
                    warnings.simplefilter("always")
                    out, peak = peak_bytes(device, fn)
                row["max_abs_err"] = (out[:, :, rows].double() - ref).abs().max().item()
                row["peak_extra_bytes"] = peak
                del out
                for _ in range(2):  # warm-up
                    fn()
                calls[impl] = [call_of(impl, *x, causal) for x in sets]
            except torch.OutOfMemoryError:
                row["skipped"] = "out of memory"
            except RuntimeError as e:  # a backend that does not take this dtype/shape
                reasons = [str(w.message).splitlines()[0] for w in caught]
                row["skipped"] = "; ".join(reasons[:2] or [str(e).splitlines()[0]])[:300]
            if device.type == "cuda":
                torch.cuda.empty_cache()
            results[impl] = row
        timer = Timer(device)
        times = {impl: [] for impl in calls}
        deadline = time.monotonic() + args.budget * max(1, len(calls))
        rep = 0
        while calls and (rep < args.min_reps or (time.monotonic() < deadline and rep < args.max_reps)):
            for impl, fns in list(calls.items()):
                try:
                    times[impl].append(timer(fns[rep % len(fns)]))
                except torch.OutOfMemoryError:
                    # what the other implementations left in torch's cache can leave too
                    # little for this one; try once more with the cache emptied
                    torch.cuda.empty_cache()
                    try:
                        times[impl].append(timer(fns[rep % len(fns)]))
                    except torch.OutOfMemoryError:
                        results[impl]["skipped"] = "out of memory while timing"
                        del calls[impl], times[impl]
            rep += 1
        for impl, ts in times.items():
            med = statistics.median(ts)
            results[impl].update(ms_median=med, ms_min=min(ts), ms_max=max(ts), reps=len(ts),
                                 tflops=flops / (med * 1e9), input_sets=len(sets))
        rows_out.extend(results[i] for i in impls)
        print_rows(results, impls)
        del sets


def print_rows(results, impls):
    first = results[impls[0]]
    fused = results.get("fattn_fused", {}).get("ms_median")
    print(f"\n{first['suite']} B={first['B']} H={first['Hq']} S={first['Sq']} D={first['D']} "
          f"{'causal' if first['causal'] else 'non-causal'} {first['dtype']}")
    for impl in impls:
        r = results[impl]
        if r.get("skipped") or r.get("ms_median") is None:
            print(f"  {impl:15s} skipped: {r.get('skipped')}")
            continue
        vs = f"  fused is {r['ms_median'] / fused:.2f}x faster" if fused and impl != "fattn_fused" else ""
        mem = r.get("peak_extra_bytes")
        print(f"  {impl:15s} {r['ms_median']:9.3f} ms  {r['tflops']:7.2f} TFLOP/s  err "
              f"{r['max_abs_err']:.1e}  mem {'-' if mem is None else f'{mem / 2**20:.1f} MiB'}{vs}",
              flush=True)


def machine(device) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch_version": torch.__version__, "fattn_version": fattn.__version__,
            "cuda": torch.version.cuda, "timer": "CUDA events, median",
            "warmup": 2, "l2_cover": L2_COVER}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device=p.name, memory_bytes=p.total_memory, sm_count=p.multi_processor_count)
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    else:
        info.update(device="cpu (smoke test: not a GPU measurement)", timer="perf_counter")
    return info


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench_cuda", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES + ("all",), default="all",
                   help="b2h8, flash, quick, or all: b2h8 and flash (default)")
    p.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--device", default="cuda", help="cuda (default); cpu only for a smoke test")
    p.add_argument("--budget", type=float, default=0.3, help="seconds per impl and shape")
    p.add_argument("--min-reps", type=int, default=5)
    p.add_argument("--max-reps", type=int, default=100)
    p.add_argument("--out", default="fattn-bench-cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            p.error("no CUDA device visible to torch (use --device cpu for a smoke test)")
        if not fattn._C.with_cuda:
            p.error("this fattn build has no CUDA backend: reinstall on a machine with nvcc "
                    "(pip install --no-build-isolation .)")
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
    else:
        l2_bytes = 1 << 20
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine(device)
    for shape in shapes(args.suite):
        bench_shape(shape, args.dtypes, args.impls, args, device, l2_bytes, rows)
        write_results(out, info, rows)  # after every shape: a run cut off keeps what it measured
    write_results(out, info, rows)
    print(f"\nwrote {out / 'bench_cuda.json'}, {out / 'bench_cuda.csv'}")
    return 0


def write_results(out: Path, info: dict, rows: list) -> None:
    (out / "bench_cuda.json").write_text(json.dumps({"machine": info, "results": rows},
                                                    indent=2) + "\n")
    keys = sorted({k for r in rows for k in r})
    with open(out / "bench_cuda.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
