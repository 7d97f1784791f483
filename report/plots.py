"""The report's plots besides the roofline: time and memory vs S (standard attention vs
torch SDPA vs fattn), and the operator counts of torch.profiler."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IMPL_STYLE = {  # label, colour, line style
    "torch_standard": ("standard (matmul, softmax, matmul)", "tab:red", "-"),
    "torch_sdpa": ("torch SDPA", "tab:blue", "-"),
    "fattn_fused": ("fattn fused", "tab:green", "-"),
    "fattn_naive": ("fattn naive", "tab:purple", "--"),
}


def panels(results: list[dict]) -> list[tuple[int, bool]]:
    """The (D, causal) pairs present, in order."""
    return sorted({(r["D"], bool(r["causal"])) for r in results})


def series(results: list[dict], impl: str, d: int, causal: bool, key: str):
    """(S, value) of the runs of one impl that were not skipped, by S."""
    rows = [r for r in results if r["impl"] == impl and r["D"] == d and bool(r["causal"]) == causal
            and not r.get("skipped") and r.get(key) is not None]
    rows.sort(key=lambda r: r["Sq"])
    return [r["Sq"] for r in rows], [r[key] for r in rows]


def _grid(results, key, scale, ylabel, path: Path, title: str) -> None:
    cells = panels(results)
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], cells):
        for impl, (label, colour, style) in IMPL_STYLE.items():
            xs, ys = series(results, impl, d, causal, key)
            if xs:
                ax.plot(xs, [y * scale for y in ys], style, color=colour, marker="o", ms=3,
                        label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"D={d}, {'causal' if causal else 'non-causal'}", fontsize=9)
        ax.set_xlabel("S")
        ax.grid(True, which="both", alpha=0.2)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def time_vs_s(results: list[dict], path: Path, title: str) -> None:
    _grid(results, "ms_median", 1.0, "median time per call (ms)", path, title)


def memory_vs_s(results: list[dict], path: Path, title: str) -> None:
    mib = 1.0 / (1 << 20)
    _grid(results, "extra_bytes", mib,
          "extra memory per call (MiB)\nfattn: fattn::extra_bytes; torch: peak-RSS rise", path,
          title)


def launch_counts(results: list[dict], path: Path, title: str) -> None:
    rows = sorted(results, key=lambda r: (r["S"], r["causal"], r["impl"]))
    labels = [f"{r['impl']}\nS={r['S']}{' causal' if r['causal'] else ''}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["top_level_ops"] for r in rows], 0.4,
           label="operators called")
    ax.bar([x + 0.2 for x in xs], [r["compute_ops"] for r in rows], 0.4,
           label="compute operators (passes over memory)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("count per call")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
