"""Operator and kernel-launch counts of standard attention vs the fused kernels, from
torch.profiler: ``python -m fattn.launches --out FILE``.

For one call of each implementation (after a warm-up call) the profiler records every
operator the call dispatches. On the CPU there are no kernel launches as on a GPU; the
counterpart is the compute operators a call runs one after another, each a pass over its
operands in memory. A compute operator is the innermost operator of a call chain that
does more than make a view, allocate or touch a 0-dim tensor (matmul → bmm: bmm;
softmax → _softmax: _softmax), found by walking the profiler's event tree. Where CUDA is available
(--device cuda) the GPU kernels the profiler records are counted too.

Implementations: torch_standard (matmul, scale, softmax, matmul: fattn.bench's
standard_attention), torch_sdpa (F.scaled_dot_product_attention) and fattn_fused
(torch.ops.fattn.attention, impl "fused").
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import fattn  # noqa: F401  (registers torch.ops.fattn)

from .bench.core import standard_attention

# Operators that make a view, reshape metadata or allocate: no pass over the data.
NON_COMPUTE_OPS = frozenset({
    "aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::reshape", "aten::expand",
    "aten::transpose", "aten::t", "aten::permute", "aten::_unsafe_view", "aten::resolve_conj",
    "aten::resolve_neg", "aten::empty", "aten::empty_like", "aten::empty_strided",
    "aten::detach", "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::select",
    "aten::slice", "aten::lift_fresh",
})
IMPLS = ("torch_standard", "torch_sdpa", "fattn_fused")


def call_of(impl: str, q, k, v, causal: bool):
    if impl == "torch_standard":
        scale = 1.0 / math.sqrt(q.size(-1))
        return lambda: standard_attention(q, k, v, causal, scale)
    if impl == "torch_sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if impl == "fattn_fused":
        return lambda: torch.ops.fattn.attention(q, k, v, causal, False, None, "fused")[0]
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def count_events(events, device: str) -> dict:
    """Counts of one profiled call: top-level operators, compute operators (leaf events
    that are not views or allocations, by name) and, on CUDA, GPU kernels."""
    top_level = [e.name for e in events if e.cpu_parent is None and not _is_device(e)]
    cpu_events = [e for e in events if not _is_device(e)]
    compute = collections.Counter(e.name for e in cpu_events if _is_compute(e))
    result = {
        "top_level_ops": len(top_level),
        "top_level_names": top_level,
        "all_ops": len(cpu_events),
        "compute_ops": sum(compute.values()),
        "compute_op_names": dict(sorted(compute.items())),
    }
    if device == "cuda":
        result["gpu_kernels"] = sum(1 for e in events if _is_device(e))
    return result


def _does_work(event) -> bool:
    """Not a view or allocation, and not on 0-dim tensors only (mul_(0.125) wraps its
    scalar in a tensor: to → _to_copy → copy_ of one element)."""
    if event.name in NON_COMPUTE_OPS:
        return False
    shapes = getattr(event, "input_shapes", None) or []
    return not shapes or any(len(shape) > 0 for shape in shapes)


def _has_working_descendant(event) -> bool:
    return any(_does_work(c) or _has_working_descendant(c) for c in event.cpu_children)


def _is_compute(event) -> bool:
    """The innermost operator that does more than views and allocations."""
    return _does_work(event) and not _has_working_descendant(event)


def _is_device(event) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def measure(impl: str, b: int, h: int, s: int, d: int, causal: bool, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(device) for _ in range(3))
    call = call_of(impl, q, k, v, causal)
    call()  # warm-up: one-time initialisation stays out of the count
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    # acc_events: one cycle only; without it torch warns that a later cycle would clear it.
    with profile(activities=activities, record_shapes=True, acc_events=True) as prof:
        call()
    counts = count_events(prof.events(), device)
    return {"impl": impl, "device": device, "B": b, "H": h, "S": s, "D": d, "causal": causal,
            **counts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fattn.launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--seq", type=int, nargs="+", default=[512], help="sequence lengths")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch finds no CUDA device")
    impls = [i for i in IMPLS if args.device == "cpu" or i != "fattn_fused"]
    results = [measure(impl, args.batch, args.heads, s, args.head_dim, causal, args.device)
               for s in args.seq for causal in (False, True) for impl in impls]
    doc = {"machine": {"device": args.device, "torch_version": torch.__version__,
                       "date": datetime.datetime.now(datetime.timezone.utc)
                       .strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "method": "torch.profiler, one call after a warm-up call; compute "
                                 "ops = leaf events less views and allocations"},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for r in results:
        print(f"{r['impl']:15s} S={r['S']:5d} causal={str(r['causal']):5s} "
              f"top-level ops {r['top_level_ops']:3d}  compute ops {r['compute_ops']:3d}  "
              f"{r['compute_op_names']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
