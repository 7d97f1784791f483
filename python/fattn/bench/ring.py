"""Ring attention across processes on one machine: ``python -m fattn.bench --ring``.

P ranks (gloo, loopback), each with --threads-per-rank threads, run
fattn.distributed.ring_attention over a sequence of S tokens (B=1, H=8, D=128, causal,
float32), beside one process with P × threads-per-rank threads running fattn on the whole
sequence: the forward, or with --pass train the forward and the backward (out.backward of
a random gradient; dK/dV travel the ring back). Per S: both times (median of --reps), their ratio (single / ring: 1.0 means
the ring loses nothing), the seconds a rank waited for transfers (communication compute did
not hide), and each rank's K/V and output bytes (O(S/P)) against the single process's.
Output: a table and ring.json in --out.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fattn
from .core import Contention, machine_info

B, H, D = 1, 8, 128


def _inputs(s):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, s, D, generator=g) for _ in range(3)]


def _step(attention, q, k, v, train):
    """One forward (no autograd), or one forward + backward of a fixed gradient."""
    if not train:
        with torch.inference_mode():
            return attention(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(torch.ones_like(out))
    return out


def _rank(rank, world, port, args, results):
    import fattn.distributed as fd
    torch.set_num_threads(args.threads_per_rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for s in args.seq:
            q, k, v = (fd.shard(t, dim=2) for t in _inputs(s))
            ring = lambda q, k, v: fd.ring_attention(q, k, v, causal=True)  # noqa: E731
            train = args.pass_ == "train"
            _step(ring, q, k, v, train)  # warm-up
            times, waits = [], []
            for _ in range(args.reps):
                dist.barrier()
                fd._Ring.waited = 0.0
                start = time.perf_counter()
                _step(ring, q, k, v, train)
                dist.barrier()
                times.append(time.perf_counter() - start)
                waits.append(fd._Ring.waited)
            if rank == 0:
                results[s] = (statistics.median(times), statistics.median(waits),
                              3 * q.numel() * q.element_size())
    finally:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench --ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads-per-rank", type=int, default=1)
    p.add_argument("--seq", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward",
                   help="train: forward + backward")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CI)")
    p.add_argument("--out", default="fattn-bench-ring")
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.reps = [512], 2
    threads = args.ranks * args.threads_per_rank
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    contention = Contention()
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(args.ranks, port, args, results), nprocs=args.ranks, join=True)
    torch.set_num_threads(threads)
    print(f"fattn {fattn.__version__}: ring attention, {args.ranks} ranks x "
          f"{args.threads_per_rank} thread(s) vs 1 process x {threads} threads; B={B} H={H} "
          f"D={D} causal float32, {'forward + backward' if args.pass_ == 'train' else 'forward'}")
    print(f"{'S':>7} {'ring ms':>10} {'single ms':>10} {'single/ring':>11} {'waited ms':>10} "
          f"{'rank q+k+v MiB':>14} {'single MiB':>10}")
    rows = []
    whole = lambda q, k, v: fattn.flash_attention(q, k, v, layout="bhsd", causal=True)  # noqa: E731
    for s in args.seq:
        q, k, v = _inputs(s)
        _step(whole, q, k, v, args.pass_ == "train")
        single = []
        for _ in range(args.reps):
            start = time.perf_counter()
            _step(whole, q, k, v, args.pass_ == "train")
            single.append(time.perf_counter() - start)
        ring_s, waited, rank_bytes = results[s]
        one = statistics.median(single)
        full_bytes = 3 * q.numel() * q.element_size()
        rows.append(dict(S=s, ranks=args.ranks, threads_per_rank=args.threads_per_rank,
                         **{"pass": args.pass_},
                         ring_s=ring_s, single_s=one, ratio=one / ring_s, waited_s=waited,
                         rank_qkv_bytes=rank_bytes, single_qkv_bytes=full_bytes))
        print(f"{s:>7} {ring_s * 1e3:>10.1f} {one * 1e3:>10.1f} {one / ring_s:>11.3f} "
              f"{waited * 1e3:>10.1f} {rank_bytes / 2**20:>14.1f} {full_bytes / 2**20:>10.1f}",
              flush=True)
    args.min_reps = args.max_reps = args.reps
    args.budget = 0.0
    machine = machine_info(threads, args, contention.result())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ring.json").write_text(json.dumps({"machine": machine, "results": rows}, indent=1))
    print(f"\nwrote {out / 'ring.json'}")
    return 0
