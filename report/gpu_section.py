"""The GPU part of section 2, from the evidence files of scripts/gpu-check.sh where they
are committed: bench.json (gpu/gpu_bench.cu) and ncu_raw.csv (Nsight Compute)."""
from __future__ import annotations

from .fmt import num, ratio, table

# ncu metrics of the Speed-of-Light section (scripts/gpu-check.sh).
NCU_MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
NCU_SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
NCU_KERNEL = "Kernel Name"


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


def side_by_side(bench: dict) -> str:
    """Naive vs fused GPU times for each shape both ran."""
    key = lambda r: (r.get("dtype"), r.get("D"), bool(r.get("causal")), r.get("Sq"))  # noqa: E731
    by_shape: dict[tuple, dict] = {}
    for r in bench.get("results", []):
        by_shape.setdefault(key(r), {})[r.get("impl")] = r
    rows = []
    for shape in sorted(by_shape, key=lambda k: tuple(str(x) for x in k[:1]) + k[1:]):
        pair = by_shape[shape]
        if "naive" in pair and "fused" in pair:
            n, f = pair["naive"], pair["fused"]
            rows.append([str(shape[0]), str(shape[1]), "yes" if shape[2] else "no", str(shape[3]),
                         num(n["ms_median"]), num(f["ms_median"]),
                         ratio(n["ms_median"] / f["ms_median"]), num(f["gflops"])])
    if not rows:
        return "(no shape was run by both the naive and the fused GPU kernels)"
    return table(["dtype", "D", "causal", "S", "naive ms", "fused ms", "naive / fused",
                  "fused GFLOP/s"], rows)


def section(sources) -> str:
    parts = ["### GPU", ""]
    if sources.gpu_bench is None and not sources.gpu_ncu_rows:
        return "\n".join(parts + [absent(sources.gpu_dir), ""])
    if sources.gpu_bench is not None:
        m = sources.gpu_bench.get("machine", {})
        parts += [f"`{sources.gpu_dir}/bench.json`: {m.get('device', '?')}, "
                  f"{m.get('date', '?')}; naive and fused side by side:", "",
                  side_by_side(sources.gpu_bench), "",
                  "The evidence files carry no measured GPU ceilings (FMA or tensor-core peak, "
                  "HBM bandwidth), so the H100 roofline is not drawn.", ""]
    if sources.gpu_ncu_rows:
        parts += [f"Nsight Compute, `{sources.gpu_dir}/ncu_raw.csv` "
                  f"({len(sources.gpu_ncu_rows)} launches profiled):", "",
                  ncu_table(sources.gpu_ncu_rows), ""]
    return "\n".join(parts)
