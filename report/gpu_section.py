"""The GPU part of section 2, from the evidence files of scripts/gpu-check.sh and
scripts/gpu-torch-bench.sh where they are committed: bench.json (gpu/gpu_bench.cu),
ncu_raw.csv (Nsight Compute) and bench_cuda_*.json (python -m fattn.bench_cuda: fattn vs
F.scaled_dot_product_attention with each backend forced)."""
from __future__ import annotations

import math

from .fmt import num, ratio, table
from .sources import GPU_TORCH_B2H8, GPU_TORCH_FLASH

# ncu metrics of the Speed-of-Light section (scripts/gpu-check.sh).
NCU_MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
NCU_SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
NCU_KERNEL = "Kernel Name"

MIB = 1 << 20

# bench.json's names (its "impl", gpu/gpu_bench.cu's variants) for the dispatched 16-bit fused
# kernel forced to 64- and to 128-row query tiles.
TILE_IMPLS = {64: "fused_br64", 128: "fused_br128"}
SDPA_BACKENDS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math")
# SDPA backends the fattn fused kernel is compared with, column by column.
SDPA_COMPARED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")

# The GPU performance goals.
GOAL_TFLOPS = 300.0             # a: 16-bit, D = 128, non-causal, S >= GOAL_TFLOPS_MIN_S
GOAL_TFLOPS_SUITE = "flash"     #    bench.json's FlashAttention sweep
GOAL_TFLOPS_D = 128
GOAL_TFLOPS_MIN_S = 4096
GOAL_SPEEDUP = 2.0              # b: fp32, B = 2, H = 8, D = 64, S = 4096 vs SDPA's default
GOAL_SPEEDUP_SHAPE = {"dtype": "float32", "B": 2, "Hq": 8, "D": 64, "Sq": 4096}
GOAL_SPEEDUP_SDPA = "sdpa_efficient"   # what SDPA picks for float32 on the GPU
GOAL_MAX_ERR = 1e-3
GOAL_NAIVE_MIN_S = 512          # c: fused faster than naive at every S >= this
GOAL_LINEAR_EXPONENT = 1.1      # c: extra memory per (B·H) ∝ S^k, O(S) when k <= this


def absent(gpu_dir) -> str:
    return ("**No GPU evidence is committed yet.** The report looks for "
            f"`{gpu_dir}/bench.json` (gpu/gpu_bench.cu, CUDA-event timings) and "
            f"`{gpu_dir}/ncu_raw.csv` (Nsight Compute: memory and SM throughput as % of peak "
            "per kernel, launch counts) — both written by `scripts/gpu-check.sh` on a GPU "
            "machine — and found neither. So this report has no ncu SOL numbers, no H100 "
            "roofline and no GPU launch counts; this section fills itself in once those "
            "files are committed (`scripts/gpu-check.sh`, then copy its bench.json and "
            "ncu_raw.csv there).")


def ncu_table(rows: list[dict]) -> str:
    """Memory and SM throughput per profiled launch, and launches per kernel name."""
    launches: dict[str, int] = {}
    for r in rows:
        launches[r.get(NCU_KERNEL, "?")] = launches.get(r.get(NCU_KERNEL, "?"), 0) + 1
    body = [[r.get(NCU_KERNEL, "?")[:60], r.get(NCU_MEMORY, "–"), r.get(NCU_SM, "–")]
            for r in rows]
    counts = table(["kernel", "launches profiled"], [[k[:60], str(n)] for k, n in launches.items()])
    return (table(["kernel", "memory % of peak", "SM % of peak"], body) + "\n\n" + counts)


# --- helpers -------------------------------------------------------------------------------

def _order(values: tuple) -> tuple:
    """A sort key for tuples mixing None, strings, numbers and booleans."""
    return tuple((v is None, isinstance(v, str), v if v is not None else 0) for v in values)


def _yes(causal) -> str:
    return "yes" if causal else "no"


def _tflops(gflops) -> float | None:
    return None if gflops is None else gflops / 1000


def _mib(n_bytes) -> str:
    return "–" if n_bytes is None else num(n_bytes / MIB)


def _time_ratio(slow: dict | None, fast: dict | None) -> str:
    """slow ms / fast ms as 'N.NN×', '–' where either did not run."""
    if not ran(slow) or not ran(fast):
        return "–"
    return ratio(slow["ms_median"] / fast["ms_median"])


def _verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def ran(row: dict | None) -> bool:
    """Whether a result row holds a measurement (not absent, not skipped)."""
    return bool(row) and not row.get("skipped") and row.get("ms_median") is not None


# --- bench.json (gpu/gpu_bench.cu) -----------------------------------------------------------

# A shape, in the order its rows are listed; both bench.json and bench_cuda_*.json have
# these keys.
SHAPE = ("suite", "dtype", "D", "causal", "Sq", "B", "Hq")


def by_shape(results: list[dict], keys: tuple = SHAPE) -> dict[tuple, dict[str, dict]]:
    """{shape: {impl: row}} over `results`, the shape being the values of `keys`, sorted."""
    shapes: dict[tuple, dict[str, dict]] = {}
    for r in results:
        shape = tuple(bool(r.get(k)) if k == "causal" else r.get(k) for k in keys)
        shapes.setdefault(shape, {})[r.get("impl")] = r
    return dict(sorted(shapes.items(), key=lambda item: _order(item[0])))


def side_by_side(bench: dict) -> str:
    """Naive vs fused GPU times for each shape both ran, one table per suite."""
    suites: dict = {}
    for (suite, dtype, d, causal, s, b, h), pair in by_shape(bench.get("results", [])).items():
        n, f = pair.get("naive"), pair.get("fused")
        if ran(n) and ran(f):
            suites.setdefault(suite, []).append(
                [str(dtype), str(b), str(h), str(d), _yes(causal), str(s), num(n["ms_median"]),
                 num(f["ms_median"]), ratio(n["ms_median"] / f["ms_median"]),
                 num(_tflops(f.get("gflops")))])
    if not suites:
        return "(no shape was run by both the naive and the fused GPU kernels)"
    header = ["dtype", "B", "H", "D", "causal", "S", "naive ms", "fused ms", "naive / fused",
              "fused TFLOP/s"]
    parts = []
    for suite, rows in suites.items():
        parts += [f"Suite `{suite}`:" if suite is not None else "No suite given:", "",
                  table(header, rows), ""]
    return "\n".join(parts).rstrip()


def tile_table(bench: dict, dtype: str = "float16") -> str:
    """The 64-row and the 128-row query tiles side by side, and what dispatch got."""
    rows, taller, shapes = [], 0, 0
    for (suite, dt, d, causal, s, b, h), impls in by_shape(bench.get("results", [])).items():
        small, tall = impls.get(TILE_IMPLS[64]), impls.get(TILE_IMPLS[128])
        if dt != dtype or not ran(small) or not ran(tall):
            continue
        shapes += 1
        taller += tall["ms_median"] < small["ms_median"]
        fused = impls.get("fused")
        rows.append([str(suite), str(b), str(h), str(d), _yes(causal), str(s),
                     num(_tflops(small.get("gflops"))), num(_tflops(tall.get("gflops"))),
                     _time_ratio(small, tall),
                     num(_tflops(fused.get("gflops"))) if ran(fused) else "–"])
    if not rows:
        return f"(no {dtype} shape was run with both query-tile heights)"
    return "\n".join([
        table(["suite", "B", "H", "D", "causal", "S", "64-row TFLOP/s", "128-row TFLOP/s",
               "64-row ms / 128-row ms", "dispatch (fused) TFLOP/s"], rows),
        "",
        f"{dtype}: the 128-row tile is faster at {taller} of {shapes} shapes, the 64-row tile "
        f"at {shapes - taller}.",
    ])


WGMMA_IMPLS = ("fused_wgmma", "fused_wgmma_pipelined")


def wgmma_table(bench: dict) -> str:
    """The Hopper wgmma kernel's two schedules against the dispatched fused kernel."""
    rows, faster, pipelined_faster, both, shapes = [], 0, 0, 0, 0
    for (suite, dt, d, causal, s, b, h), impls in by_shape(bench.get("results", [])).items():
        fused = impls.get("fused")
        measured = [impls[i] for i in WGMMA_IMPLS if ran(impls.get(i))]
        if not measured:
            continue
        shapes += 1
        best = min(measured, key=lambda r: r["ms_median"])
        faster += ran(fused) and best["ms_median"] < fused["ms_median"]
        if len(measured) == 2:
            both += 1
            pipelined_faster += best["impl"] == "fused_wgmma_pipelined"
        errors = [r["max_abs_err"] for r in measured if r.get("max_abs_err") is not None]
        cells = [num(_tflops(impls[i].get("gflops"))) if ran(impls.get(i)) else "–"
                 for i in WGMMA_IMPLS]
        rows.append([str(suite), str(dt), str(b), str(h), str(d), _yes(causal), str(s),
                     num(_tflops(fused.get("gflops"))) if ran(fused) else "–", *cells,
                     _time_ratio(fused, best), f"{max(errors):.1e}" if errors else "–"])
    if not rows:
        return ("(no shape was run by the wgmma kernels: they run on compute capability 9.0 "
                "only, and this bench.json has none of their rows)")
    return "\n".join([
        table(["suite", "dtype", "B", "H", "D", "causal", "S", "fused TFLOP/s",
               "wgmma serial TFLOP/s", "wgmma pipelined TFLOP/s", "fused ms / best wgmma ms",
               "wgmma max_err"], rows),
        "",
        f"The faster wgmma schedule beats the dispatched kernel at {faster} of {shapes} shapes; "
        f"the pipelined schedule is the faster one at {pipelined_faster} of the {both} shapes "
        "that ran both.",
    ])


# --- bench_cuda_*.json (python -m fattn.bench_cuda) ------------------------------------------

def machine_line(name: str, machine: dict) -> str:
    line = (f"`{name}`: {machine.get('device', '?')}, driver {machine.get('driver', '?')}, "
            f"torch {machine.get('torch_version', '?')}, {machine.get('date', '?')}.")
    if machine.get("note"):
        line += f" Note: {machine['note']}"
    return line


def best_sdpa(impls: dict[str, dict]) -> dict | None:
    measured = [impls[b] for b in SDPA_BACKENDS if ran(impls.get(b))]
    return max(measured, key=lambda r: r.get("tflops") or 0.0, default=None)


def skipped_note(results: list[dict], dtype: str) -> str:
    """Which implementations skipped shapes of `dtype` (the '–' cells), with short reasons."""
    shown = ["fattn_naive", "fattn_fused", *SDPA_BACKENDS]
    if dtype == "float32":
        shown.append("fattn_fused_tf32")
    rows = [r for r in results if r.get("dtype") == dtype]
    said = []
    for impl in shown:
        mine = [r for r in rows if r.get("impl") == impl]
        skipped = [r for r in mine if r.get("skipped")]
        if not skipped:
            continue
        reasons = sorted({str(r["skipped"]) for r in skipped})
        short = "; ".join(reasons) if all(len(x) <= 40 for x in reasons) else ""
        where = ("every shape" if len(skipped) == len(mine)
                 else f"{len(skipped)} of {len(mine)} shapes")
        said.append(f"{impl} at {where}" + (f" ({short})" if short else ""))
    if not said:
        return ""
    return ("Skipped (–): " + "; ".join(said) + ". Each row's `skipped` field in the JSON "
            "holds the reason torch gave.")


def sdpa_table(results: list[dict], suite, dtype: str) -> str:
    """fattn vs each SDPA backend for one suite and dtype."""
    tf32 = dtype == "float32"
    rows = []
    for (su, dt, d, causal, s, b, h), impls in by_shape(results).items():
        if su != suite or dt != dtype:
            continue
        fused, naive = impls.get("fattn_fused"), impls.get("fattn_naive")
        best = best_sdpa(impls)
        row = [str(b), str(h), str(s), str(d), _yes(causal),
               num(fused.get("tflops")) if ran(fused) else "–"]
        if tf32:
            tf = impls.get("fattn_fused_tf32")
            row.append(num(tf.get("tflops")) if ran(tf) else "–")
        row.append(f"{best['impl'].removeprefix('sdpa_')} {num(best.get('tflops'))}"
                   if best else "–")
        row += [_time_ratio(impls.get(backend), fused) for backend in SDPA_COMPARED]
        row += [_mib(naive.get("peak_extra_bytes")) if ran(naive) else "–",
                _mib(fused.get("peak_extra_bytes")) if ran(fused) else "–"]
        rows.append(row)
    header = ["B", "H", "S", "D", "causal", "fused TFLOP/s"]
    if tf32:
        header.append("fused_tf32 TFLOP/s")
    header += ["best SDPA, TFLOP/s"] + [f"{b.removeprefix('sdpa_')} / fused"
                                        for b in SDPA_COMPARED]
    header += ["naive peak MiB", "fused peak MiB"]
    return table(header, rows)


def sdpa_section(name: str, doc: dict) -> str:
    """Machine line, then one table per suite and dtype."""
    results = doc.get("results", [])
    parts = [machine_line(name, doc.get("machine", {})), "",
              "TFLOP/s from the median of CUDA-event timings; the backend columns are time "
             "ratios SDPA ms / fattn fused ms (above 1× fattn is faster); peak memory is "
             "torch.cuda.max_memory_allocated over one call less what was allocated before "
             "it (the call's output and workspaces).", ""]
    groups = sorted({(r.get("suite"), r.get("dtype")) for r in results}, key=_order)
    for suite, dtype in groups:
        parts += [f"Suite `{suite}`, {dtype}:", "", sdpa_table(results, suite, dtype), ""]
        note = skipped_note([r for r in results if r.get("suite") == suite], dtype)
        if note:
            parts += [note, ""]
    return "\n".join(parts).rstrip()


# --- the GPU goals ----------------------------------------------------------------------------

def goal_tflops(bench: dict | None, flash: dict | None = None) -> list[str]:
    """a: 16-bit, D = 128, non-causal, S >= 4096, fattn fused >= 300 TFLOP/s (bench.json)."""
    title = (f"**a. fp16/bf16, D = {GOAL_TFLOPS_D}, non-causal, S ≥ {GOAL_TFLOPS_MIN_S}: "
             f"fattn fused ≥ {num(GOAL_TFLOPS)} TFLOP/s**")
    if bench is None:
        return [title, "", "Not evaluated: no bench.json."]
    torch_side = by_shape(flash.get("results", [])) if flash else {}
    rows, met, values = [], [], []
    for shape, impls in by_shape(bench.get("results", [])).items():
        suite, dtype, d, causal, s, b, h = shape
        fused = impls.get("fused")
        if (suite != GOAL_TFLOPS_SUITE or dtype not in ("float16", "bfloat16") or d != GOAL_TFLOPS_D
                or causal or s is None or s < GOAL_TFLOPS_MIN_S or not ran(fused)):
            continue
        tflops = _tflops(fused.get("gflops"))
        values.append(tflops or 0.0)
        met.append(tflops is not None and tflops >= GOAL_TFLOPS)
        other = torch_side.get(shape, {}).get("fattn_fused")
        row = [dtype, str(b), str(h), str(s), num(tflops), "met" if met[-1] else "not met"]
        if flash:
            row.insert(5, num(other.get("tflops")) if ran(other) else "–")
        rows.append(row)
    if not rows:
        return [title, "", "Not evaluated: bench.json has no such fused row."]
    header = ["dtype", "B", "H", "S", "fused TFLOP/s (bench.json)", "goal"]
    if flash:
        header.insert(5, f"same shape through torch ({GPU_TORCH_FLASH})")
    summary = (f"300 TFLOP/s target: {_verdict(all(met))} — {sum(met)} of {len(met)} shapes "
               f"reach {num(GOAL_TFLOPS)} TFLOP/s; the best is {num(max(values))} TFLOP/s "
               f"({num(100 * max(values) / GOAL_TFLOPS)} % of the target).")
    return [title, "", table(header, rows), "", summary]


def goal_fp32(b2h8: dict | None) -> list[str]:
    """b: fp32 at B = 2, H = 8, D = 64, S = 4096: fattn >= 2x SDPA (efficient), err < 1e-3."""
    shape = GOAL_SPEEDUP_SHAPE
    title = (f"**b. fp32, B = {shape['B']}, H = {shape['Hq']}, D = {shape['D']}, "
             f"S = {shape['Sq']}, causal and not: fattn ≥ {num(GOAL_SPEEDUP, 2)}× faster than "
             f"`F.scaled_dot_product_attention` (its float32 default, "
             f"{GOAL_SPEEDUP_SDPA.removeprefix('sdpa_')}), max_abs_err < {GOAL_MAX_ERR:g}**")
    if b2h8 is None:
        return [title, "", f"Not evaluated: no {GPU_TORCH_B2H8}."]
    rows, verdicts = [], []
    for key, impls in by_shape(b2h8.get("results", [])).items():
        values = dict(zip(SHAPE, key))
        if any(values[k] != v for k, v in shape.items()):
            continue
        sdpa = impls.get(GOAL_SPEEDUP_SDPA)
        for impl, mode in (("fattn_fused", "3xTF32, the default"),
                           ("fattn_fused_tf32", "TF32, opt-in via "
                            "torch.backends.cuda.matmul.allow_tf32")):
            row = impls.get(impl)
            if not ran(row):
                rows.append([impl, mode, _yes(values["causal"]), "–", "–", "–", "–",
                             "not measured"])
                verdicts.append((impl, False))
                continue
            speedup = sdpa["ms_median"] / row["ms_median"] if ran(sdpa) else None
            err = row.get("max_abs_err")
            met = (speedup is not None and speedup >= GOAL_SPEEDUP and err is not None
                   and err < GOAL_MAX_ERR)
            verdicts.append((impl, met))
            rows.append([impl, mode, _yes(values["causal"]), num(row["ms_median"]),
                         num(sdpa["ms_median"]) if ran(sdpa) else "–",
                         ratio(speedup) if speedup is not None else "–",
                         f"{err:.1e}" if err is not None else "–", "met" if met else "not met"])
    if not rows:
        return [title, "", f"Not evaluated: {GPU_TORCH_B2H8} has no such shape."]
    said = []
    for impl in dict.fromkeys(i for i, _ in verdicts):
        mine = [m for i, m in verdicts if i == impl]
        said.append(f"{impl} {_verdict(all(mine))} ({sum(mine)} of {len(mine)})")
    return [title, "",
            table(["fattn", "mode", "causal", "fattn ms", "SDPA ms", "SDPA / fattn",
                   "max_abs_err", "goal"], rows),
            "", "2x SDPA float32 target: " + "; ".join(said) + "."]


def growth_exponent(points: list[tuple[int, float]]) -> float | None:
    """k in y ∝ S^k between the smallest and the largest S of (S, y) points; where
    several points share an S (causal and not), the smallest y at the smallest S and the
    largest y at the largest S, so k is the steepest growth."""
    points = sorted(p for p in points if p[1])
    if len(points) < 2 or points[0][0] == points[-1][0]:
        return None
    (s0, y0), (s1, y1) = points[0], points[-1]
    return math.log(y1 / y0) / math.log(s1 / s0)


def memory_rows(name: str, doc: dict) -> list[tuple[list[str], bool | None]]:
    """Per (suite, dtype, D): extra memory of fattn fused vs naive at the largest S both
    ran, and how each grows with S (per B·H, causal and not together)."""
    series: dict[tuple, dict[str, list]] = {}
    for (suite, dtype, d, causal, s, b, h), impls in by_shape(doc.get("results", [])).items():
        fused, naive = impls.get("fattn_fused"), impls.get("fattn_naive")
        if not ran(fused) or not ran(naive) or not b or not h:
            continue
        entry = series.setdefault((suite, dtype, d), {"fused": [], "naive": [], "at": []})
        entry["fused"].append((s, fused["peak_extra_bytes"] / (b * h)))
        entry["naive"].append((s, naive["peak_extra_bytes"] / (b * h)))
        entry["at"].append((s, fused["peak_extra_bytes"], naive["peak_extra_bytes"]))
    out = []
    for (suite, dtype, d), entry in series.items():
        largest = max(s for s, _, _ in entry["at"])
        fused_peak = max(f for s, f, _ in entry["at"] if s == largest)
        naive_peak = max(n for s, _, n in entry["at"] if s == largest)
        k_fused = growth_exponent(entry["fused"])
        k_naive = growth_exponent(entry["naive"])
        linear = None if k_fused is None else k_fused <= GOAL_LINEAR_EXPONENT
        smallest = min(s for s, _, _ in entry["at"])
        out.append(([f"`{name}`", str(suite), dtype, str(d), f"{smallest}–{largest}",
                     str(largest), _mib(fused_peak), _mib(naive_peak),
                     ratio(naive_peak / fused_peak) if fused_peak else "–",
                     num(k_fused, 2) if k_fused is not None else "–",
                     num(k_naive, 2) if k_naive is not None else "–"], linear))
    return out


def goal_fused_vs_naive(bench: dict | None, torch_docs: dict[str, dict]) -> list[str]:
    """c: fused faster than naive at every S >= 512 (bench.json), and O(S) extra memory."""
    title = (f"**c. fused faster than naive at every S ≥ {GOAL_NAIVE_MIN_S}, and fused extra "
             "memory O(S)**")
    lines = [title, ""]
    if bench is None:
        lines.append("Time: not evaluated, no bench.json.")
    else:
        ratios = []
        for (suite, dtype, d, causal, s, b, h), impls in by_shape(
                bench.get("results", [])).items():
            naive, fused = impls.get("naive"), impls.get("fused")
            if s is not None and s >= GOAL_NAIVE_MIN_S and ran(naive) and ran(fused):
                ratios.append((naive["ms_median"] / fused["ms_median"],
                               f"{dtype}, suite {suite}, B = {b}, H = {h}, D = {d}, "
                               f"{'causal' if causal else 'non-causal'}, S = {s}"))
        if not ratios:
            lines.append("Time: not evaluated, bench.json has no shape with S ≥ "
                         f"{GOAL_NAIVE_MIN_S} that both the naive and the fused kernels ran.")
        else:
            low, where = min(ratios)
            faster = sum(r > 1 for r, _ in ratios)
            lines.append(f"Time (bench.json): {_verdict(faster == len(ratios))} — fused is "
                         f"faster at {faster} of the {len(ratios)} shapes with S ≥ "
                         f"{GOAL_NAIVE_MIN_S} that both ran; the smallest naive / fused time "
                         f"ratio is {ratio(low)} ({where}).")
    rows = [r for name, doc in torch_docs.items() for r in memory_rows(name, doc)]
    lines.append("")
    if not rows:
        lines.append("Memory: not evaluated, no bench_cuda_*.json with fattn_fused and "
                     "fattn_naive at two or more S.")
        return lines
    linear = [ok for _, ok in rows if ok is not None]
    lines += [table(["file", "suite", "dtype", "D", "S", "largest S both ran",
                     "fused peak MiB", "naive peak MiB", "naive / fused", "fused k", "naive k"],
                    [r for r, _ in rows]), "",
              f"Memory (peak allocated during one call, bench_cuda_*.json): "
              f"{_verdict(bool(linear) and all(linear))} — k is the exponent in "
              f"(peak / (B·H)) ∝ S^k between the smallest and the largest S both ran, causal "
              f"and not together; O(S) means k ≤ {num(GOAL_LINEAR_EXPONENT, 2)} (naive's "
              "S×S score matrix gives k → 2); fused meets it in "
              f"{sum(linear)} of {len(linear)} series."]
    return lines


def goals(bench: dict | None, torch_docs: dict[str, dict]) -> str:
    parts = ["#### The GPU performance goals, evaluated from the data", ""]
    parts += goal_tflops(bench, torch_docs.get(GPU_TORCH_FLASH)) + [""]
    parts += goal_fp32(torch_docs.get(GPU_TORCH_B2H8)) + [""]
    parts += goal_fused_vs_naive(bench, torch_docs)
    return "\n".join(parts)


def section(sources) -> str:
    parts = ["### GPU", ""]
    bench, torch_docs = sources.gpu_bench, sources.gpu_torch
    if bench is None and not sources.gpu_ncu_rows and not torch_docs:
        return "\n".join(parts + [absent(sources.gpu_dir), ""])
    files = [f"`{sources.gpu_dir}/{name}`" for name in
             (["bench.json"] if bench is not None else []) + list(torch_docs)
             + (["ncu_raw.csv"] if sources.gpu_ncu_rows else [])]
    parts += ["From " + ", ".join(files) + " (see the folder's README.md for how each was "
              "made).", ""]
    if bench is not None or torch_docs:
        parts += [goals(bench, torch_docs), ""]
    if bench is not None:
        m = bench.get("machine", {})
        parts += ["#### fattn's naive and fused CUDA kernels", "",
                  f"`{sources.gpu_dir}/bench.json`: {m.get('device', '?')}, driver "
                  f"{m.get('driver', '?')}, CUDA {m.get('cuda', '?')}, {m.get('date', '?')}; "
                  "naive and fused side by side:", "",
                  side_by_side(bench), "",
                  "The evidence files carry no measured GPU ceilings (FMA or tensor-core peak, "
                  "HBM bandwidth), so the H100 roofline is not drawn.", "",
                  "#### 128-row vs 64-row query tiles", "",
                  "Dispatch picks the query-tile height per shape; bench.json times both "
                  f"({', '.join(TILE_IMPLS.values())}) and what dispatch chose (fused), "
                  "float16:", "",
                  tile_table(bench), "",
                  "#### The Hopper wgmma kernel", "",
                  "fused_wgmma and fused_wgmma_pipelined (sm_90a, `src/cuda/fused_wgmma.cuh`: "
                  "its serial and its overlapped schedule) beside the dispatched fused kernel; "
                  "dispatch takes the faster once it wins here (docs/cuda.md):", "",
                  wgmma_table(bench), ""]
    for name, doc in torch_docs.items():
        parts += [f"#### fattn vs PyTorch SDPA on the GPU (`{name}`)", "",
                  sdpa_section(name, doc), ""]
    if sources.gpu_ncu_rows:
        parts += ["#### Nsight Compute", "",
                  f"`{sources.gpu_dir}/ncu_raw.csv` "
                  f"({len(sources.gpu_ncu_rows)} launches profiled):", "",
                  ncu_table(sources.gpu_ncu_rows), ""]
    return "\n".join(parts)
