"""The harness of ``python -m fattn.bench --gpu`` (fattn/bench/gpu.py): sizes, the
machine's description, the clock, float64 references on sampled rows, and Run, which times,
checks and records one row at a time (every failure a result, the JSON rewritten after
each row)."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import subprocess
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

SECTIONS = ("masked", "forward", "decode", "training")
# The share of the time left that each section may use under --budget-s.
SHARES = {"masked": 0.30, "forward": 0.25, "decode": 0.20, "training": 0.25}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
ERROR_ROWS = 16                 # sampled query rows per (batch, head) checked for max_err
COPY_BYTES = 1 << 30            # the copy roof's tensor (bytes)


class Skip(Exception):
    """The implementation cannot run here (recorded as "skipped: <reason>")."""


# ---- sizes ----------------------------------------------------------------------------------
def sizes(smoke: bool) -> dict:
    if smoke:  # tiny, same structure: every row runs, in seconds, on a CPU
        return {"masked": {"B": 2, "H": 2, "S": 64, "D": 32, "window": 16},
                "forward": [(1, 2, s, d) for d in (64, 128) for s in (32, 64)],
                "decode": {"Bs": (1, 2), "Hq": 4, "Hkv": 1, "D": 32, "Sks": (64, 128, 256),
                           "pages": (16, 256), "stages_at": 128, "stages": (2, 3, 4)},
                "training": [(1, 2, 48, 32)],
                "copy_bytes": 1 << 22}
    return {"masked": {"B": 4, "H": 16, "S": 4096, "D": 128, "window": 1024},
            # FlashAttention's hidden-2048 sweep: H = 2048 / D, B = 16384 / S
            "forward": [(16384 // s, 2048 // d, s, d) for d in (64, 128) for s in (4096, 16384)],
            # stages: the C++ decode kernel's ring depths measured at Sk = stages_at
            "decode": {"Bs": (1, 8, 32), "Hq": 32, "Hkv": 8, "D": 128,
                       "Sks": (8192, 32768, 131072), "pages": (256, 16),
                       "stages_at": 32768, "stages": (2, 3, 4)},
            # forward + backward: B = 4, S = 4096, H = 2048 / D (the anchors' shapes)
            "training": [(4, 2048 // d, 4096, d) for d in (64, 128)],
            "copy_bytes": COPY_BYTES}


# ---- the machine ----------------------------------------------------------------------------
def machine_name(device_name: str) -> str:
    """The short name of a GPU for results/<machine>/: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 4090" -> "rtx4090"."""
    words = [w for w in re.sub(r"[^a-z0-9]+", " ", device_name.lower()).split()
             if w not in ("nvidia", "geforce", "tesla", "quadro")]
    for i, w in enumerate(words):
        if re.search(r"[0-9]", w):
            return (words[i - 1] + w) if w.isdigit() and i > 0 else w
    return words[0] if words else "unknown"


def _run(cmd) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return p.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(device: torch.device) -> dict:
    import fattn
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "fattn": fattn.__version__, "fattn_file": fattn.__file__,
            "fattn_cuda_backend": bool(getattr(fattn._C, "with_cuda", False)),
            "commit": os.environ.get("FATTN_COMMIT") or _run(
                ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"])
            or "unknown"}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    nvcc = _run(["nvcc", "--version"]).splitlines()
    info["nvcc"] = nvcc[-1] if nvcc else None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader"]).splitlines()
        fields = [f.strip() for f in smi[0].split(",")] if smi else []
        name = fields[0] if fields else p.name
        header = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"]))
        info.update(device=name, machine=machine_name(name),
                    driver=fields[1] if len(fields) > 1 else "unknown",
                    cuda_driver=header.group(1) if header else None,
                    clocks_max_sm=fields[2] if len(fields) > 2 else None,
                    power_limit=fields[3] if len(fields) > 3 else None,
                    compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                    memory_bytes=p.total_memory,
                    timer="triton.testing.do_bench, median (CUDA events, L2 flushed per call)")
    else:
        info.update(device=f"cpu: {platform.processor() or platform.machine()} (smoke test: "
                    "not a GPU measurement)", machine="cpu", driver=None,
                    timer="perf_counter, one call (smoke: not a measurement)")
    return info


# ---- timing ---------------------------------------------------------------------------------
class Clock:
    """Milliseconds of one call: do_bench's median on a GPU, one call's wall time (smoke)."""

    def __init__(self, device: torch.device, warmup_ms: float, rep_ms: float):
        self.cuda = device.type == "cuda"
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.do_bench = None
        if self.cuda:
            try:
                from triton.testing import do_bench
                self.do_bench = do_bench
            except ImportError:
                pass

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        if self.do_bench is not None:
            return float(self.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms,
                                       return_mode="median"))
        # Without triton: CUDA events around each call, the median (L2 not flushed).
        times = []
        deadline = time.monotonic() + self.rep_ms / 1e3
        for _ in range(3):
            fn()
        while len(times) < 5 or (time.monotonic() < deadline and len(times) < 1000):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]


# ---- references -----------------------------------------------------------------------------
def sample_rows(s: int, device) -> torch.Tensor:
    return torch.unique(torch.linspace(0, s - 1, min(s, ERROR_ROWS)).round().long()).to(device)


def reference_rows(q, k, v, rows, visible=None, softcap=0.0, alibi_slopes=None,
                   sinks=None) -> torch.Tensor:
    """float64 softmax(q kᵀ/sqrt(D), hidden pairs -inf) v at query rows `rows` of every
    (batch, head): (B, Hq, R, D). visible: a bool tensor broadcastable to (B, Hq, R, Sk), or
    None. The variants as fattn.triton.reference.attention applies them: softcap, ALiBi
    slopes (Hq,) at distance |i + Sk - Sq - j|, sinks (Hq,) in the denominator. A row that
    sees no key (and no sink) gives 0."""
    hq, hkv, d = q.size(1), k.size(1), q.size(-1)
    sq, sk = q.size(2), k.size(2)
    qd = q[:, :, rows].double()
    kd, vd = k.double(), v.double()
    if hq != hkv:
        kd = kd.repeat_interleave(hq // hkv, dim=1)
        vd = vd.repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(qd, kd.transpose(-2, -1)) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        keys = torch.arange(sk, device=s.device).view(1, -1)
        distance = (rows.view(-1, 1) + sk - sq - keys).abs().double()
        s = s - alibi_slopes.double().view(1, hq, 1, 1) * distance
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.double().view(1, hq, 1, 1).expand(*s.shape[:3], 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p.nan_to_num(0.0), vd)


def max_err(got, ref) -> float:
    return float((got.double() - ref).abs().max().item())


def json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


# ---- the run --------------------------------------------------------------------------------
class Run:
    def __init__(self, args, device, info, out_dir: Path):
        self.args, self.device, self.info, self.out = args, device, info, out_dir
        self.cuda = device.type == "cuda"
        self.clock = Clock(device, args.warmup_ms, args.rep_ms)
        self.rows = {s: [] for s in args.sections}
        self.start = time.monotonic()
        self.section_deadline = math.inf
        self.section_start = self.start
        self.gen = torch.Generator(device=device).manual_seed(args.seed)

    # the time each section may use: its share of what is left
    def begin(self, section: str):
        self.section_start = time.monotonic()
        if self.args.budget_s <= 0:
            self.section_deadline = math.inf
            return
        left = self.args.budget_s - (time.monotonic() - self.start)
        later = [s for s in self.args.sections if self.args.sections.index(s) >=
                 self.args.sections.index(section)]
        share = SHARES[section] / sum(SHARES[s] for s in later)
        self.section_deadline = time.monotonic() + max(0.0, left) * share

    def randn(self, *shape, dtype):
        return torch.randn(*shape, generator=self.gen, device=self.device,
                           dtype=torch.float32).to(dtype)

    def needs_cuda(self):
        if not self.cuda:
            raise Skip("needs CUDA")

    def row(self, section, base, impl, variant, make, check, work):
        """make() -> the call (raises Skip where it cannot run here); check(out) -> max_err;
        work(ms) -> {"tflops": ...} or {"gbps": ...}."""
        row = dict(base, impl=impl, variant=variant, ms_median=None, max_err=None)
        t0 = time.monotonic()
        if t0 > self.section_deadline:
            row["status"] = "skipped: out of time (--budget-s)"
        else:
            caught = []
            try:
                # recorded: SDPA says in warnings why a backend refuses a problem
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    fn = make()
                    out = fn()
                    self.clock.sync()
                    row["first_call_s"] = round(time.monotonic() - t0, 3)
                    if check is not None:
                        row["max_err"] = json_safe(check(out))
                    del out
                    ms = self.clock(fn)
                row["ms_median"] = ms
                row.update({k: json_safe(v) for k, v in work(ms).items()})
                row["status"] = "ok"
            except Skip as e:
                row["status"] = f"skipped: {e}"
            except Exception as e:  # noqa: BLE001 -- every failure is a result here
                text = " | ".join(str(e).strip().splitlines()[:4])[:600]
                why = [str(w.message).strip().splitlines()[0][:300] for w in caught
                       if str(w.message).strip()][:3]
                row["status"] = f"error: {type(e).__name__}: {text}"
                if why:
                    row["warnings"] = why
        row["wall_s"] = round(time.monotonic() - t0, 3)
        self.rows[section].append(row)
        self.print_row(row)
        self.write(section)
        return row

    @staticmethod
    def print_row(r):
        if r.get("B") is None:  # the copy roof
            what = f"{r['impl']:14s} {r['variant']}"
        else:
            what = f"{r['impl']:14s} {r['dtype']:8s} B={r['B']} Hq={r['Hq']} Hkv={r['Hkv']} " \
                   f"Sq={r['Sq']} Sk={r['Sk']} D={r['D']} " + \
                   (r.get("mask") or ("causal" if r.get("causal") else ""))
        if r["status"] != "ok":
            print(f"  {what}: {r['status'][:160]}", flush=True)
            return
        rate = (f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r else
                f"{r['gbps']:7.0f} GB/s" + (f" ({r['pct_of_copy']:.0f} % of copy)"
                                            if r.get("pct_of_copy") is not None else ""))
        err = r["max_err"]
        err = f"{err:.1e}" if isinstance(err, float) else str(err)
        print(f"  {what}: {r['ms_median']:8.3f} ms {rate}  max_err {err}", flush=True)

    def write(self, section):
        doc = {"machine": self.info, "section": section,
               "seconds": round(time.monotonic() - self.section_start, 1),
               "rows": self.rows[section]}
        (self.out / f"{section}.json").write_text(json.dumps(doc, indent=1) + "\n")

    def free(self):
        if self.cuda:
            torch.cuda.empty_cache()


def sdpa_call(run, backend_name, q, k, v, **kw):
    """F.scaled_dot_product_attention with one backend forced; the GPU backends only on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
               "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]
    run.needs_cuda()

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return call


def triton_call(name, *args, **kwargs):
    """fattn.triton.<name>(*args, **kwargs) as a call; imported here, on first use (under
    the interpreter on the CPU: TRITON_INTERPRET is set by then)."""
    import fattn.triton
    fn = getattr(fattn.triton, name)
    return lambda: fn(*args, **kwargs)
