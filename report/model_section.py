"""Section 1: the arithmetic-intensity model, with the working, from fattn-bench's
"model" table (bench/model.hpp)."""
from __future__ import annotations

from .fmt import integer, num, plain, table

STAGES = ("qk_gemm", "softmax", "pv_gemm")


def row(model: list[dict], dtype: str, seq: int, impl: str, stage: str = "total") -> dict:
    for r in model:
        if r["dtype"] == dtype and r["S"] == seq and r["impl"] == impl and r["stage"] == stage:
            return r
    raise KeyError(f"model table has no row dtype={dtype} S={seq} impl={impl} stage={stage}")


def seqs(model: list[dict]) -> list[int]:
    return sorted({r["S"] for r in model})


def dtypes(model: list[dict]) -> list[str]:
    return sorted({r["dtype"] for r in model}, key=lambda d: -row(model, d, seqs(model)[0],
                                                                    "fused")["element_bytes"])


def score_passes(model: list[dict], dtype: str, seq: int) -> float:
    """Passes the naive path makes over the S×S scores: score bytes / (e·S²)."""
    r = row(model, dtype, seq, "naive")
    return r["traffic_bytes"]["scores"] / (r["element_bytes"] * seq * seq)


def naive_limit(model: list[dict], dtype: str) -> float:
    """Naive AI as S → ∞: 4·S²·D FLOPs over passes·e·S² bytes = 4·D / (passes·e)."""
    seq = seqs(model)[-1]
    r = row(model, dtype, seq, "naive")
    return 4 * r["D"] / (score_passes(model, dtype, seq) * r["element_bytes"])


def softmax_per_score(model: list[dict]) -> dict[str, float]:
    """The model's softmax FLOPs per score, by kind (max, exp, sum, scale)."""
    r = row(model, dtypes(model)[0], seqs(model)[0], "naive")
    return {kind: count / (r["S"] * r["S"]) for kind, count in r["softmax_flops"].items()}


def softmax_stage_passes(model: list[dict]) -> float:
    """Passes the naive softmax stage makes over the scores."""
    r = row(model, dtypes(model)[0], seqs(model)[0], "naive", "softmax")
    return r["traffic_bytes"]["scores"] / (r["element_bytes"] * r["S"] * r["S"])


def ai_table(model: list[dict]) -> str:
    header = ["dtype", "S", "naive Q·Kᵀ", "naive softmax", "naive P·V", "naive (all)", "fused",
              "fused, K/V re-read per query tile"]
    rows = []
    for dtype in dtypes(model):
        for seq in seqs(model):
            stages = [num(row(model, dtype, seq, "naive", s)["ai"]) for s in STAGES]
            rows.append([dtype, str(seq), *stages,
                         num(row(model, dtype, seq, "naive")["ai_matmul_only"]),
                         num(row(model, dtype, seq, "fused")["ai_matmul_only"]),
                         num(row(model, dtype, seq, "fused_kv_reread")["ai_matmul_only"])])
    return table(header, rows)


def working(model: list[dict], dtype: str, seq: int) -> str:
    qk = row(model, dtype, seq, "naive", "qk_gemm")
    sm = row(model, dtype, seq, "naive", "softmax")
    pv = row(model, dtype, seq, "naive", "pv_gemm")
    naive = row(model, dtype, seq, "naive")
    fused = row(model, dtype, seq, "fused")
    e, d = naive["element_bytes"], naive["D"]
    soft = naive["softmax_flops"]
    soft_total = sum(soft.values())
    t = qk["traffic_bytes"]
    lines = [
        f"**S = {seq}, D = {d}, {dtype} (e = {e} bytes), B = H = 1:**",
        "",
        f"- FLOPs: Q·Kᵀ 2·S²·D = {integer(qk['matmul_flops'])}, P·V the same; "
        f"4·S²·D = {integer(naive['matmul_flops'])}. Softmax, apart: max "
        f"{integer(soft['max'])}, exp {integer(soft['exp'])}, sum {integer(soft['sum'])}, "
        f"scale {integer(soft['scale'])} = {integer(soft_total)} "
        f"({num(100 * soft_total / naive['matmul_flops'], 2)} % of the matmul FLOPs).",
        f"- Naive Q·Kᵀ: read Q {integer(t['Q'])} B + K {integer(t['K'])} B, write S "
        f"{integer(t['scores'])} B = {integer(qk['bytes'])} B → AI = "
        f"{integer(qk['matmul_flops'])} / {integer(qk['bytes'])} = **{num(qk['ai'])}**.",
        f"- Naive softmax: {plain(sm['traffic_bytes']['scores'] / (e * seq * seq))} passes over "
        f"S×S = {integer(sm['bytes'])} B for {integer(soft_total)} FLOPs → AI = "
        f"**{num(sm['ai'])}**.",
        f"- Naive P·V: read P {integer(pv['traffic_bytes']['scores'])} B + V "
        f"{integer(pv['traffic_bytes']['V'])} B, write O {integer(pv['traffic_bytes']['O'])} B "
        f"= {integer(pv['bytes'])} B → AI = **{num(pv['ai'])}**.",
        f"- Naive, all three: {integer(naive['bytes'])} B → AI = "
        f"{integer(naive['matmul_flops'])} / {integer(naive['bytes'])} = "
        f"**{num(naive['ai_matmul_only'])}** (with the softmax FLOPs {num(naive['ai'])}).",
        f"- Fused: Q + K + V + O once = {integer(fused['bytes'])} B → AI = "
        f"{integer(fused['matmul_flops'])} / {integer(fused['bytes'])} = "
        f"**{num(fused['ai_matmul_only'])}**.",
    ]
    return "\n".join(lines)


def trend(model: list[dict], dtype: str, ridge_dram: float) -> str:
    first, last = seqs(model)[0], seqs(model)[-1]
    n0 = row(model, dtype, first, "naive")["ai_matmul_only"]
    n1 = row(model, dtype, last, "naive")["ai_matmul_only"]
    f0 = row(model, dtype, first, "fused")["ai_matmul_only"]
    f1 = row(model, dtype, last, "fused")["ai_matmul_only"]
    passes = score_passes(model, dtype, last)
    d = row(model, dtype, last, "fused")["D"]
    e = row(model, dtype, last, "fused")["element_bytes"]
    direction = lambda a, b: "increases" if b > a else "decreases"  # noqa: E731
    above = [s for s in seqs(model) if row(model, dtype, s, "fused")["ai_matmul_only"] > ridge_dram]
    crossing = (f"it is above this machine's DRAM ridge point ({num(ridge_dram)} FLOP/byte) from "
                f"S = {above[0]} in this table" if above else
                f"it stays below this machine's DRAM ridge point ({num(ridge_dram)} FLOP/byte)")
    naive_side = ("above" if naive_limit(model, dtype) > ridge_dram else "below")
    return (
        f"**Trend ({dtype}).** From S = {first} to S = {last} the fused AI {direction(f0, f1)} "
        f"{num(f1 / f0)}-fold ({num(f0)} → {num(f1)}): its FLOPs grow as S² and its traffic "
        f"as S (AI = 4·S²·D / (4·S·D·e) = S/e, here S/{e}); {crossing}. The naive AI "
        f"{direction(n0, n1)} only {num(n1 / n0)}-fold ({num(n0)} → {num(n1)}) and saturates: "
        f"its traffic is dominated by {plain(passes)} passes over the S² scores, so AI → "
        f"4·D / ({plain(passes)}·e) = {num(naive_limit(model, dtype))} for D = {d} — "
        f"{naive_side} the DRAM ridge point, whatever S. The naive softmax stage stays at "
        f"{num(row(model, dtype, last, 'naive', 'softmax')['ai'])} FLOP/byte at every S: "
        "pure streaming.")


def machine_note(model: list[dict], dtype: str, ridge_dram: float) -> str:
    limit = naive_limit(model, dtype)
    if limit > ridge_dram:
        return (f"On this machine (DRAM ridge point {num(ridge_dram)} FLOP/byte) even the "
                f"unfused limit ({num(limit)} in {dtype}) lies right of the ridge: with few "
                "cores, FLOPs are scarcer than bandwidth.")
    return (f"On this machine (DRAM ridge point {num(ridge_dram)} FLOP/byte) the unfused "
            f"limit ({num(limit)} in {dtype}) lies left of the ridge: unfused attention is "
            "memory-bound here at every S.")


def section(model: list[dict], ridge_dram: float) -> str:
    first, last = seqs(model)[0], seqs(model)[-1]
    fp32 = dtypes(model)[0]
    per_score = softmax_per_score(model)
    parts = [
        "## 1. Arithmetic intensity: the derivation",
        "",
        "AI = FLOPs / bytes moved to and from DRAM. FLOPs: two matrix products of 2·D FLOPs "
        "per (query, key) pair; the softmax's max "
        f"({plain(per_score['max'])} per score), exp ({plain(per_score['exp'])}: subtract the "
        f"max, exponentiate), sum ({plain(per_score['sum'])}) and scale "
        f"({plain(per_score['scale'])}: by 1/√D and by 1/rowsum) are counted apart. "
        "Bytes: every read and write of every tensor — Q, K, V, O (S·D each), the S×S scores "
        "and probabilities, the logsumexp — at e bytes an element (4 for fp32, 2 for a 16-bit "
        "type; the logsumexp is float32). The naive path is fattn's three stages "
        "(src/cpu/forward/naive.hpp): Q·Kᵀ writes S; the softmax reads S for the max, reads S and "
        "writes P for the exponentials, reads and writes P to normalise; P·V reads P. The "
        "fused kernel reads Q, K, V and writes O once; it assumes a query tile's working set "
        "(Br query rows, a Bc-key tile of K and V, the Br×Bc scores) stays in L1/L2 and that "
        "the K and V of one head, streamed again by every query tile, come from L2/L3, not "
        "DRAM. The last column drops that assumption: K and V re-read from DRAM once per "
        "query tile. The table is for B = H = 1 (AI does not depend on them) with no "
        "logsumexp stored; storing it adds 4 bytes per query row to the softmax stage and to "
        "the fused kernel. The model and its hand-worked unit tests: bench/model.hpp, "
        "bench/test_model.cpp. AI below counts the matmul FLOPs for whole kernels and each "
        "stage's own FLOPs for the stages.",
        "",
        ai_table(model),
        "",
        "### The working",
        "",
        working(model, fp32, first),
        "",
        working(model, fp32, last),
        "",
        trend(model, fp32, ridge_dram),
        "",
    ]
    for dtype in dtypes(model)[1:]:
        parts += [trend(model, dtype, ridge_dram), ""]
    parts += [
        "**What it implies.** Fusion changes the kind of kernel attention is: unfused, its "
        "traffic is quadratic in S and its AI is capped by D whatever the sequence length; "
        "fused, the traffic is linear and the AI grows with S, so long sequences become "
        "compute-bound. A 16-bit type halves every byte count and doubles every AI. "
        + machine_note(model, fp32, ridge_dram) +
        " A machine whose ridge point lies "
        "above that limit — more cores per memory channel, or a GPU — runs unfused "
        "attention memory-bound at every S, and there fusion is the difference between the "
        "bandwidth roof and the compute roof.",
        "",
    ]
    return "\n".join(parts)
