"""What a user feels: a Llama-shaped transformers model on the CPU with fattn and with
transformers' "sdpa", side by side in one process: ``python -m fattn.bench --model``.

The model (random weights in --dtype, float32 by default, --threads threads): hidden
1024, 4 layers, 16 query heads and 4 kv heads of 64 dims, MLP 2816, vocabulary 32000
(CONFIG). The table's header prints its parameter bytes (what a decode step reads besides
the cache) and its KV-cache bytes per token of context per sequence (layers · 2 · 4 · 64
elements: 8 KiB in float32, 4 KiB in bfloat16): at 16k context and batch 8 the cache read
is three quarters of the bytes of a step in either dtype (weights and cache scale alike).

Rows:
  prefill  one forward pass over a batch of `context` tokens (causal, no padding)
  decode   one new token per sequence against a KV cache of `context` tokens (filled with
           random keys and values: the attention's cost does not depend on them), the
           median over --steps steps; tokens/s = batch / time. The cache is transformers'
           DynamicCache, its default, which concatenates every layer's whole K and V into
           new tensors at each step
  decode_append  the same with fattn.transformers.append_cache for both backends: the
           new tokens written in place into buffers that grow by doubling
For each, the time in attention (the attention function's calls, timed around them) and
its share of the whole, fattn / sdpa speedups end to end and in attention.
Output: a table, model.json and model.png (per row, fattn's and sdpa's time split into
attention and the rest) in --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import fattn
from .core import Contention, machine_info

CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, head_dim=64,
              max_position_embeddings=32768)
# The rows, in the order they run.
KINDS = ("prefill", "decode", "decode_append")


class AttentionClock:
    """Registers timed copies of fattn's and sdpa's attention functions, and sums the
    seconds spent in them."""

    def __init__(self):
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        import fattn.transformers as backend
        self.seconds = 0.0
        for name, fn in (("fattn_timed", backend.attention_forward),
                         ("sdpa_timed", sdpa_attention_forward)):
            AttentionInterface.register(name, self._timed(fn))
            AttentionMaskInterface.register(name, sdpa_mask)

    def _timed(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def build(impl, layers, dtype):
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dict(CONFIG, num_hidden_layers=layers),
                                      attn_implementation=f"{impl}_timed")
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def filled_cache(model, batch, context, append):
    from transformers import DynamicCache

    import fattn.transformers
    cfg = model.config
    cache = fattn.transformers.append_cache(cfg) if append else DynamicCache(config=cfg)
    g = torch.Generator().manual_seed(2)
    for layer in range(cfg.num_hidden_layers):
        shape = (batch, cfg.num_key_value_heads, context, cfg.head_dim)
        kv = [torch.randn(shape, generator=g).to(model.dtype) for _ in range(2)]
        cache.update(*kv, layer)
    return cache


def measure(model, clock, kind, batch, context, steps):
    """(seconds, attention seconds) of one prefill, or the median decode step."""
    ids = torch.randint(0, model.config.vocab_size, (batch, context if kind == "prefill" else 1))
    if kind == "prefill":
        clock.seconds = 0.0
        start = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        return time.perf_counter() - start, clock.seconds
    cache = filled_cache(model, batch, context, append=kind == "decode_append")
    runs = []
    for step in range(steps + 1):  # the first step warms up
        position = torch.full((batch, 1), context + step)
        clock.seconds = 0.0
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, position_ids=position, use_cache=True)
        runs.append((time.perf_counter() - start, clock.seconds))
        cache.crop(-1)  # back to `context` keys: every step sees the same context
    runs = runs[1:]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def plot(out: Path, results: list, title: str) -> None:
    """model.png: one pair of bars (fattn, sdpa) per row, each split into the time in
    attention and the rest of the model."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fattn.bench --model: matplotlib is not installed; no plot")
        return
    kinds = [k for k in KINDS if any(r["row"] == k for r in results)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes.flat, kinds):
        rows = [r for r in results if r["row"] == kind]
        for n, r in enumerate(rows):
            for side, (impl, color) in enumerate((("fattn", "tab:blue"), ("sdpa", "tab:orange"))):
                total, attention = r[f"{impl}_s"] * 1e3, r[f"{impl}_attention_s"] * 1e3
                x = n + (side - 0.5) * 0.38
                ax.bar(x, attention, 0.36, color=color, label=f"{impl}: attention" if n == 0 else None)
                ax.bar(x, total - attention, 0.36, bottom=attention, color=color, alpha=0.35,
                       label=f"{impl}: rest of the model" if n == 0 else None)
                ax.annotate(f"{total:.0f}", (x, total), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(rows)), [f"B={r['batch']}\n{r['context']}" for r in rows], fontsize=7)
        ax.set_ylabel("ms per " + ("forward pass" if kind == "prefill" else "decode step"))
        ax.set_title(f"{kind}: batch / context", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "model.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench --model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prefill-max", type=int, default=4096,
                   help="longest context timed for prefill (batch 1)")
    p.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    p.add_argument("--steps", type=int, default=5, help="decode steps timed per point")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="of the weights, activations and KV cache (both backends)")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CI)")
    p.add_argument("--out", default="fattn-bench-model")
    args = p.parse_args(argv)
    if args.quick:
        args.contexts, args.batches, args.prefill_max, args.layers, args.steps = \
            [256], [1, 2], 256, 1, 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    clock = AttentionClock()
    dtype = getattr(torch, args.dtype)
    models = {impl: build(impl, args.layers, dtype) for impl in ("fattn", "sdpa")}
    weights = sum(t.numel() * t.element_size() for t in models["fattn"].parameters())
    cfg = models["fattn"].config
    kv_per_token = (cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim
                    * dtype.itemsize)
    print(f"fattn {fattn.__version__} vs transformers sdpa, torch {torch.__version__}, "
          f"{threads} threads; Llama-shaped model in {args.dtype}, {args.layers} layers, "
          f"{weights / 2**20:.0f} MiB of weights, KV cache {kv_per_token / 1024:.0f} KiB per token "
          "(see --help)")
    print(f"{'row':<13} {'batch':>5} {'context':>7} {'fattn ms':>9} {'sdpa ms':>9} {'speedup':>7} "
          f"{'attn fattn':>10} {'attn sdpa':>10} {'attn x':>7} {'share f/s':>11}")
    contention = Contention()
    results = []
    with torch.inference_mode():
        for kind in KINDS:
            for batch in args.batches:
                for context in args.contexts:
                    if kind == "prefill" and (batch != 1 or context > args.prefill_max):
                        continue
                    t = {impl: measure(m, clock, kind, batch, context, args.steps)
                         for impl, m in models.items()}
                    (f, fa), (s, sa) = t["fattn"], t["sdpa"]
                    row = dict(row=kind, batch=batch, context=context, fattn_s=f, sdpa_s=s,
                               fattn_attention_s=fa, sdpa_attention_s=sa,
                               tokens_per_s_fattn=batch / f if kind != "prefill" else None,
                               tokens_per_s_sdpa=batch / s if kind != "prefill" else None)
                    results.append(row)
                    print(f"{kind:<13} {batch:>5} {context:>7} {f * 1e3:>9.1f} {s * 1e3:>9.1f} "
                          f"{s / f:>7.2f} {fa * 1e3:>10.1f} {sa * 1e3:>10.1f} {sa / fa:>7.2f} "
                          f"{fa / f:>5.0%}/{sa / s:>4.0%}", flush=True)
    args.min_reps = args.max_reps = args.steps
    args.budget = 0.0
    machine = machine_info(threads, args, contention.result())
    machine["model"] = dict(CONFIG, num_hidden_layers=args.layers, dtype=args.dtype, weight_bytes=weights,
                            kv_bytes_per_token=kv_per_token)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    plot(out, results, f"fattn vs transformers sdpa, Llama-shaped model in {args.dtype}, "
                       f"{threads} threads ({machine.get('cpu', 'cpu')})")
    print(f"\nwrote {out / 'model.json'}, {out / 'model.png'}")
    return 0
