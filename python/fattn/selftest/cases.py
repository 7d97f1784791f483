"""The grid of calls the selftest runs, per entry: a Case is one call (its shape, dtype and
variants); forward_cases ... backward_cases give each entry's, smaller without a GPU or with
--quick."""
from __future__ import annotations

import dataclasses

import torch

from fattn import dispatch

SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DROPOUT_SEED = 4321


@dataclasses.dataclass(frozen=True)
class Case:
    """One call. q_lens/k_lens: per sequence (dense: all equal); kvcache: k_lens are the
    cache lengths before the append of new_keys keys, page the keys per page (0: one
    contiguous cache per sequence). causal: None, "top_left" or "bottom_right". dropout:
    dropout_p (the stream (DROPOUT_SEED + seed, 0)); seqused: a varlen case whose sequences
    use the first 3/4 of their keys (seqused_k)."""
    entry: str
    label: str
    dtype: torch.dtype
    head_dim: int
    heads: int
    kv_heads: int
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    causal: str | None = None
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    mask: bool = False
    tf32: bool = False
    new_keys: int = 0
    page: int = 0
    seed: int = 0
    dropout: float = 0.0
    seqused: bool = False

    @property
    def name(self) -> str:
        shape = (f"b{len(self.q_lens)} h{self.heads}/{self.kv_heads} "
                 f"q{','.join(map(str, sorted(set(self.q_lens))))} "
                 f"k{','.join(map(str, sorted(set(self.k_lens))))}")
        mode = "+tf32" if self.tf32 else ""
        return f"{self.entry} {SHORT[self.dtype]}{mode} d{self.head_dim} {self.label} {shape}"

    def call(self, arch: str | None) -> dispatch.Call:
        return dispatch.Call(self.entry, dispatch.dtype_name(self.dtype), self.head_dim, arch,
                             self.window, self.softcap != 0.0, self.alibi, self.sinks,
                             self.mask, self.tf32, dropout=self.dropout > 0,
                             seqused_k=self.seqused)

    @property
    def dropout_seed(self) -> int:
        return DROPOUT_SEED + self.seed

    def used_keys(self) -> tuple[int, ...]:
        """The keys each sequence uses: its k_lens, or 3/4 of them with seqused."""
        return tuple(max(1, 3 * n // 4) for n in self.k_lens) if self.seqused else self.k_lens


def _variant_fields(label: str, window: int) -> dict:
    """The Case fields of a labelled variant; window: the left window's width."""
    return {"plain": {}, "causal": {"causal": "top_left"},
            "causal_bottom_right": {"causal": "bottom_right"},
            "window": {"window": (window, window // 4)},
            "sliding_window": {"causal": "bottom_right", "window": (window, 0)},
            "softcap": {"softcap": 5.0}, "alibi": {"alibi": True}, "sinks": {"sinks": True},
            "mask": {"mask": True},
            "dropout": {"causal": "top_left", "dropout": 0.2},
            "seqused_k": {"causal": "bottom_right", "seqused": True},
            "everything": {"causal": "bottom_right", "window": (window, 0), "softcap": 5.0,
                           "alibi": True, "sinks": True}}[label]


def forward_cases(gpu: bool, quick: bool) -> list[Case]:
    """Plain, causal (both alignments), the variants alone and together, a boolean mask,
    float32 (IEEE and TF32): D 64/128/256 at S 2048 on a GPU; D 64 at S 128 otherwise."""
    b, hq, hkv, s, short, w = (2, 16, 4, 2048, 1000, 256) if gpu else (1, 4, 2, 128, 40, 24)
    # Each variant set is a compile of the Triton kernel: every one once at D 128 in
    # bfloat16, the rest in fewer combinations.
    plans = {torch.bfloat16: {64: ["plain", "causal", "causal_bottom_right", "window",
                                   "everything"],
                              128: ["plain", "causal", "causal_bottom_right", "window",
                                    "sliding_window", "softcap", "alibi", "sinks",
                                    "everything", "mask"],
                              256: ["plain", "causal_bottom_right", "everything", "dropout"]},
             torch.float16: {64: ["plain", "causal", "everything"],
                             128: ["plain", "causal_bottom_right", "window", "everything"],
                             256: ["causal", "everything"]}}
    if quick:
        plans = {torch.bfloat16: {64: ["causal", "everything"],
                                  128: ["plain", "causal", "everything", "dropout"]}}
    if not gpu:
        plans = {torch.bfloat16: {64: ["plain", "causal_bottom_right", "everything", "mask",
                                       "dropout"]}}
    cases = []
    for dtype, plan in plans.items():
        for d, labels in plan.items():
            for n, label in enumerate(labels):
                sq = short if label == "causal_bottom_right" else s
                cases.append(Case("forward", label, dtype, d, hq, hkv, (sq,) * b, (s,) * b,
                                  seed=d + n, **_variant_fields(label, w)))
    float32_dims = (128,) if quick else (64, 128) if gpu else (64,)
    modes = (False, True) if gpu else (False,)
    cases += [Case("forward", "causal", torch.float32, d, hq, hkv, (s,) * b, (s,) * b,
                   causal="top_left", tf32=tf32, seed=d)
              for d in float32_dims for tf32 in modes]
    return cases


def varlen_cases(gpu: bool, quick: bool) -> list[Case]:
    """Packed sequences of unequal lengths (one of 17 rows: less than a tile), keys longer
    than queries in the causal case; causal and the window aligned bottom-right per
    sequence."""
    lens, longer, hq, hkv, w = ((1000, 17, 2048, 531), (1200, 40, 2048, 600), 16, 4, 256) \
        if gpu else ((50, 7, 70), (60, 7, 90), 4, 2, 24)
    specs = [  # dtype, head dim, label, key lengths
        (torch.bfloat16, 128, "causal_bottom_right", longer), (torch.float16, 64, "plain", lens),
        (torch.bfloat16, 128, "plain", lens), (torch.float16, 128, "sliding_window", lens),
        (torch.bfloat16, 64, "everything", lens), (torch.float16, 128, "dropout", lens),
        (torch.bfloat16, 64, "seqused_k", longer)]
    if quick or not gpu:
        specs = [specs[0], specs[4], specs[5], specs[6]] if gpu else [specs[0], specs[5], specs[6]]
    return [Case("varlen", label, dtype, d, hq, hkv, lens, k_lens, seed=n,
                 **_variant_fields(label, w))
            for n, (dtype, d, label, k_lens) in enumerate(specs)]


def kvcache_cases(gpu: bool, quick: bool) -> list[Case]:
    """Decode steps on 4k-32k keys: paged with an append, a causal multi-query append, a
    contiguous cache, every variant; small caches without a GPU."""
    lens, hq, hkv, page, w = ((4096, 9000, 16383, 31999), 32, 8, 256, 4096) if gpu else \
        ((100, 300), 4, 2, 64, 48)
    specs = [  # dtype, head dim, label, queries = new keys, page
        (torch.bfloat16, 128, "paged_append", 1, page),
        (torch.float16, 128, "paged_causal_append", 4, page),
        (torch.bfloat16, 64, "contiguous", 1, 0),
        (torch.float16, 128, "paged_everything", 1, page),
        (torch.float16, 128, "paged_append", 1, page),
        (torch.bfloat16, 128, "paged_causal_append", 4, page)]
    if quick:
        specs = specs[:2]
    if not gpu:
        specs = [(torch.bfloat16, 64, "paged_append", 1, page),
                 (torch.float16, 64, "contiguous_causal_append", 2, 0)]
    cases = []
    for n, (dtype, d, label, new, pg) in enumerate(specs):
        fields = {"causal": "bottom_right"} if "causal" in label else {}
        if "everything" in label:
            fields = _variant_fields("everything", w)
        contiguous_read = label == "contiguous"  # no append: the cache as it is
        cases.append(Case("kvcache", label, dtype, d, hq, hkv, (new,) * len(lens), lens,
                          new_keys=0 if contiguous_read else new, page=pg, seed=n, **fields))
    return cases


def backward_cases(gpu: bool, quick: bool) -> list[Case]:
    """The gradients at S 1024 with GQA, D 64/128, plain, causal and every variant; packed
    sequences; each run twice (the same bits)."""
    b, hq, hkv, s, w = (2, 8, 2, 1024, 256) if gpu else (1, 4, 2, 64, 16)
    specs = [(dtype, d, label) for dtype in (torch.bfloat16, torch.float16)
             for d in (64, 128) for label in ("plain", "causal")]
    specs += [(torch.bfloat16, 128, "everything"), (torch.float16, 64, "everything"),
              (torch.bfloat16, 128, "dropout")]
    if quick:
        specs = [(torch.bfloat16, 128, "causal"), (torch.bfloat16, 128, "everything"),
                 (torch.bfloat16, 128, "dropout")]
    if not gpu:
        specs = [(torch.bfloat16, 64, "causal"), (torch.float16, 64, "everything"),
                 (torch.bfloat16, 64, "dropout")]
    cases = [Case("backward", label, dtype, d, hq, hkv, (s,) * b, (s,) * b, seed=n,
                  **_variant_fields(label, w)) for n, (dtype, d, label) in enumerate(specs)]
    lens = (1000, 17, 1100) if gpu else (30, 7, 50)
    packed = [(torch.bfloat16, 128, "causal"), (torch.float16, 64, "dropout"),
              (torch.float16, 64, "plain")]
    cases += [Case("varlen_backward", label, dtype, d, hq, hkv, lens, lens, seed=n,
                   **({"causal": "bottom_right"} if label == "causal" else
                      _variant_fields(label, w)))
              for n, (dtype, d, label) in enumerate(packed[:2] if quick or not gpu else packed)]
    return cases


def grid(gpu: bool, quick: bool) -> list[Case]:
    return (forward_cases(gpu, quick) + varlen_cases(gpu, quick) + kvcache_cases(gpu, quick)
            + backward_cases(gpu, quick))
