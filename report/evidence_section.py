"""Section 2: profiler evidence — the CPU roofline measured by fattn-bench, and the GPU
evidence files where they exist (gpu_section.py)."""
from __future__ import annotations

from . import gpu_section, model_section, roofline
from .fmt import num, plain, size, table

BUSY_CORES = 0.1  # fattn-bench's contention threshold (bench/contention.hpp kBusyCores)



def counters(machine: dict) -> str:
    roof = machine["roofline"]
    if roof["hardware_counters"]:
        return ("Hardware counters are available on this machine "
                f"({roof['hardware_counters_detail']}), but this report does not read them "
                "yet: the traffic below is the model's.")
    return ("**No hardware counters.** fattn-bench opened the CPU-cycles counter through "
            f"perf_event_open and got: `{roof['hardware_counters_detail']}`. These KVM guests "
            "do not virtualise the PMU (`perf stat -e cycles` reports `<not supported>`), so "
            "neither cache misses nor DRAM bytes can be counted: every dot below sits at its "
            "*modelled* AI and its *measured* GFLOP/s.")


def contention(machine: dict, results: list[dict]) -> str:
    busy_results = [r for r in results if r["other_processes_cores"] > BUSY_CORES]
    worst = max([machine["other_processes_cores_ceilings"], machine["other_processes_cores_sweep"]])
    if worst <= BUSY_CORES and not busy_results:
        return (f"The machine was quiet: other processes used "
                f"{num(machine['other_processes_cores_ceilings'], 2)} cores during the ceilings "
                f"and {num(machine['other_processes_cores_sweep'], 2)} during the sweep.")
    return (f"**The machine was busy during this run**: other processes used "
            f"{num(machine['other_processes_cores_ceilings'], 2)} cores during the ceilings and "
            f"{num(machine['other_processes_cores_sweep'], 2)} during the sweep "
            f"({len(busy_results)} of {len(results)} timings above {BUSY_CORES} core), on "
            f"{machine['threads']} cores. Ceilings and timings are understated; "
            "`scripts/report.sh` on a quiet machine replaces them.")


def read_roof(machine: dict) -> str:
    """The read-only stream beside the triad: the roof of decode, which reads its KV cache
    and writes almost nothing (fattn-bench --decode reports against it)."""
    lead = ("DRAM read bandwidth (a read-only stream: the roof of decode, which reads its KV "
            "cache and writes almost nothing; `fattn-bench --decode` reports against it): ")
    read = roofline.read_bandwidth(machine)
    if read is None:
        return lead + ("not measured in this run (this fattn-bench.json predates "
                       "`read_bandwidth_gbs`).")
    return lead + (f"{num(read['all_threads_gbs'])} GB/s on all {machine['threads']} threads, "
                   f"{num(read['one_thread_gbs'])} GB/s on one, summing floats in "
                   f"{read['isa']} vectors over {size(read['buffer_mib'] * 2**20)}; the triad "
                   f"beside it: {num(roofline.dram_bandwidth(machine))} GB/s.")


def ceilings_tables(machine: dict) -> str:
    roof = machine["roofline"]
    in_use = roofline.peak(machine)
    # The FMA loops' ISA: the kernels' own, or avx512's for the amx kernels (fattn-bench
    # writes it as fma_peak_isa since the AMX kernels; older files have only "isa").
    fma_isa = machine.get("fma_peak_isa", machine["isa"])
    amx = roofline.amx_roof(machine)
    kernels_on_amx = roofline.on_amx_roof(machine)
    rows = [[f"{p['isa']} FMA", num(p["gflops"]),
             "the kernels' vector work" if kernels_on_amx and p["isa"] == fma_isa
             else "the kernels' ISA" if p["isa"] == fma_isa else ""]
            for p in roof["fma_peaks"]]
    if amx:
        rows += [["amx bfloat16 tiles", num(amx["bf16_gflops"]),
                  "TDPBF16PS, operands in tile registers"],
                 ["amx float32 (3-part split)", num(amx["fp32_split_gflops"]),
                  f"1/{amx['partial_products']} of the above: "
                  + ("the kernels' products" if kernels_on_amx else "the amx kernels' roof")]]
    peaks = table(["compute peak", "GFLOP/s", "note"], rows)
    roof_label = "the AMX float32 roof" if kernels_on_amx else f"{fma_isa} peak"
    levels = table(
        ["level", "cache (one instance)", "shared by CPUs", "triad working set", "GB/s",
         f"ridge point vs {roof_label} (FLOP/byte)"],
        [[lv["level"], size(lv["cache_bytes"]) if lv["cache_bytes"] else "–",
          str(lv["shared_by_cpus"]), size(lv["working_set_bytes"]),
          num(lv["bandwidth_gbs"]) + ("" if lv["distinct"] else " (not beyond the level below)"),
          num(roofline.ridge(in_use, lv["bandwidth_gbs"]))] for lv in roof["bandwidth_levels"]])
    return (f"Ceilings, measured by the same run on all {machine['threads']} threads "
            f"({machine['cpu']}, {machine['date']}): FMA peak = independent FMA chains in "
            "registers, per ISA; "
            + ("AMX = four independent TDPBF16PS on tiles loaded once, its float32 roof the "
               f"bfloat16 rate / {amx['partial_products']} (each float32 product is "
               f"{amx['partial_products']} bfloat16 partial products, src/cpu/amx/ops.hpp); "
               if amx else "")
            + "bandwidth = triad a = b + s·c counting the bytes read and "
            "written (no write-allocate): for the caches on floats in the kernels' "
            f"{fma_isa} vectors, each level's working set half the cache the OS reports "
            "(sysfs; per thread for private caches); for DRAM the STREAM triad on doubles over "
            f"{size(roof['bandwidth_levels'][-1]['working_set_bytes'])}.\n\n"
            f"{peaks}\n\n{levels}\n\n{read_roof(machine)}")


def dots_table(machine: dict, dots: list[roofline.Dot]) -> str:
    bw = roofline.dram_bandwidth(machine)
    rows = []
    for d in dots:
        roof_here = roofline.attainable(d.ai, roofline.peak(machine, d.isa), bw)
        rows.append([d.kernel, str(d.seq), d.isa, num(d.ms), num(d.ai), num(d.gflops),
                     num(roof_here), f"{num(100 * d.gflops / roof_here)} %",
                     roofline.bound(d.ai, machine, d.isa)])
    return table(["kernel", "S", "ISA", "ms", "AI (model)", "GFLOP/s (measured)",
                  "roof at this AI (DRAM; the ISA's compute roof)", "of the roof",
                  "bound by the model"], rows)


def section(sources, figure_path: str) -> str:
    bench = sources.bench
    machine = bench["machine"]
    dots = roofline.dots(bench)
    return "\n".join([
        "## 2. Profiler evidence",
        "",
        "### CPU roofline",
        "",
        counters(machine),
        "",
        contention(machine, bench["results"]),
        "",
        ceilings_tables(machine),
        "",
        f"![CPU roofline]({figure_path})",
        "",
        "Each kernel is a dot at (modelled AI, measured GFLOP/s): fattn's fused kernel, its "
        "naive path as a whole, and each naive stage timed on its own "
        "(`fattn::last_naive_stage_seconds`, the stages being separate parallel loops). "
        f"B = {bench['results'][0].get('B', '?')}, H = {bench['results'][0].get('Hq', '?')}, "
        f"D = {bench['results'][0]['D']}, fp32, non-causal, {machine['threads']} threads, median "
        f"of {machine.get('reps', '?')} runs. The GEMM and whole-kernel dots count matmul "
        "FLOPs, the softmax dot its own FLOPs "
        f"({plain(sum(model_section.softmax_per_score(bench['model']).values()))} per score).",
        "",
        dots_table(machine, dots),
        "",
        gpu_section.section(sources),
    ])
