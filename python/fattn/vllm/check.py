"""End to end: tiny random Hugging Face models served by ``vllm.LLM``, once with fattn's
backend and once with vLLM's own CPU_ATTN, compared.

    python -m fattn.vllm.check --out /tmp/vllm-check       # every kind; minutes
    python -m fattn.vllm.check --kinds llama --dtypes bfloat16

Each model is made here with transformers (random weights, saved to a folder; no download)
and served without a tokenizer (token ids in, token ids out). Each engine runs in a process
of its own (``--run``), so that the two backends never share one: vLLM's backend registry
and its engine are per process. The prompts cross pages (block size 32), one shares a
prefix with another (a prefix-cache hit: a prompt chunk with context), and
max_num_batched_tokens = 48 cuts the long prompts into chunks (chunked prefill), while the
other sequences decode in the same steps.

What is compared, per kind and dtype:
- the greedy tokens: fattn's must equal CPU_ATTN's, every prompt (16-bit: unless they part
  at a tie, see ``compare``; every parting is reported);
- the logprobs, prompt tokens (prefill and chunks) and generated tokens (decode): float32,
  fattn within 1e-3 of CPU_ATTN; bfloat16/float16, the repository's 16-bit rule
  (docs/16bit.md) with the float32 run of the same weights as the reference: fattn's max
  error at most 2x CPU_ATTN's plus one ulp of the dtype at the largest reference value.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Models small enough to start in seconds; head_dim 64 runs CPU_ATTN's "vec" kernels
# (AVX-512/AVX2), which need head sizes and block sizes divisible by 32.
_COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               max_position_embeddings=1024, tie_word_embeddings=False)
KINDS = ("llama", "mistral", "gemma2")
WHAT = {"llama": "GQA 2:1", "mistral": "GQA, sliding window 40",
        "gemma2": "GQA, softcap 5, sliding window 40 on every other layer"}
BLOCK_SIZE = 32
MAX_TOKENS = 40


def make_model(kind: str, path: str | Path, seed: int = 0) -> Path:
    """A random model of ``kind`` saved to ``path`` (bfloat16 weights)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if kind == "llama":
        config = transformers.LlamaConfig(**_COMMON)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(**_COMMON, sliding_window=40)
        model = transformers.MistralForCausalLM(config)
    elif kind == "gemma2":  # vLLM's Gemma 2 ties the output embedding to the input's
        config = transformers.Gemma2Config(**{**_COMMON, "tie_word_embeddings": True},
                                           sliding_window=40,
                                           attn_logit_softcapping=5.0,
                                           final_logit_softcapping=None,
                                           query_pre_attn_scalar=64)
        model = transformers.Gemma2ForCausalLM(config)
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    with torch.no_grad():  # attention scores of order 1-10, not the initial weights' ~1e-3
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(12.0)
            layer.self_attn.k_proj.weight.mul_(12.0)
        # logits with margins, so that greedy decoding is rarely a coin toss (Gemma 2's tied
        # embedding scales the inputs too, and its logits saturate at 20x)
        if kind == "gemma2":
            model.model.embed_tokens.weight.mul_(3.0)
        else:
            model.lm_head.weight.mul_(20.0)
    model = model.to(torch.bfloat16)
    path = Path(path)
    model.save_pretrained(path)
    return path


def prompts(vocab: int = _COMMON["vocab_size"]) -> list[list[int]]:
    """Token-id prompts: 3, 29, 75 and 140 tokens, and one that shares the 140-token prompt's
    first 96 tokens (a prefix-cache hit of three pages)."""
    import random

    rng = random.Random(1)
    out = [[rng.randrange(3, vocab) for _ in range(n)] for n in (3, 29, 75, 140)]
    out.append(out[3][:96] + [rng.randrange(3, vocab) for _ in range(23)])
    return out


def run(backend: str, model: str, dtype: str, out: str, teacher: str | None = None,
        multiprocess: bool = False) -> None:
    """One engine: serves ``prompts()`` greedily with ``backend`` (fattn | cpu_attn) and
    writes tokens and logprobs to ``out`` (JSON). With ``teacher`` (another run's JSON) it
    scores that run's prompts and generated tokens instead (prompt logprobs of each whole
    sequence, teacher-forced: the reference for both backends' logprobs). multiprocess:
    vLLM's default engine and worker processes (the plugin registers fattn there)."""
    if backend == "fattn":
        import fattn.vllm
        fattn.vllm.register()
    # _impl_name sends a function to the worker, which vLLM pickles only with this.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    kwargs = {}
    if not multiprocess:
        # Engine and worker in this process: the steps' batches do not depend on when the
        # requests reach an engine process, so a rerun gives the same bits (fattn's 16-bit
        # results depend on how a prompt is cut into chunks; CPU_ATTN's do not).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        kwargs["distributed_executor_backend"] = "uni"
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(model=model, dtype=dtype, skip_tokenizer_init=True, enforce_eager=True,
                   block_size=BLOCK_SIZE, max_model_len=512, max_num_batched_tokens=48,
                   max_num_seqs=8, enable_prefix_caching=True,
                   kv_cache_memory_bytes=256 << 20, seed=0, **kwargs)
    impl = _impl_name(llm)

    def serve(batch, max_tokens, prompt_logprobs):
        params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                     logprobs=2, prompt_logprobs=prompt_logprobs,
                                     detokenize=False)
        for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params,
                              use_tqdm=False):
            c = o.outputs[0]
            yield {
                "prompt": list(o.prompt_token_ids),
                "tokens": list(c.token_ids),
                "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                # the two likeliest tokens at each step: (token, logprob) pairs
                "top2": [sorted(((k, v.logprob) for k, v in lp.items()),
                                key=lambda kv: -kv[1])[:2] for lp in c.logprobs],
                "prompt_logprobs": [] if o.prompt_logprobs is None else
                [None if lp is None else lp[t].logprob
                 for lp, t in zip(o.prompt_logprobs, o.prompt_token_ids)],
                "cached": o.num_cached_tokens,
            }

    if teacher:
        seqs = [r["prompt"] + r["tokens"] for r in json.loads(Path(teacher).read_text())["results"]]
        results = list(serve(seqs, 1, 0))
    else:
        ps = prompts()
        # Prompt logprobs turn prefix caching off for their request, so the prompt that
        # shares a prefix comes in a second call without them, once the first call has left
        # its pages in the prefix cache.
        results = list(serve(ps[:4], MAX_TOKENS, 0)) + list(serve(ps[4:], MAX_TOKENS, None))
    Path(out).write_text(json.dumps({"backend": backend, "impl": impl, "dtype": dtype,
                                     "vllm": vllm.__version__, "results": results}))


def _impl_name(llm) -> str:
    """The attention impl class the engine's first layer runs (checked, not assumed)."""
    def first_impl(worker):
        from vllm.model_executor.layers.attention import Attention
        for m in worker.model_runner.model.modules():
            if isinstance(m, Attention):
                return type(m.impl).__name__
        return None
    try:
        return llm.collective_rpc(first_impl)[0]
    except Exception as e:  # noqa: BLE001
        return f"unknown ({type(e).__name__}: {e})"


def _serve(backend: str, model: Path, dtype: str, workdir: Path, log,
           teacher: Path | None = None, multiprocess: bool = False) -> dict:
    out = workdir / f"{model.name}-{backend}-{dtype}{'-reference' if teacher else ''}.json"
    env = dict(os.environ)
    env.pop("FATTN_VLLM", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fattn.vllm.check", "--run", backend,
                           "--model", str(model), "--dtype", dtype, "--json", str(out)]
                          + (["--teacher", str(teacher)] if teacher else [])
                          + (["--multiprocess"] if multiprocess else []),
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    (workdir / f"{out.stem}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} {dtype} on {model.name} failed (exit "
                           f"{proc.returncode}); log: {workdir / (out.stem + '.log')}\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    log(f"  {backend:8s} {dtype:8s}{' reference' if teacher else ''} {seconds:5.1f} s")
    return json.loads(out.read_text())


def compare(kind: str, dtype: str, ours: dict, theirs: dict, ref: dict | None) -> dict:
    """The verdict for one kind and dtype. ref: for 16-bit dtypes, the float32 CPU_ATTN
    engine scoring fattn's sequences teacher-forced (``run(teacher=...)``)."""
    same = [o["tokens"] == t["tokens"] for o, t in zip(ours["results"], theirs["results"])]
    verdict = {"kind": kind, "what": WHAT[kind], "dtype": dtype, "impl": ours["impl"],
               "reference_impl": theirs["impl"], "greedy_identical": all(same),
               "prompts": len(same), "tokens_per_prompt": MAX_TOKENS,
               "prompt_tokens": [len(r["prompt"]) for r in ours["results"]],
               "cached_tokens": [r["cached"] for r in ours["results"]]}
    # (fattn, CPU_ATTN, reference) per position: prompt tokens (prefill, chunks) and
    # generated tokens (decode; along equal sequences only).
    triples = {"prompt_logprobs": [], "logprobs": []}
    for i, (o, t) in enumerate(zip(ours["results"], theirs["results"])):
        r = ref["results"][i]["prompt_logprobs"] if ref else None
        for j, (a, b) in enumerate(zip(o["prompt_logprobs"], t["prompt_logprobs"])):
            if a is not None and b is not None:
                triples["prompt_logprobs"].append((a, b, r[j] if r else None))
        if same[i]:
            n = len(o["prompt"])
            for j, (a, b) in enumerate(zip(o["logprobs"], t["logprobs"])):
                triples["logprobs"].append((a, b, r[n + j] if r else None))
    ok = True
    for key, ts in triples.items():
        entry = {"positions": len(ts),
                 "max_diff_vs_cpu_attn": max((abs(a - b) for a, b, _ in ts), default=0.0)}
        if ref is None:  # float32: the two backends against each other
            entry["bound"] = 1e-3
            entry["ok"] = entry["max_diff_vs_cpu_attn"] <= entry["bound"]
        else:
            ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
            entry["fattn_err"] = max((abs(a - c) for a, _, c in ts), default=0.0)
            entry["cpu_attn_err"] = max((abs(b - c) for _, b, c in ts), default=0.0)
            entry["bound"] = 2 * entry["cpu_attn_err"] + ulp * max(
                (abs(c) for _, _, c in ts), default=0.0)
            entry["ok"] = entry["fattn_err"] <= entry["bound"]
        verdict[key] = entry
        ok = ok and entry["ok"] and entry["positions"] > 0
    # Where the greedy tokens part: the two likeliest tokens of each run at that step. A tie
    # (16-bit only): each run's choice is the other's second, and both runs put the two
    # closer than the 16-bit rule lets the backends' logprobs differ (the prompt logprobs'
    # bound): a coin toss that rounding decides, as vLLM's own check_logprobs_close allows.
    verdict["divergences"] = []
    for i, (o, t) in enumerate(zip(ours["results"], theirs["results"])):
        if same[i]:
            continue
        j = next(k for k, (a, b) in enumerate(zip(o["tokens"], t["tokens"])) if a != b)
        f2, c2 = o["top2"][j], t["top2"][j]
        gaps = [pair[0][1] - pair[1][1] for pair in (f2, c2)]
        allowed = verdict["prompt_logprobs"].get("bound", 0.0) if ref is not None else 0.0
        tie = (t["tokens"][j] in [k for k, _ in f2] and o["tokens"][j] in [k for k, _ in c2]
               and max(gaps) <= allowed)
        verdict["divergences"].append({"prompt": i, "step": j, "fattn_top2": f2,
                                       "cpu_attn_top2": c2, "tie": tie})
        ok = ok and tie
    verdict["ok"] = ok
    return verdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fattn.vllm.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--out", default=None, help="folder for models, logs and verdicts "
                    "(default: a temporary one)")
    ap.add_argument("--run", choices=("fattn", "cpu_attn"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--teacher", help=argparse.SUPPRESS)
    ap.add_argument("--multiprocess", action="store_true", help="run each engine in vLLM's "
                    "default engine and worker processes (fattn registered there by its "
                    "plugin); the default runs them in one process, for repeatable batches")
    args = ap.parse_args(argv)
    if args.run:
        run(args.run, args.model, args.dtype, args.json, args.teacher, args.multiprocess)
        return 0

    workdir = Path(args.out or tempfile.mkdtemp(prefix="fattn-vllm-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    verdicts = []
    t0 = time.perf_counter()
    for kind in args.kinds.split(","):
        model = make_model(kind, workdir / kind)
        log(f"{kind} ({WHAT[kind]}): {model}")
        for dtype in args.dtypes.split(","):
            ours = _serve("fattn", model, dtype, workdir, log, multiprocess=args.multiprocess)
            theirs = _serve("cpu_attn", model, dtype, workdir, log,
                            multiprocess=args.multiprocess)
            ref = None
            if dtype != "float32":
                ref = _serve("cpu_attn", model, "float32", workdir, log,
                             teacher=workdir / f"{model.name}-fattn-{dtype}.json")
            v = compare(kind, dtype, ours, theirs, ref)
            verdicts.append(v)
            log(f"  {dtype}: greedy identical {v['greedy_identical']} (impl {v['impl']} vs "
                f"{v['reference_impl']}, cached tokens {v['cached_tokens']})")
            for key in ("prompt_logprobs", "logprobs", "divergences"):
                log(f"    {key}: {json.dumps(v[key])}")
            log(f"    -> {'ok' if v['ok'] else 'FAILED'}")
    (workdir / "verdicts.json").write_text(json.dumps(verdicts, indent=1))
    failed = [v for v in verdicts if not v["ok"]]
    log(f"{time.perf_counter() - t0:.0f} s; verdicts in {workdir / 'verdicts.json'}")
    print(f"{len(verdicts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
