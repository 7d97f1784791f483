"""What the benchmarks of ``python -m fattn.bench`` share: the implementations' names, the
extra-memory and contention measurements, the machine record, fattn-bench's JSON schema,
the CSV and the plots."""
from __future__ import annotations

import csv
import ctypes
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

import fattn

IMPLS = ("fattn_fused", "fattn_naive", "torch_sdpa", "torch_standard")


LABELS = {"fattn_fused": "fattn fused", "fattn_naive": "fattn naive", "torch_sdpa": "torch SDPA",
          "torch_standard": "standard (matmul-softmax-matmul)"}


FLOAT = 4  # bytes of a float32 (the logsumexp, whatever the inputs' dtype)
# The input dtypes the benchmarks take (--dtype): float32, and the 16-bit ones.
DTYPES = ("float32", "bfloat16", "float16")


# The CPU kernels the benchmarks may be told to run (--isa): "auto" is the library's choice;
# a narrower one (avx2 on an AVX-512 machine) runs that instruction set's own kernels.
ISAS = ("auto", "amx", "avx512", "avx2", "portable")


def add_isa_argument(parser) -> None:
    parser.add_argument("--isa", choices=ISAS, default="auto",
                        help="CPU kernels to run (default auto: the widest this CPU has)")


def use_isa(name: str) -> str:
    """Makes every later fattn CPU call of this process run the kernels of `name`; returns
    the name the results record (the best ISA for "auto")."""
    try:
        fattn._C.set_cpu_isa(name)
    except RuntimeError as e:  # names the best ISA, and FATTN_CPU_ISA where it caps them
        raise SystemExit(f"--isa {name}: {e}") from None
    return fattn.best_cpu_isa() if name == "auto" else name


def element_size(dtype: str) -> int:
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def reps_for(first_seconds, args) -> int:
    """Timed calls per impl: about args.budget seconds of each, from their first calls'
    times, within [args.min_reps, args.max_reps]."""
    first_seconds = list(first_seconds)
    return max(args.min_reps, min(args.max_reps, int(args.budget * max(1, len(first_seconds)) /
                                                     max(sum(first_seconds), 1e-6))))


def round_robin(calls, reps: int):
    """Seconds of `reps` calls of each of `calls`, one of each in turn, so that a burst of
    load from elsewhere lands on all of them alike."""
    times = [[] for _ in calls]
    for _ in range(reps):
        for call, t in zip(calls, times):
            start = time.perf_counter()
            call()
            t.append(time.perf_counter() - start)
    return times


def standard_attention(q, k, v, causal: bool, scale: float):
    s = torch.matmul(q, k.transpose(-2, -1))
    s.mul_(scale)
    if causal:  # top-left: key j is hidden from query i when j > i
        sq, sk = s.shape[-2], s.shape[-1]
        s.masked_fill_(torch.ones(sq, sk, dtype=torch.bool).triu_(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    return torch.matmul(p, v)


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def meminfo_bytes(field: str) -> int:
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
            status_kib("VmHWM")
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
        before = status_kib("VmRSS")
        result = fn()
        peak = status_kib("VmHWM")
        return result, max(0, peak - before) * 1024


def cpu_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
    steal = v[7] if len(v) > 7 else 0
    return busy, steal


class Contention:
    """Cores' worth of CPU used by other processes (and hypervisor steal) during the run."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")
        self.busy0, self.steal0 = cpu_jiffies()
        t = os.times()
        self.own0 = t.user + t.system
        self.wall0 = time.monotonic()

    def result(self):
        busy, steal = cpu_jiffies()
        t = os.times()
        wall = max(1e-9, time.monotonic() - self.wall0)
        others = (busy - self.busy0) / self.hz - (t.user + t.system - self.own0)
        return max(0.0, others / wall), (steal - self.steal0) / self.hz / wall


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


def bf16_products_used() -> str:
    """What bfloat16 inputs on avx512 multiply on in this process, and why."""
    try:
        return "{} ({})".format(*fattn.bf16_products())
    except RuntimeError as e:  # an invalid FATTN_CPU_BF16: float32 runs do not need it
        return f"error: {e}"


def machine_info(threads: int, args, contention) -> dict:
    cpu = cpu_name()
    others, steal = contention
    return {
        "device": "cpu",
        "cpu": cpu,
        "isa": getattr(args, "isa_used", None) or fattn.best_cpu_isa(),
        "bf16_products": bf16_products_used(),
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


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
