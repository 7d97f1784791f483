"""Ring attention across processes on one machine: ``python -m fattn.bench --ring``.

P ranks (gloo, loopback), each with --threads-per-rank threads, run
fattn.distributed.ring_attention over a sequence of S tokens (B=1, H=8, D=128, causal,
float32), beside one process with P × threads-per-rank threads running fattn on the whole
sequence: the forward, or with --pass train the forward and the backward (out.backward of
a random gradient; dK/dV travel the ring back). Per S: both times (median of --reps), their ratio (single / ring: 1.0 means
the ring loses nothing), the seconds a rank waited for transfers (communication compute did
not hide), and each rank's K/V and output bytes (O(S/P)) against the single process's.
Each process makes only its own part of the inputs (rank r: sequence chunks r and 2P−1−r,
each drawn from its own seed; the single process: all of them).

--memory-budget-gib G gives every process (each rank, and the single process, which then
runs in a child process of its own) a memory budget it cannot exceed: after its warm-up, its
address space is capped at what it has mapped plus G GiB (RLIMIT_AS), so an allocation
beyond the budget fails as out of memory. The table then shows each side's peak resident
memory above its start, and a sequence whose K and V exceed G runs across the ranks while
the single process fails.
Output: a table and ring.json in --out.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import resource
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


def _chunk(s, chunks, index, which):
    """Chunk `index` of `chunks` of q (which 0), k (1) or v (2): its own seed, so every
    process draws the same values for it without drawing the rest."""
    g = torch.Generator().manual_seed(3 * index + which)
    return torch.randn(B, H, s // chunks, D, generator=g)


def _inputs(s, world, chunk_ids):
    """q, k, v made of the given chunks of the 2·world chunks of a sequence of s tokens."""
    return [torch.cat([_chunk(s, 2 * world, i, which) for i in chunk_ids], dim=2)
            for which in range(3)]


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters


def _return_freed_blocks():
    """glibc keeps freed blocks of up to 32 MiB in its heaps (its mmap threshold rises to the
    largest block freed) and gives threads arenas of their own, reserved 64 MiB at a time;
    under RLIMIT_AS both count against the budget though they hold no tensor. A fixed 1 MiB
    threshold maps each larger block apart and returns it when freed, and one arena reserves
    nothing more: a rank of the 8-rank, S = 64k run then peaked at 305 MiB above its start
    instead of 447, and fit a 0.4 GiB cap that it overran before (dev-zen5, 2026-11-26)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # not glibc: its own policy stands
        pass


def _limit_memory(budget_gib):
    """Caps the address space at what is mapped now plus the budget (RLIMIT_AS)."""
    if budget_gib is None:
        return
    _return_freed_blocks()
    limit = _status_kib("VmSize") * 1024 + int(budget_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


def _start_peak():
    """Resets the peak resident size (VmHWM) to the current one; returns the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def _peak_above(start):
    return _status_kib("VmHWM") * 1024 - start


def _step(attention, q, k, v, train):
    """One forward (no autograd), or one forward + backward of a fixed gradient."""
    if not train:
        with torch.inference_mode():
            return attention(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(torch.ones_like(out))
    return out


def _timed(step, reps, barrier=lambda: None, waited=lambda: 0.0):
    """Median seconds of `reps` calls of step() (each between barriers), and of waited()."""
    times, waits = [], []
    for _ in range(reps):
        barrier()
        waited()
        start = time.perf_counter()
        step()
        barrier()
        times.append(time.perf_counter() - start)
        waits.append(waited())
    return statistics.median(times), statistics.median(waits)


def _rank(rank, world, port, args, results):
    import fattn.distributed as fd
    torch.set_num_threads(args.threads_per_rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ring = lambda q, k, v: fd.ring_attention(q, k, v, causal=True)  # noqa: E731
    train = args.pass_ == "train"
    try:
        _step(ring, *_inputs(64 * world, world, fd.chunk_ids(rank, world)), train)  # threads
        _limit_memory(args.memory_budget_gib)
        for s in args.seq:
            start_rss = _start_peak()
            q, k, v = _inputs(s, world, fd.chunk_ids(rank, world))
            _step(ring, q, k, v, train)  # warm-up
            ring_s, waited = _timed(lambda: _step(ring, q, k, v, train), args.reps, dist.barrier,
                                    lambda: fd.transfer_wait_seconds(reset=True))
            peaks = [None] * world
            dist.all_gather_object(peaks, _peak_above(start_rss))
            if rank == 0:
                results[s] = (ring_s, waited, 3 * q.numel() * q.element_size(), max(peaks))
            del q, k, v
    finally:
        dist.destroy_process_group()


def _whole(q, k, v):
    return fattn.flash_attention(q, k, v, layout="bhsd", causal=True)


def _single(s, args):
    """One process on the whole sequence: (median seconds, peak bytes above its start), or
    (None, the error's first line) when it does not fit the memory budget."""
    chunks = range(2 * args.ranks)
    train = args.pass_ == "train"
    start_rss = _start_peak()
    try:
        q, k, v = _inputs(s, args.ranks, chunks)
        _step(_whole, q, k, v, train)
        single_s, _ = _timed(lambda: _step(_whole, q, k, v, train), args.reps)
    except (RuntimeError, MemoryError) as e:
        return None, str(e).strip().splitlines()[0][:160]
    return single_s, _peak_above(start_rss)


def _single_in_budget(rank, args, threads, results):
    """_single in a child process whose memory is capped at the budget."""
    torch.set_num_threads(threads)
    _step(_whole, *_inputs(64 * args.ranks, args.ranks, range(2 * args.ranks)), False)  # threads
    _limit_memory(args.memory_budget_gib)
    for s in args.seq:
        results[s] = _single(s, args)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fattn.bench --ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads-per-rank", type=int, default=1)
    p.add_argument("--seq", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward",
                   help="train: forward + backward")
    p.add_argument("--memory-budget-gib", type=float, default=None,
                   help="cap every process's memory at this many GiB above its warm-up "
                        "(RLIMIT_AS); the single process then runs in a child process")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CI)")
    p.add_argument("--out", default="fattn-bench-ring")
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.reps = [512], 2
    threads = args.ranks * args.threads_per_rank
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.memory_budget_gib is not None and args.memory_budget_gib < 0:
        p.error(f"--memory-budget-gib must be >= 0, got {args.memory_budget_gib:g}")
    if any(s % (2 * args.ranks) for s in args.seq):
        p.error(f"--seq: every S must be a multiple of 2 × --ranks = {2 * args.ranks}")
    contention = Contention()
    results, single = mp.Manager().dict(), mp.Manager().dict()
    mp.spawn(_rank, args=(args.ranks, port, args, results), nprocs=args.ranks, join=True)
    if args.memory_budget_gib is not None:
        mp.spawn(_single_in_budget, args=(args, threads, single), nprocs=1, join=True)
    else:
        torch.set_num_threads(threads)
        for s in args.seq:
            single[s] = _single(s, args)
    budget = ("" if args.memory_budget_gib is None
              else f"; memory budget {args.memory_budget_gib:g} GiB per process")
    print(f"fattn {fattn.__version__}: ring attention, {args.ranks} ranks x "
          f"{args.threads_per_rank} thread(s) vs 1 process x {threads} threads; B={B} H={H} "
          f"D={D} causal float32, {'forward + backward' if args.pass_ == 'train' else 'forward'}"
          f"{budget}")
    print(f"{'S':>7} {'ring ms':>10} {'single ms':>10} {'single/ring':>11} {'waited ms':>10} "
          f"{'rank q+k+v MiB':>14} {'single MiB':>10} {'rank peak MiB':>13} "
          f"{'single peak MiB':>15}")
    rows = []
    for s in args.seq:
        ring_s, waited, rank_bytes, rank_peak = results[s]
        one, single_peak = single[s]
        full_bytes = 3 * B * H * s * D * 4
        row = dict(S=s, ranks=args.ranks, threads_per_rank=args.threads_per_rank,
                   **{"pass": args.pass_}, ring_s=ring_s, single_s=one,
                   ratio=one / ring_s if one else None, waited_s=waited,
                   rank_qkv_bytes=rank_bytes, single_qkv_bytes=full_bytes,
                   rank_peak_bytes=rank_peak,
                   memory_budget_bytes=(None if args.memory_budget_gib is None
                                        else int(args.memory_budget_gib * 2**30)))
        if one is None:
            row["single_error"] = single_peak
        else:
            row["single_peak_bytes"] = single_peak
        rows.append(row)
        single_ms = f"{one * 1e3:>10.1f}" if one else f"{'over':>10}"
        ratio = f"{one / ring_s:>11.3f}" if one else f"{'-':>11}"
        peak = f"{single_peak / 2**20:>15.0f}" if one else f"{'out of memory':>15}"
        print(f"{s:>7} {ring_s * 1e3:>10.1f} {single_ms} {ratio} {waited * 1e3:>10.1f} "
              f"{rank_bytes / 2**20:>14.1f} {full_bytes / 2**20:>10.1f} "
              f"{rank_peak / 2**20:>13.0f} {peak}", flush=True)
        if one is None:
            print(f"        single process: {single_peak}")
    args.min_reps = args.max_reps = args.reps
    args.budget = 0.0
    machine = machine_info(threads, args, contention.result())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ring.json").write_text(json.dumps({"machine": machine, "results": rows}, indent=1))
    print(f"\nwrote {out / 'ring.json'}")
    return 0
