"""Section 3: the written analysis. Every number is computed from the JSON results."""
from __future__ import annotations

from . import model_section, roofline
from .fmt import num, ratio, size, table

FUSED, SDPA, STANDARD, NAIVE = "fattn_fused", "torch_sdpa", "torch_standard", "fattn_naive"


def query_tile_rows(bench: dict) -> int | None:
    rows = [r["query_tile_rows"] for r in bench["results"] if r.get("query_tile_rows")]
    return rows[0] if rows else None


def cache_bytes(machine: dict, level: str) -> int | None:
    for lv in machine["roofline"]["bandwidth_levels"]:
        if lv["level"] == level:
            return lv["cache_bytes"]
    return None


def softmax_above_dram(bench: dict, d: roofline.Dot, achieved_gbs: float) -> str:
    """Why the softmax can beat the DRAM roof: its passes after the first run over one
    query tile's rows, which stay in cache."""
    machine = bench["machine"]
    bw = roofline.dram_bandwidth(machine)
    br, l2 = query_tile_rows(bench), cache_bytes(machine, "L2")
    if not br or not l2:
        return ""
    tile = br * d.seq * 4  # fp32 scores
    # Of the stage's passes only the first read and the last write must reach DRAM.
    dram_passes = 2
    model_passes = round(model_section.softmax_stage_passes(bench["model"]))
    dram_gbs = achieved_gbs * dram_passes / model_passes
    return (f" — faster than DRAM allows, so not every modelled pass reaches DRAM: the softmax "
            f"makes its {model_passes} passes over one query tile's {br}×{d.seq} scores "
            f"({size(tile)}; L2 holds {size(l2)}) before moving on, so the passes after the "
            f"first read can be served from L2, or L3 where the tile outgrows L2. Counting "
            f"only that read and the final write "
            f"({dram_passes} of {model_passes} passes) as DRAM traffic, it streams "
            f"{num(dram_gbs)} GB/s, {num(100 * dram_gbs / bw)} % of the DRAM triad")


def bound_paragraphs(bench: dict, dots: list[roofline.Dot]) -> str:
    machine = bench["machine"]
    peak, bw = roofline.peak(machine), roofline.dram_bandwidth(machine)
    ridge = roofline.ridge(peak, bw)
    largest = max(d.seq for d in dots)
    lines = [f"DRAM ridge point of this machine: {num(peak)} GFLOP/s / {num(bw)} GB/s = "
             f"**{num(ridge)} FLOP/byte**. At S = {largest}:", ""]
    at_largest = [d for d in dots if d.seq == largest]
    for d in at_largest:
        kind = roofline.bound(d.ai, machine, d.isa)
        share = 100 * d.gflops / roofline.attainable(d.ai, roofline.peak(machine, d.isa), bw)
        achieved_gbs = d.model_bytes / (d.ms * 1e-3) / 1e9
        if kind == "memory":
            detail = (f"it moves its modelled {size(d.model_bytes)} at {num(achieved_gbs)} GB/s, "
                      f"{num(100 * achieved_gbs / bw)} % of the DRAM triad")
            if achieved_gbs > bw and d.kernel == "naive softmax":
                detail += softmax_above_dram(bench, d, achieved_gbs)
        else:
            detail = (f"it runs at {num(100 * d.gflops / roofline.peak(machine, d.isa))} % of "
                      f"the {roofline.peak_name(machine, d.isa)}")
        lines.append(f"- **{d.kernel}**: AI {num(d.ai)} vs ridge {num(ridge)} → "
                     f"**{kind}-bound** by the model; measured {num(d.gflops)} GFLOP/s, "
                     f"{num(share)} % of the roof at its AI; {detail}.")
    by_kernel = {d.kernel: d for d in at_largest}
    softmax, whole = by_kernel.get("naive softmax"), by_kernel.get("naive (3 stages)")
    if softmax and whole:
        lines += ["", f"The softmax stage does {num(100 * softmax.flops / whole.flops)} % as many "
                  f"FLOPs as the two products but takes {num(100 * softmax.ms / whole.ms)} % of "
                  f"the naive time at S = {largest} ({num(softmax.ms)} of {num(whole.ms)} ms): "
                  "it is the memory-bound part of unfused attention, the part fusion removes."]
    others = [d for d in at_largest if d.kernel != "naive softmax"]
    if others and all(roofline.bound(d.ai, machine, d.isa) == "compute" for d in others):
        lines += ["", "The GEMM stages and the fused kernel sit right of the ridge point: what "
                  f"separates them from the {roofline.peak_name(machine)} is the micro-kernel's efficiency, not "
                  "bandwidth."]
    fused = by_kernel.get("fused")
    if fused and fused.isa == "amx" and roofline.amx_roof(machine):
        lines += ["", f"The AMX float32 roof counts the tile products alone "
                  f"({num(roofline.peak(machine, 'amx'))} GFLOP/s, against the FMA peak's "
                  f"{num(machine['fma_peak_gflops'])}). The amx kernels also split every operand "
                  "into its bfloat16 parts and run the softmax on the AVX-512 units, and on this "
                  "CPU that vector work did not overlap with the tile unit (docs/perf-log.md, "
                  "\"AMX backward\"): it, not bandwidth, keeps the fused kernel at "
                  f"{num(100 * fused.gflops / roofline.peak(machine, 'amx'))} % of that roof, "
                  f"{num(100 * fused.gflops / machine['fma_peak_gflops'])} % of the FMA peak."]
    reread = by_kernel.get(roofline.FUSED_REREAD)
    if reread and roofline.bound(reread.ai, machine, reread.isa) == "compute":
        lines += ["", f"Even if K and V came from DRAM once per query tile (the pessimistic "
                  f"model), the fused kernel's AI at S = {largest} would be {num(reread.ai)}, "
                  f"still right of the ridge point ({num(ridge)}): its cache assumption does "
                  "not decide its place on this machine's roofline."]
    return "\n".join(lines)


def pick(results, impl, d, causal, seq):
    for r in results:
        if (r["impl"] == impl and r["D"] == d and bool(r["causal"]) == causal and r["Sq"] == seq
                and not r.get("skipped")):
            return r
    return None


def sdpa_gap(torch_doc: dict) -> tuple[str, list[float]]:
    results = torch_doc["results"]
    cells = sorted({(r["D"], bool(r["causal"])) for r in results})
    rows, speedups = [], []
    for d, causal in cells:
        for seq in sorted({r["Sq"] for r in results if r["D"] == d}):
            fused, sdpa = pick(results, FUSED, d, causal, seq), pick(results, SDPA, d, causal, seq)
            if not fused or not sdpa:
                continue
            standard = pick(results, STANDARD, d, causal, seq)
            factor = sdpa["ms_median"] / fused["ms_median"]
            speedups.append(factor)
            rows.append([str(d), "yes" if causal else "no", str(seq), num(sdpa["ms_median"]),
                         num(fused["ms_median"]),
                         num(standard["ms_median"]) if standard else "–",
                         ratio(factor) + (" faster" if factor >= 1 else " slower"),
                         ratio(standard["ms_median"] / fused["ms_median"]) if standard else "–"])
    header = ["D", "causal", "S", "SDPA ms", "fattn ms", "standard ms", "fattn vs SDPA",
              "standard / fattn"]
    return table(header, rows), speedups


def sdpa_kernel(launches: dict) -> str:
    names = sorted({n for r in launches["results"] if r["impl"] == SDPA
                    for n in r["compute_op_names"]})
    return ", ".join(f"`{n}`" for n in names) or "(no SDPA run in the launch counts)"


def memory_growth(torch_doc: dict) -> dict[str, tuple[dict, dict]]:
    """impl → (first, last) non-causal result of the smallest D, by S; extra_bytes is
    fattn::extra_bytes for fattn and the peak-RSS rise of one call for torch."""
    results = torch_doc["results"]
    out = {}
    for impl in (STANDARD, SDPA, FUSED):
        rows = [r for r in results if r["impl"] == impl and not r["causal"]
                and not r.get("skipped") and r.get("extra_bytes") is not None]
        if not rows:
            continue
        d = min(r["D"] for r in rows)
        rows = sorted((r for r in rows if r["D"] == d), key=lambda r: r["Sq"])
        out[impl] = (rows[0], rows[-1])
    return out


def growth(pair: tuple[dict, dict]) -> float:
    first, last = pair
    return last["extra_bytes"] / max(first["extra_bytes"], 1)


def memory_text(torch_doc: dict) -> str:
    grown = memory_growth(torch_doc)
    if not grown:
        return "(the torch results carry no memory figures)"
    lines = [f"- {impl}: {size(a['extra_bytes'])} at S = {a['Sq']} → {size(b['extra_bytes'])} "
             f"at S = {b['Sq']} (D = {a['D']}; ×{num(growth((a, b)))} for "
             f"×{num(b['Sq'] / a['Sq'])} in S)" for impl, (a, b) in grown.items()]
    if STANDARD in grown and FUSED in grown:
        s_factor = grown[STANDARD][1]["Sq"] / grown[STANDARD][0]["Sq"]
        lines += ["", f"Standard attention's memory grew ×{num(growth(grown[STANDARD]))} for "
                  f"×{num(s_factor)} in S (S² would be ×{num(s_factor ** 2)}), fattn's fused "
                  f"kernel's ×{num(growth(grown[FUSED]))} (per-thread tiles and K re-laid into "
                  "panels: at most linear in S). At the same AI, a long-context model pays for "
                  "each doubling of an unfused context with four times the memory and four "
                  "times the traffic, and stays on the bandwidth roof of any machine whose "
                  "ridge point lies above the unfused AI limit of §1; fused, the traffic "
                  "grows only linearly and the kernel moves further right on the roofline the "
                  "longer the context."]
    return "\n".join(lines)


def fusion_table(bench: dict) -> str:
    rows = []
    by_seq = {}
    for r in bench["results"]:
        if not r["causal"] and r["impl"] in ("naive", "fused"):
            by_seq.setdefault(r["Sq"], {})[r["impl"]] = r
    for seq in sorted(by_seq):
        pair = by_seq[seq]
        if "naive" not in pair or "fused" not in pair:
            continue
        n, f = pair["naive"], pair["fused"]
        rows.append([str(seq), ratio(n["model_bytes"] / f["model_bytes"]),
                     f"{num(n['ai_model'])} → {num(f['ai_model'])}",
                     ratio(n["ms_median"] / f["ms_median"]),
                     f"{size(n['extra_bytes'])} → {size(f['extra_bytes'])}"])
    return table(["S", "DRAM traffic naive / fused (model)", "AI naive → fused",
                  "time naive / fused (measured)", "working memory naive → fused"], rows)


def section(sources) -> str:
    bench, torch_doc = sources.bench, sources.torch
    machine = bench["machine"]
    dots = roofline.dots(bench)
    gap, speedups = sdpa_gap(torch_doc)
    tm = torch_doc["machine"]
    gap_summary = (f"fattn's fused kernel against `F.scaled_dot_product_attention`: from "
                   f"{ratio(min(speedups))} to {ratio(max(speedups))} (SDPA time / fattn time; "
                   "above 1 fattn is faster)" if speedups else "no paired runs")
    return "\n".join([
        "## 3. Analysis",
        "",
        "### Memory- or compute-bound, kernel by kernel",
        "",
        bound_paragraphs(bench, dots),
        "",
        "### The gap to PyTorch's `F.scaled_dot_product_attention`",
        "",
        f"torch {tm['torch_version']}, {tm['threads']} threads, float32, {tm['date']} "
        f"(`python -m fattn.bench`): {gap_summary}.",
        "",
        gap,
        "",
        "Which optimisations PyTorch applies: on the CPU, SDPA dispatches to "
        f"{sdpa_kernel(sources.launches)} (the one compute operator torch.profiler records "
        "for it, §4), ATen's FlashAttention-style kernel "
        "(aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): queries and keys in blocks, "
        "an online softmax so that the S×S matrix is never stored, the two products of each "
        "block done by its BLAS GEMM (cpublas), the exp and the row sum fused in one "
        "vectorised pass, work split over batch × heads × query blocks with at::parallel_for, "
        "and blocks of keys past the causal diagonal skipped. Standard attention — matmul, "
        "scale, softmax, matmul — gets none of this: each operator is a full pass over the "
        "S×S matrix in memory.",
        "",
        "### AI against S, and long contexts",
        "",
        "The model (§1) gives the fused kernel an AI that grows linearly with S and the "
        "unfused one an AI capped by D. Memory tells the same story — the extra memory one "
        "call needs, non-causal (fattn: `fattn::extra_bytes`; torch: the rise of the peak "
        "RSS over one call):",
        "",
        memory_text(torch_doc),
        "",
        "### The impact of fusion",
        "",
        f"fattn's naive and fused kernels share their micro-kernels, so the difference is "
        f"fusion alone (fattn-bench, {machine['threads']} threads, D = "
        f"{bench['results'][0]['D']}, non-causal):",
        "",
        fusion_table(bench),
        "",
    ])
