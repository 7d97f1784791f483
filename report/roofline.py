"""The CPU roofline: ceilings from fattn-bench's machine.roofline, kernels as dots at
(modelled AI, measured GFLOP/s), and the plot."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .fmt import num  # noqa: E402

STAGE_LABELS = {"qk_gemm": "naive Q·Kᵀ", "softmax": "naive softmax", "pv_gemm": "naive P·V"}
FUSED_REREAD = "fused, K/V re-read model"
KERNEL_ORDER = ("naive Q·Kᵀ", "naive softmax", "naive P·V", "naive (3 stages)", "fused",
                FUSED_REREAD)
COLOURS = {"naive Q·Kᵀ": "tab:orange", "naive softmax": "tab:red", "naive P·V": "tab:brown",
           "naive (3 stages)": "tab:purple", "fused": "tab:green", FUSED_REREAD: "tab:olive"}


@dataclass
class Dot:
    kernel: str      # one of KERNEL_ORDER
    seq: int         # S (= Sq = Sk)
    ai: float        # modelled FLOP per DRAM byte
    gflops: float    # measured
    ms: float        # measured median
    model_bytes: int
    flops: int
    isa: str = ""    # the kernels' ISA for this result (fattn-bench's per-row "isa")


def amx_roof(machine: dict) -> dict | None:
    """fattn-bench's AMX ceilings (bf16_gflops, fp32_split_gflops), where measured."""
    return machine.get("roofline", {}).get("amx")


def on_amx_roof(machine: dict, isa: str | None = None) -> bool:
    """Whether an ISA's kernels (default: the run's) take the AMX roof: amx kernels on a
    machine whose AMX ceilings were measured."""
    return (isa or machine.get("isa")) == "amx" and amx_roof(machine) is not None


def peak(machine: dict, isa: str | None = None) -> float:
    """The compute roof of an ISA's kernels (default: the run's): the AMX tile peak over
    the partial products of the three-part split for the amx kernels, else the FMA peak."""
    if on_amx_roof(machine, isa):
        return amx_roof(machine)["fp32_split_gflops"]
    return machine["fma_peak_gflops"]


def peak_name(machine: dict, isa: str | None = None) -> str:
    if on_amx_roof(machine, isa):
        return (f"AMX float32 roof (the bfloat16 tile peak / "
                f"{amx_roof(machine)['partial_products']})")
    return "FMA peak"


def dram_bandwidth(machine: dict) -> float:
    return machine["bandwidth_gbs"]


def read_bandwidth(machine: dict) -> dict | None:
    """The DRAM read-only stream (decode's roof) on all threads and on one, with the
    buffer it read; None in files written before fattn-bench measured it."""
    if "read_bandwidth_gbs" not in machine:
        return None
    return {"all_threads_gbs": machine["read_bandwidth_gbs"],
            "one_thread_gbs": machine["read_bandwidth_one_thread_gbs"],
            "buffer_mib": machine["read_bandwidth_buffer_mib"],
            "isa": machine["read_bandwidth_isa"]}


def ridge(peak_gflops: float, bandwidth_gbs: float) -> float:
    """AI at which the bandwidth roof meets the compute roof."""
    return peak_gflops / bandwidth_gbs


def attainable(ai: float, peak_gflops: float, bandwidth_gbs: float) -> float:
    return min(peak_gflops, ai * bandwidth_gbs)


def bound(ai: float, machine: dict, isa: str | None = None) -> str:
    """'memory' or 'compute', against the DRAM roof (the model counts DRAM bytes)."""
    return "memory" if ai < ridge(peak(machine, isa), dram_bandwidth(machine)) else "compute"


def dots(bench: dict) -> list[Dot]:
    """Non-causal results: fused, naive as a whole and each naive stage; the fused kernel
    also at the AI of its pessimistic model (K and V re-read from DRAM per query tile)."""
    out = []
    run_isa = bench["machine"].get("isa", "")
    for r in bench["results"]:
        if r["causal"] or r["Sq"] != r["Sk"] or r["impl"] not in ("naive", "fused"):
            continue
        kernel = "fused" if r["impl"] == "fused" else "naive (3 stages)"
        isa = r.get("isa", run_isa)
        out.append(Dot(kernel, r["Sq"], r["ai_model"], r["gflops"], r["ms_median"],
                       r["model_bytes"], r["flops"], isa))
        if r["impl"] == "fused" and r.get("fused_ai_kv_reread"):
            reread_bytes = round(r["flops"] / r["fused_ai_kv_reread"])
            out.append(Dot(FUSED_REREAD, r["Sq"], r["fused_ai_kv_reread"], r["gflops"],
                           r["ms_median"], reread_bytes, r["flops"], isa))
        for s in r.get("stages", []):
            out.append(Dot(STAGE_LABELS[s["stage"]], r["Sq"], s["ai_model"], s["gflops"],
                           s["ms_median"], s["model_bytes"], s["flops"], isa))
    return sorted(out, key=lambda d: (KERNEL_ORDER.index(d.kernel), d.seq))


def _peak_labels(peaks: list[dict]) -> list[tuple[float, str]]:
    """One label per distinct roof: peaks within 10 % of each other share it."""
    labels: list[tuple[float, str]] = []
    for p in sorted(peaks, key=lambda p: -p["gflops"]):
        text = f"{p['isa']} {num(p['gflops'])}"
        if labels and p["gflops"] > 0.9 * labels[-1][0]:
            labels[-1] = (labels[-1][0], labels[-1][1] + " / " + text)
        else:
            labels.append((p["gflops"], text))
    return labels


def plot(path: Path, machine: dict, kernel_dots: list[Dot], title: str) -> None:
    roof = machine["roofline"]
    # The roofs drawn: every FMA peak, and the AMX kernels' float32 roof where measured.
    peaks = list(roof["fma_peaks"])
    amx = amx_roof(machine)
    if amx:
        peaks.append({"isa": f"amx float32 (bf16 tiles / {amx['partial_products']})",
                      "gflops": amx["fp32_split_gflops"]})
    top = max(p["gflops"] for p in peaks)
    ai_values = [d.ai for d in kernel_dots] or [1.0]
    x_lo = min(0.05, min(ai_values) / 2)
    x_hi = max(2e3, max(ai_values) * 2)
    y_lo = min([d.gflops for d in kernel_dots] + [top]) / 4
    fig, ax = plt.subplots(figsize=(9, 6))
    for p in peaks:
        ax.axhline(p["gflops"], color="0.35", lw=1, ls="--")
    for gflops, text in _peak_labels(peaks):
        ax.text(x_hi / 1.2, gflops * 1.04, f"{text} GFLOP/s", ha="right", va="bottom", fontsize=8)
    in_use = peak(machine)
    for i, level in enumerate(roof["bandwidth_levels"]):
        bw = level["bandwidth_gbs"]
        x_ridge = ridge(in_use, bw)
        ax.plot([x_lo, x_ridge], [x_lo * bw, in_use], color="0.55", lw=1)
        ax.plot([x_ridge], [in_use], marker="o", color="0.2", ms=3)
        # On the line, inside the plot; further up its line when the level above has
        # nearly the same bandwidth (a guest's L3 and DRAM), so both labels stay legible.
        levels = roof["bandwidth_levels"]
        crowded = i > 0 and levels[i - 1]["bandwidth_gbs"] < 1.5 * bw
        x_text = max(x_lo * 1.1, y_lo * 1.5 / bw) * (3.0 if crowded else 1.0)
        ax.text(x_text * 1.08, x_text * bw, f"{level['level']} {num(bw)} GB/s", fontsize=8,
                color="0.3", va="top")
        # Above the compute roof, one row per level: below it sit the kernels' dots.
        ax.annotate(f"ridge {level['level']} {num(x_ridge)}", (x_ridge, in_use),
                    textcoords="offset points", xytext=(0, 5 + 9 * i), ha="center",
                    fontsize=7, color="0.3")
    for kernel in KERNEL_ORDER:
        mine = [d for d in kernel_dots if d.kernel == kernel]
        if not mine:
            continue
        hollow = kernel == FUSED_REREAD
        ax.scatter([d.ai for d in mine], [d.gflops for d in mine], label=kernel, zorder=3, s=28,
                   facecolors="none" if hollow else COLOURS[kernel], edgecolors=COLOURS[kernel])
        # The smallest and largest S only, and none on the hollow dots (they share the
        # filled fused dots' S): the table beside the plot has every value.
        ends = set() if hollow else {min(d.seq for d in mine), max(d.seq for d in mine)}
        for d in mine:
            if d.seq in ends:
                ax.annotate(f"S={d.seq}", (d.ai, d.gflops), textcoords="offset points",
                            xytext=(5, -3), fontsize=7, color=COLOURS[kernel])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, top * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte, modelled)")
    ax.set_ylabel("GFLOP/s (measured)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
