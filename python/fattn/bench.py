"""fattn vs PyTorch on the CPU, side by side in one process: ``python -m fattn.bench``.

Implementations (the JSON's "impl"):
  fattn_fused     torch.ops.fattn.attention(impl="fused"): tiled, online softmax
  fattn_naive     torch.ops.fattn.attention(impl="naive"): 3 stages through an Sq×Sk buffer
  torch_sdpa      torch.nn.functional.scaled_dot_product_attention
  torch_standard  "standard attention": softmax(Q Kᵀ · scale [+ causal mask]) V, as
                  matmul -> softmax -> matmul (the scale and the mask applied in place)
All run float32 with the same thread count: torch.set_num_threads(--threads), which
is also what fattn's operator uses (torch.get_num_threads(), on torch's own pool).

Sweeps:
  assignment  B=2, H=8, D in {64, 128}, S in {128, 512, 1024, 2048, 4096, 8192},
              causal and not
  lesson      B=4, H=32, D=64, S from 256 to 8192 (non-causal), as far as memory allows
  quick       tiny shapes for CI (--quick)

Columns: median time over the timed calls (min, max too; after one warm-up call, the
calls of the impls alternate round-robin so that load from elsewhere hits all alike), GFLOP/s (4·D FLOPs per
visible (query, key) pair, as fattn-bench counts them), speedups, extra memory, and the
max abs error against a float64 reference (torch in float64; every row for small
problems, else sampled rows: "err_rows").

Extra memory, two ways:
  peak_rss_extra_bytes  every impl: the rise of the process's peak RSS (VmHWM, reset
                        through /proc/self/clear_refs after malloc_trim) over one call,
                        less the output it returns (out, and fattn's lse)
  extra_bytes           fattn: fattn::extra_bytes (its exact working memory, as in the
                        C++ fattn-bench); torch: peak_rss_extra_bytes
Before running, each impl's memory is estimated; a run that would not fit in 70% of
MemAvailable is skipped and reported ("skipped"), never attempted — standard attention
and fattn's naive path need B·H·Sq·Sk floats (twice, for standard attention).

Output: a table on stdout, and in --out DIR: bench.json (fattn-bench's --json schema:
{"machine": {...}, "results": [...]}), bench.csv, time_vs_s.png, memory_vs_s.png.

--decode runs the decode sweep instead (fattn/bench_decode.py: short queries against a KV
cache, fattn vs torch SDPA with enable_gqa, against the DRAM triad).

--pass train times forward + backward instead (fattn/bench_train.py: fattn's fused and
naive backward vs torch SDPA's and standard attention's autograd), into train.json,
train.csv, train_time_vs_s.png, train_memory_vs_s.png.
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fattn

IMPLS = ("fattn_fused", "fattn_naive", "torch_sdpa", "torch_standard")
LABELS = {"fattn_fused": "fattn fused", "fattn_naive": "fattn naive", "torch_sdpa": "torch SDPA",
          "torch_standard": "standard (matmul-softmax-matmul)"}
FLOAT = 4


# --- the implementations ------------------------------------------------------------------
def standard_attention(q, k, v, causal: bool, scale: float):
    s = torch.matmul(q, k.transpose(-2, -1))
    s.mul_(scale)
    if causal:  # top-left: key j is hidden from query i when j > i
        sq, sk = s.shape[-2], s.shape[-1]
        s.masked_fill_(torch.ones(sq, sk, dtype=torch.bool).triu_(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    return torch.matmul(p, v)


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


def output_bytes(impl: str, b, h, sq, d) -> int:
    lse = b * h * sq * FLOAT if impl.startswith("fattn") else 0
    return b * h * sq * d * FLOAT + lse


def estimate_bytes(impl: str, q, k, v, causal: bool) -> int:
    """Memory one call allocates, inputs excluded (to decide whether it may run)."""
    b, h, sq, d = q.shape
    sk = k.size(2)
    out = output_bytes(impl, b, h, sq, d)
    if impl in ("fattn_fused", "fattn_naive"):
        return out + fattn.extra_bytes(q, k, v, causal, False, impl.split("_")[1])
    if impl == "torch_standard":  # scores and probabilities, live together; the mask
        return out + 2 * b * h * sq * sk * FLOAT + (sq * sk if causal else 0)
    # torch SDPA on the CPU (flash kernel): per-thread blocks and its logsumexp
    return 2 * out + b * h * sq * FLOAT + (64 << 20)


# --- memory -------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _meminfo_bytes(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakRss:
    """The rise of peak RSS over a call: VmHWM is reset through /proc/self/clear_refs
    (Linux), after malloc_trim returns freed heap pages, so that the baseline is real."""

    def __init__(self):
        self.ok = False
        try:
            self._libc = ctypes.CDLL("libc.so.6")
            self._reset()
            _status_kib("VmHWM")
            self.ok = True
        except (OSError, KeyError, AttributeError):
            pass

    @staticmethod
    def _reset():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def measure(self, fn):
        if not self.ok:
            return fn(), None
        self._libc.malloc_trim(0)
        self._reset()
        before = _status_kib("VmRSS")
        result = fn()
        peak = _status_kib("VmHWM")
        return result, max(0, peak - before) * 1024


# --- the float64 reference ------------------------------------------------------------------
def reference_rows(q, k, v, causal: bool, rows: torch.Tensor):
    """softmax(Q Kᵀ · scale) V in float64 for the query rows `rows` of every (b, h), on
    q's device (fattn.bench_cuda uses it on the GPU)."""
    b, h, sq, d = q.shape
    sk = k.size(2)
    scale = 1.0 / math.sqrt(d)
    kd, vd = k.double(), v.double()
    out = torch.empty(b, h, rows.numel(), d, dtype=torch.float64, device=q.device)
    chunk = max(1, (256 << 20) // (8 * b * h * sk))  # rows per chunk: ~256 MiB of scores
    for start in range(0, rows.numel(), chunk):
        r = rows[start:start + chunk]
        s = torch.matmul(q[:, :, r].double(), kd.transpose(-2, -1)) * scale
        if causal:
            s.masked_fill_(torch.arange(sk, device=q.device).view(1, -1) > r.view(-1, 1),
                           float("-inf"))
        out[:, :, start:start + r.numel()] = torch.matmul(torch.softmax(s, dim=-1), vd)
    return out


def check_rows(q, k) -> tuple[torch.Tensor, str]:
    b, h, sq, d = q.shape
    if b * h * sq * k.size(2) * d <= (1 << 31):
        return torch.arange(sq), "all"
    n = min(sq, 32)  # first, last and evenly spaced rows of every (b, h)
    return torch.unique(torch.linspace(0, sq - 1, n).round().long()), "sampled"


# --- contention -----------------------------------------------------------------------------
def _cpu_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
    steal = v[7] if len(v) > 7 else 0
    return busy, steal


class Contention:
    """Cores' worth of CPU used by other processes (and hypervisor steal) during the run."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")
        self.busy0, self.steal0 = _cpu_jiffies()
        t = os.times()
        self.own0 = t.user + t.system
        self.wall0 = time.monotonic()

    def result(self):
        busy, steal = _cpu_jiffies()
        t = os.times()
        wall = max(1e-9, time.monotonic() - self.wall0)
        others = (busy - self.busy0) / self.hz - (t.user + t.system - self.own0)
        return max(0.0, others / wall), (steal - self.steal0) / self.hz / wall


# --- one shape ------------------------------------------------------------------------------
def bench_shape(sweep, b, h, s, d, causal, impls, args, peak_rss, rows_out):
    gen = torch.Generator().manual_seed(1234 + s + d + int(causal))
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    rows, err_rows = check_rows(q, k)
    ref = reference_rows(q, k, v, causal, rows)
    flops = fattn.flops(b, h, s, s, d, "top_left" if causal else None)
    budget = 0.7 * _meminfo_bytes("MemAvailable")
    results, fns, first, warm = {}, {}, {}, {}
    for impl in impls:
        base = {"impl": impl, "dtype": "float32", "B": b, "Hq": h, "Hkv": h, "Sq": s, "Sk": s,
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
        extra_rss = None if peak is None else max(0, peak - output_bytes(impl, b, h, s, d))
        warm[impl] = dict(base, max_abs_err=None if math.isnan(err) else err, err_rows=err_rows,
                          extra_bytes=exact if exact is not None else extra_rss,
                          extra_bytes_method=("fattn::extra_bytes" if exact is not None
                                              else "peak_rss"),
                          peak_rss_extra_bytes=extra_rss, estimated_bytes=need, skipped=None)
    # Timed calls round-robin over the impls, so that a burst of load from elsewhere
    # lands on all of them alike.
    total = sum(first.values())
    reps = max(args.min_reps, min(args.max_reps, int(args.budget * max(1, len(first)) /
                                                     max(total, 1e-6))))
    times = {impl: [] for impl in fns}
    for _ in range(reps):
        for impl, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[impl].append((time.perf_counter() - t0) * 1e3)
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


# --- output ---------------------------------------------------------------------------------
def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


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


def machine_info(threads: int, args, contention) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    others, steal = contention
    return {
        "device": "cpu",
        "cpu": cpu,
        "isa": fattn.best_cpu_isa(),
        "threads": threads,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fattn_version": fattn.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "reps": f"adaptive: {args.min_reps}..{args.max_reps} timed calls, ~{args.budget} s per impl",
        "warmup": 1,
        "timer": "time.perf_counter around one call; median, min, max",
        "memory_method": "peak_rss_extra_bytes: VmHWM rise over the warm-up call (reset via "
                         "/proc/self/clear_refs after malloc_trim) less the returned outputs; "
                         "extra_bytes: fattn::extra_bytes for fattn, peak_rss_extra_bytes for torch",
        "memory_budget": "runs estimated above 70% of MemAvailable are skipped",
        "error_reference": "torch float64, every row or sampled rows (err_rows)",
        "other_processes_cores_sweep": round(others, 3),
        "steal_cores": round(steal, 3),
    }


# fattn-bench's --json keys first, in its order; then this benchmark's own.
KEYS = ["impl", "dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal", "causal_alignment",
        "ms_median", "ms_min", "ms_max", "gflops", "max_abs_err", "err_rows", "extra_bytes",
        "extra_bytes_method", "peak_rss_extra_bytes", "estimated_bytes", "reps", "sweep",
        "skipped", "pass", "flops"]


def write_outputs(out_dir: Path, machine: dict, results: list, stem: str = "bench"):
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [{k: r.get(k) for k in KEYS} for r in results]
    with open(out_dir / f"{stem}.json", "w") as f:
        json.dump({"machine": machine, "results": results}, f, indent=2)
        f.write("\n")
    keys = KEYS
    with open(out_dir / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    plot(out_dir, results, "" if stem == "bench" else f"{stem}_")


def plot(out_dir: Path, results: list, prefix: str = ""):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fattn.bench: matplotlib is not installed; no plots", file=sys.stderr)
        return
    groups = sorted({(r["sweep"], r["B"], r["Hq"], r["D"], r["causal"]) for r in results},
                    key=lambda g: (g[0], g[3], g[4]))
    styles = {"fattn_fused": "o-", "fattn_naive": "s-", "torch_sdpa": "^-",
              "torch_standard": "D-"}
    for what, fname in (("time", f"{prefix}time_vs_s.png"), ("memory", f"{prefix}memory_vs_s.png")):
        n = len(groups)
        cols = 2 if n in (2, 4) else min(n, 3)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
        for ax, g in zip(axes.flat, groups):
            sweep, b, h, d, causal = g
            for impl in IMPLS:
                pts = sorted((r["Sq"], r) for r in results if r["impl"] == impl and
                             (r["sweep"], r["B"], r["Hq"], r["D"], r["causal"]) == g)
                if not pts:
                    continue
                if what == "time":
                    xy = [(s, r["ms_median"]) for s, r in pts if r["ms_median"] is not None]
                else:
                    xy = [(s, r["peak_rss_extra_bytes"] or r["extra_bytes"]) for s, r in pts
                          if r["ms_median"] is not None and (r["peak_rss_extra_bytes"] or
                                                             r["extra_bytes"])]
                line = None
                if xy:
                    line, = ax.plot(*zip(*xy), styles[impl], label=LABELS[impl], ms=4)
                skipped = [(s, r["estimated_bytes"]) for s, r in pts if r["skipped"]]
                if skipped and what == "memory":
                    ax.plot(*zip(*skipped), "x", color=line.get_color() if line else "k",
                            ms=8, label=f"{LABELS[impl]}: skipped (estimate)")
                elif skipped:
                    ax.axvline(skipped[0][0], color=line.get_color() if line else "k", ls=":",
                               lw=1, label=f"{LABELS[impl]}: out of memory from S={skipped[0][0]}")
                if what == "memory" and impl.startswith("fattn"):
                    exact = [(s, r["extra_bytes"]) for s, r in pts if r["extra_bytes"]]
                    if exact:
                        ax.plot(*zip(*exact), "--", color=line.get_color() if line else "k",
                                lw=1, label=f"{LABELS[impl]}: fattn::extra_bytes")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length S (Sq = Sk)")
            ax.set_ylabel("median time (ms)" if what == "time" else
                          "extra memory (bytes; peak RSS rise)")
            ax.set_title(f"{sweep}: B={b} H={h} D={d} {'causal' if causal else 'non-causal'}",
                         fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)


def sweeps(args):
    if args.quick:
        return [("quick", 1, 2, s, 64, c) for c in (False, True) for s in (64, 128)]
    shapes = []
    if args.sweep in ("assignment", "all"):
        for d in (64, 128):
            for c in (False, True):
                for s in args.assignment_s:
                    shapes.append(("assignment", 2, 8, s, d, c))
    if args.sweep in ("lesson", "all"):
        for s in args.lesson_s:
            shapes.append(("lesson", 4, 32, s, 64, False))
    return shapes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--decode" in argv:  # the decode sweep (fattn/bench_decode.py)
        from . import bench_decode
        return bench_decode.main([a for a in argv if a != "--decode"])
    p = argparse.ArgumentParser(prog="python -m fattn.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, few calls (CI)")
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward",
                   help="forward only (default), or forward + backward (train)")
    p.add_argument("--train-s", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096],
                   help="sequence lengths of --pass train (B=2, H=8, D 64 and 128)")
    p.add_argument("--out", default="fattn-bench-py", help="output directory")
    p.add_argument("--sweep", choices=("assignment", "lesson", "all"), default="assignment")
    p.add_argument("--assignment-s", type=int, nargs="+",
                   default=[128, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--lesson-s", type=int, nargs="+",
                   default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--threads", type=int, default=0,
                   help="threads for torch and fattn alike (default: torch.get_num_threads())")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of timed calls per impl and shape (default 2)")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=30)
    args = p.parse_args(argv)
    if args.quick:
        args.budget, args.min_reps, args.max_reps = 0.05, 2, 3
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    assert fattn.num_threads() == threads
    print(f"fattn {fattn.__version__} ({fattn.best_cpu_isa()}) vs torch {torch.__version__}, "
          f"{threads} threads each; float32; times in ms (median); mem = extra memory "
          "(fattn::extra_bytes for fattn, peak RSS rise for torch); err = max abs error vs "
          "float64", flush=True)
    peak_rss = PeakRss()
    contention = Contention()
    results = []
    if args.pass_ == "train":
        from . import bench_train
        results = bench_train.run(args, peak_rss)
    else:
        with torch.inference_mode():
            for shape in sweeps(args):
                bench_shape(*shape, args.impls, args, peak_rss, results)
    machine = machine_info(threads, args, contention.result())
    if machine["other_processes_cores_sweep"] > 0.25:
        print(f"fattn.bench: warning: other processes used "
              f"{machine['other_processes_cores_sweep']:.2f} cores during the sweep; the "
              "timings are inflated", file=sys.stderr)
    out = Path(args.out)
    stem = "train" if args.pass_ == "train" else "bench"
    prefix = "train_" if args.pass_ == "train" else ""
    write_outputs(out, machine, results, stem)
    print(f"\nwrote {out / (stem + '.json')}, {out / (stem + '.csv')}, "
          f"{out / (prefix + 'time_vs_s.png')}, {out / (prefix + 'memory_vs_s.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
