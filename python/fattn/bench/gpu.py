"""fattn's GPU paths beside torch's, in one process: ``python -m fattn.bench --gpu``.

Every row is one implementation at one problem, timed and checked in the same run as the
torch rows it is compared with. Sections (--sections; each its own JSON file):

  masked   B=4 H=16 S=4096 D=128, float16 and bfloat16, three masks (and, in the first
           dtype, two score variants: softcap30, not causal; alibi_sinks_causal: ALiBi slopes
           2^(-8h/H) and random sinks, causal; fattn_triton and fattn_op only):
             causal      query i sees keys j <= i
             window1024  causal and j >= i - 1023 (FlashAttention's window_size=(1023, 0))
             padding     a boolean (B, 1, 1, S) key mask, random lengths in [S/4, S]
           fattn_triton  fattn.triton.attention(causal=True / window_size= / attn_mask=)
           fattn_op      fattn.scaled_dot_product_attention / fattn.flash_attention (the
                         dispatched operator)
           sdpa_flash, sdpa_cudnn, sdpa_efficient: F.scaled_dot_product_attention with one
                         backend forced (is_causal for causal; the boolean mask for the
                         others, which the flash backend does not take: skipped)
           flex          FlexAttention, torch.compile'd, with create_block_mask of the same
                         mask (the block mask is built once, outside the timing)
           TFLOP/s = 4·H·D·(visible (query, key) pairs summed over the batch) / time.
  forward  FlashAttention's hidden-2048 shapes: D=64 (H=32) and D=128 (H=16), S=4096 (B=4)
           and 16384 (B=1), causal and not, float16 and bfloat16: fattn_triton
           (fattn.triton.attention), fattn_op (fattn.scaled_dot_product_attention), sdpa_flash,
           sdpa_cudnn. TFLOP/s as above.
  decode   one query, Hq=32 Hkv=8 D=128, a bfloat16 cache of Sk = 8k, 32k, 128k keys, B = 1,
           8 and 32: fattn_triton (fattn.triton.attention_with_kvcache, FlashAttention's
           (B, S, H, D) cache), fattn_op (fattn.flash_attn_with_kvcache; host_ms: the CPU
           time of one call without synchronising; a CUDA-graph replay row; paged rows,
           block_size 256 and 16, the same memory with each sequence's pages scattered
           by a random block table; at Sk = 32k, rows with the C++ decode kernel's ring
           depth forced to 2, 3 and 4 stages, decode_stages), sdpa_cudnn and
           sdpa_flash with enable_gqa (on their own contiguous (B, H, S, D) copy of the
           cache). GB/s = bytes of K and V read / time, and as a percentage of the
           device-to-device copy bandwidth measured first in the same run (torch_copy:
           bytes read + written / time of dst.copy_(src) over 1 GiB).
  training forward + backward, B=4 S=4096, D=64 (H=32) and 128 (H=16), causal and not,
           float16 and bfloat16: fattn_triton (fattn.triton.attention + attention_backward),
           fattn_op (autograd through fattn.scaled_dot_product_attention), sdpa_flash and
           sdpa_cudnn through autograd. TFLOP/s with the FLOPs counted as 3.5x the
           forward's; peak_extra_mib: what one step allocates at its peak beyond what was
           allocated before it; max_err over dq, dk, dv against float32 autograd of the
           definition on the first (batch, 2 heads); deterministic: true where the
           backward gives the same bits run to run (fattn's: no atomics), null where torch
           does not say. --backward-tiles adds fattn_triton rows at other backward tiles
           (one row per configuration, its variant naming them) beside the default.

Timing: triton.testing.do_bench (CUDA events around each call, L2 flushed before each,
25 ms warm-up, 100 ms of calls; --warmup-ms, --rep-ms), the median. The first call of each
row is not timed: it compiles (Triton, torch.compile) and gives the output that max_err
checks: the max abs difference from a float64 reference (float32 where the float64 copy of a
decode cache would pass 1 GiB) on 16 sampled query rows of every (batch, head) (decode: the
first and last sequence).

Every row is guarded: an implementation that raises records its error in the row's
"status" ("error: <type>: <message>"), one that cannot run here "skipped: <reason>", and
the run goes on. The JSON files are rewritten after every row, so a run cut off keeps what
it measured. --budget-s bounds the whole run: each section may use its share of what is
left (masked 30 %, forward 25 %, decode 20 %, training 25 %; what one leaves goes to the next); rows past
it are "skipped: out of time".

Output: DIR/evidence.json (device, driver, CUDA, cuDNN, torch, triton, fattn, commit, date)
and DIR/<section>.json ({"machine": ..., "rows": [...]}: impl, variant, dtype, B, Hq, Hkv,
Sq, Sk, D, ms_median, tflops or gbps, max_err, status, ...), where DIR is --out, else
--results/<machine>/gpu with <machine> the GPU's short name (h100 for "NVIDIA H100 80GB
HBM3").

--smoke: every row at tiny sizes, by default on the CPU (--device cpu): Triton under its
interpreter (TRITON_INTERPRET=1, set here before triton is imported), FlexAttention eager,
SDPA's GPU backends "skipped: needs CUDA", one call's wall time instead of do_bench: it
proves the script, it measures nothing (tests/python/test_bench_gpu.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fattn.bench.gpu_run import (DTYPES, SECTIONS, Run, Skip, machine_info,
                                 max_err, reference_rows, sample_rows, sdpa_call, sizes,
                                 triton_call)

FLOAT64_CACHE_LIMIT = 1 << 30   # decode reference in float64 below this many bytes of K, V


def bench_masked(run: Run):
    import fattn
    cfg = sizes(run.args.smoke)["masked"]
    b, h, s, d, w = cfg["B"], cfg["H"], cfg["S"], cfg["D"], cfg["window"]
    dev = run.device
    lengths = torch.randint(s // 4, s + 1, (b,), generator=torch.Generator().manual_seed(7))
    lengths[0] = s  # one full sequence
    lengths = lengths.to(dev)
    i = torch.arange(s, device=dev).view(-1, 1)
    j = torch.arange(s, device=dev).view(1, -1)
    window_mask = ((j <= i) & (j >= i - (w - 1))).view(1, 1, s, s)  # True: takes part
    padding_mask = (torch.arange(s, device=dev).view(1, 1, 1, -1)
                    < lengths.view(-1, 1, 1, 1))             # (B, 1, 1, S)
    rows = sample_rows(s, dev)
    ri = rows.view(-1, 1)
    masks = {  # name: (visible pairs summed over the batch, visible at the sampled rows)
        "causal": (b * s * (s + 1) // 2, (j <= ri).view(1, 1, -1, s)),
        "window1024" if w == 1024 else f"window{w}":
            (b * sum(min(x + 1, w) for x in range(s)),
             ((j <= ri) & (j >= ri - (w - 1))).view(1, 1, -1, s)),
        "padding": (s * int(lengths.sum().item()),
                    (j < lengths.view(-1, 1, 1, 1)).expand(b, 1, rows.numel(), s)),
    }
    flex = flex_callables(run)
    for dname in run.args.dtypes:
        dtype = DTYPES[dname]
        q, k, v = (run.randn(b, h, s, d, dtype=dtype) for _ in range(3))
        for mname, (pairs, visible) in masks.items():
            base = {"section": "masked", "mask": mname, "dtype": dname, "B": b, "Hq": h,
                    "Hkv": h, "Sq": s, "Sk": s, "D": d, "visible_pairs": pairs}
            ref = reference_rows(q, k, v, rows, visible)
            flops = 4 * h * d * pairs

            def check(out, ref=ref):
                return max_err(out[:, :, rows], ref)

            def work(ms, flops=flops):
                return {"tflops": flops / (ms * 1e9)}
            kind = "causal" if mname == "causal" else ("padding" if mname == "padding"
                                                       else "window")
            # fattn.triton.attention
            if kind == "causal":
                tri = ({"causal": True}, "causal=True")
            elif kind == "window":
                tri = ({"causal": True, "window_size": (w - 1, 0)},
                       f"causal=True, window_size=({w - 1}, 0)")
            else:
                tri = ({"attn_mask": padding_mask}, "attn_mask (B,1,1,S) bool")
            run.row("masked", base, "fattn_triton", f"fattn.triton.attention({tri[1]})",
                    lambda kw=tri[0]: triton_call("attention", q, k, v, **kw), check, work)
            # the dispatched operator
            if kind == "causal":
                op = (lambda: lambda: fattn.scaled_dot_product_attention(q, k, v, is_causal=True),
                      "fattn.scaled_dot_product_attention(is_causal=True)")
            elif kind == "window":
                op = (lambda: lambda: fattn.flash_attention(q, k, v, layout="bhsd", causal=True,
                                                            window_size=(w - 1, 0)),
                      f"fattn.flash_attention(causal=True, window_size=({w - 1}, 0))")
            else:
                op = (lambda: lambda: fattn.scaled_dot_product_attention(
                    q, k, v, attn_mask=padding_mask),
                      "fattn.scaled_dot_product_attention(attn_mask (B,1,1,S) bool)")
            run.row("masked", base, "fattn_op", op[1], op[0], check, work)
            # torch SDPA, one backend at a time
            for backend in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
                if kind == "causal":
                    kw, variant = {"is_causal": True}, "is_causal=True"
                elif kind == "window":
                    kw, variant = {"attn_mask": window_mask}, "attn_mask (1,1,S,S) bool"
                else:
                    kw, variant = {"attn_mask": padding_mask}, "attn_mask (B,1,1,S) bool"

                def make(backend=backend, kw=kw):
                    if backend == "sdpa_flash" and "attn_mask" in kw:
                        raise Skip("SDPA's flash backend takes no attn_mask")
                    return sdpa_call(run, backend, q, k, v, **kw)
                run.row("masked", base, backend, variant, make, check, work)
            # FlexAttention with the same mask as a block mask
            run.row("masked", base, "flex", flex["variant"],
                    lambda kind=kind: flex["make"](q, k, v, kind, w, lengths), check, work)
            del ref
            run.free()
        if dname == run.args.dtypes[0]:
            bench_score_variants(run, q, k, v, rows, dname)
        del q, k, v
        run.free()


def bench_score_variants(run: Run, q, k, v, rows, dname: str):
    """The variants that change scores, on the masked section's inputs: fattn_triton and
    fattn_op (fattn.flash_attention, the dispatched operator) side by side; torch's SDPA
    takes none of them."""
    import fattn
    b, h, s, d = q.shape
    dev = q.device
    slopes = torch.exp2(-8.0 * torch.arange(1, h + 1, device=dev) / h).float()
    sinks = torch.randn(h, generator=torch.Generator().manual_seed(11)).to(dev)
    causal_pairs = b * s * (s + 1) // 2
    j = torch.arange(s, device=dev).view(1, -1)
    variants = {  # name: (call kwargs, visible pairs, visible at the sampled rows, reference kwargs)
        "softcap30": ({"softcap": 30.0}, b * s * s, None, {"softcap": 30.0}),
        "alibi_sinks_causal": ({"causal": True, "alibi_slopes": slopes, "sinks": sinks},
                               causal_pairs, (j <= rows.view(-1, 1)).view(1, 1, -1, s),
                               {"alibi_slopes": slopes, "sinks": sinks}),
    }
    for name, (kwargs, pairs, visible, ref_kwargs) in variants.items():
        base = {"section": "masked", "mask": name, "dtype": dname, "B": b, "Hq": h, "Hkv": h,
                "Sq": s, "Sk": s, "D": d, "visible_pairs": pairs}
        ref = reference_rows(q, k, v, rows, visible, **ref_kwargs)

        def check(out, ref=ref):
            return max_err(out[:, :, rows], ref)

        def work(ms, flops=4 * h * d * pairs):
            return {"tflops": flops / (ms * 1e9)}
        said = ", ".join(f"{key}=" + ("(H,)" if torch.is_tensor(x) else str(x))
                         for key, x in kwargs.items())
        run.row("masked", base, "fattn_triton", f"fattn.triton.attention({said})",
                lambda kw=kwargs: triton_call("attention", q, k, v, **kw), check, work)
        run.row("masked", base, "fattn_op", f"fattn.flash_attention({said})",
                lambda kw=kwargs: (lambda: fattn.flash_attention(q, k, v, layout="bhsd", **kw)),
                check, work)
        del ref
        run.free()


def flex_callables(run: Run) -> dict:
    """FlexAttention: compiled on CUDA, eager on the CPU (smoke). Block masks cached per
    (kind, shape): built once, outside the timing."""
    cache = {}
    state = {}

    def make(q, k, v, kind, w, lengths):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if "fn" not in state:
            if run.cuda:  # one compilation per mask and dtype: 6, beside torch's limit of 8
                if hasattr(torch._dynamo.config, "recompile_limit"):
                    torch._dynamo.config.recompile_limit = max(
                        64, torch._dynamo.config.recompile_limit)
                state["fn"] = torch.compile(flex_attention, dynamic=False)
            else:
                state["fn"] = flex_attention
        b, _, s, _ = q.shape
        key = (kind, b, s, w)
        if key not in cache:
            if kind == "causal":
                def mask_mod(bi, hi, qi, ki):
                    return ki <= qi
                mb = None
            elif kind == "window":
                def mask_mod(bi, hi, qi, ki):
                    return (ki <= qi) & (ki >= qi - (w - 1))
                mb = None
            else:
                def mask_mod(bi, hi, qi, ki):
                    return ki < lengths[bi]
                mb = b
            cache[key] = create_block_mask(mask_mod, mb, None, s, s, device=str(q.device))
        block_mask, fn = cache[key], state["fn"]
        return lambda: fn(q, k, v, block_mask=block_mask)
    return {"make": make, "variant": "flex_attention compiled + create_block_mask"
            if run.cuda else "flex_attention eager + create_block_mask (smoke)"}


def bench_forward(run: Run):
    import fattn
    dev = run.device
    for b, h, s, d in sizes(run.args.smoke)["forward"]:
        rows = sample_rows(s, dev)
        for dname in run.args.dtypes:
            dtype = DTYPES[dname]
            q, k, v = (run.randn(b, h, s, d, dtype=dtype) for _ in range(3))
            for causal in (False, True):
                pairs = b * (s * (s + 1) // 2 if causal else s * s)
                base = {"section": "forward", "dtype": dname, "B": b, "Hq": h, "Hkv": h,
                        "Sq": s, "Sk": s, "D": d, "causal": causal, "visible_pairs": pairs}
                visible = (torch.arange(s, device=dev).view(1, -1) <= rows.view(-1, 1)) \
                    if causal else None
                ref = reference_rows(q, k, v, rows, visible)

                def check(out, ref=ref, rows=rows):
                    return max_err(out[:, :, rows], ref)

                def work(ms, flops=4 * h * d * pairs):
                    return {"tflops": flops / (ms * 1e9)}
                run.row("forward", base, "fattn_triton",
                        f"fattn.triton.attention(causal={causal})",
                        lambda c=causal: triton_call("attention", q, k, v, causal=c), check, work)
                run.row("forward", base, "fattn_op",
                        f"fattn.scaled_dot_product_attention(is_causal={causal})",
                        lambda c=causal: (lambda: fattn.scaled_dot_product_attention(
                            q, k, v, is_causal=c)), check, work)
                for backend in ("sdpa_flash", "sdpa_cudnn"):
                    run.row("forward", base, backend, f"is_causal={causal}",
                            lambda be=backend, c=causal: sdpa_call(run, be, q, k, v, is_causal=c),
                            check, work)
                del ref
            del q, k, v
            run.free()


def decode_reference(q, k_cache, v_cache, batches, block_table=None):
    """softmax(q kᵀ/sqrt(D)) v of one query per sequence in `batches`, from FlashAttention's
    layouts (q (B, 1, Hq, D), caches (B, Sk, Hkv, D), or pages (num_blocks, block_size, Hkv,
    D) with block_table (B, Sk / block_size)): (len(batches), Hq, D), in float64, or float32
    where the float64 copies of K and V would pass FLOAT64_CACHE_LIMIT."""
    def rows(cache, bi):  # (Sk, Hkv, D)
        if block_table is None:
            return cache[bi]
        return cache[block_table[bi].long()].flatten(0, 1)
    hkv, d = k_cache.shape[2:]
    sk = k_cache.size(1) if block_table is None else block_table.size(1) * k_cache.size(1)
    hq = q.size(2)
    dt = torch.float64 if 2 * sk * hkv * d * 8 <= FLOAT64_CACHE_LIMIT else torch.float32
    outs = []
    for bi in batches:
        qg = q[bi, 0].to(dt).view(hkv, hq // hkv, d)             # (Hkv, G, D)
        kb = rows(k_cache, bi).to(dt).permute(1, 2, 0)            # (Hkv, D, Sk)
        vb = rows(v_cache, bi).to(dt).permute(1, 0, 2)            # (Hkv, Sk, D)
        p = torch.softmax(torch.matmul(qg, kb) / math.sqrt(d), dim=-1)
        outs.append(torch.matmul(p, vb).reshape(hq, d).double())
        del kb, vb, p
    return torch.stack(outs), dt


def bench_decode(run: Run):
    import fattn
    cfg = sizes(run.args.smoke)
    dc = cfg["decode"]
    hq, hkv, d = dc["Hq"], dc["Hkv"], dc["D"]
    dev = run.device
    # The roof: a device-to-device copy, bytes read + written / time.
    n = cfg["copy_bytes"] // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    copy = run.row("decode", {"section": "decode", "dtype": "bfloat16", "B": None, "Hq": None,
                              "Hkv": None, "Sq": None, "Sk": None, "D": None,
                              "bytes": 4 * n}, "torch_copy", f"dst.copy_(src), {2 * n} bytes",
                   lambda: (lambda: dst.copy_(src)), None,
                   lambda ms: {"gbps": 4 * n / (ms * 1e6)})
    del src, dst
    run.free()
    roof = copy.get("gbps") if copy["status"] == "ok" else None
    dtype = torch.bfloat16
    for sk in dc["Sks"]:
        for b in dc["Bs"]:
            q = run.randn(b, 1, hq, d, dtype=dtype)
            k_cache = run.randn(b, sk, hkv, d, dtype=dtype)
            v_cache = run.randn(b, sk, hkv, d, dtype=dtype)
            seqlens = torch.full((b,), sk, dtype=torch.int32, device=dev)
            batches = sorted({0, b - 1})
            ref, ref_dtype = decode_reference(q, k_cache, v_cache, batches)
            kv_bytes = 2 * b * sk * hkv * d * k_cache.element_size()
            base = {"section": "decode", "dtype": "bfloat16", "B": b, "Hq": hq, "Hkv": hkv,
                    "Sq": 1, "Sk": sk, "D": d, "bytes": kv_bytes,
                    "reference": str(ref_dtype).replace("torch.", "")}

            def check_bshd(out, ref=ref, batches=batches):  # (B, 1, Hq, D)
                return max_err(out[batches, 0], ref)

            def check_bhsd(out, ref=ref, batches=batches):  # (B, Hq, 1, D)
                return max_err(out[batches, :, 0], ref)

            def work(ms, kv_bytes=kv_bytes):
                gbps = kv_bytes / (ms * 1e6)
                return {"gbps": gbps, "pct_of_copy": 100 * gbps / roof if roof else None}
            run.row("decode", base, "fattn_triton",
                    "fattn.triton.attention_with_kvcache(cache_seqlens=Sk), (B,S,H,D) cache",
                    lambda: triton_call("attention_with_kvcache", q, k_cache, v_cache,
                                        cache_seqlens=seqlens), check_bshd, work)
            def op_call(k_cache=k_cache, v_cache=v_cache, table=None, q=q, seqlens=seqlens):
                return lambda: fattn.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                             cache_seqlens=seqlens,
                                                             block_table=table)
            row = run.row("decode", base, "fattn_op",
                          "fattn.flash_attn_with_kvcache(cache_seqlens=Sk), (B,S,H,D) cache",
                          op_call, check_bshd, work)
            if row["status"] == "ok":
                row["host_ms"] = host_ms(op_call())
                run.write("decode")
            run.row("decode", base, "fattn_op",
                    "CUDA graph replay of flash_attn_with_kvcache(cache_seqlens=Sk)",
                    lambda: graph_replay(run, op_call()), check_bshd, work)
            if sk == dc["stages_at"]:  # the C++ decode kernel's ring depth, each forced
                for stages in dc["stages"]:
                    run.row("decode", dict(base, decode_stages=stages), "fattn_op",
                            f"flash_attn_with_kvcache, decode_stages={stages}",
                            lambda s=stages: with_decode_stages(op_call(), s), check_bshd, work)
            for page in dc["pages"]:
                if sk % page:
                    continue
                # the same memory as pages, each sequence's pages scattered over the cache
                k_pages, v_pages = (c.view(-1, page, hkv, d) for c in (k_cache, v_cache))
                table = torch.randperm(k_pages.size(0), generator=run.gen, device=dev)
                table = table.to(torch.int32).view(b, sk // page)
                paged_ref, _ = decode_reference(q, k_pages, v_pages, batches, table)
                run.row("decode", dict(base, block_size=page), "fattn_op",
                        f"flash_attn_with_kvcache, paged: block_size {page}, pages scattered",
                        lambda kp=k_pages, vp=v_pages, t=table: op_call(kp, vp, t),
                        lambda out, r=paged_ref: max_err(out[batches, 0], r), work)
                del paged_ref, table
            # torch on its own layout: (B, H, S, D) contiguous copies of the same cache
            torch_kv = {}

            def make_sdpa(backend):
                run.needs_cuda()
                if not torch_kv:
                    torch_kv["k"] = k_cache.transpose(1, 2).contiguous()
                    torch_kv["v"] = v_cache.transpose(1, 2).contiguous()
                    torch_kv["q"] = q.transpose(1, 2).contiguous()
                return sdpa_call(run, backend, torch_kv["q"], torch_kv["k"], torch_kv["v"],
                                 enable_gqa=True)
            for backend in ("sdpa_cudnn", "sdpa_flash"):
                run.row("decode", base, backend, "enable_gqa=True, (B,H,S,D) contiguous cache",
                        lambda be=backend: make_sdpa(be), check_bhsd, work)
            del q, k_cache, v_cache, seqlens, ref, torch_kv
            run.free()


def with_decode_stages(call, stages: int):
    """The call with the C++ decode kernel's ring depth forced to `stages` (fattn._C's
    process-wide setting, restored after each call)."""
    from fattn import _C

    def staged():
        before = _C.set_cuda_decode_stages(stages)
        try:
            return call()
        finally:
            _C.set_cuda_decode_stages(before)
    return staged


def host_ms(call, calls: int = 5) -> float:
    """Milliseconds of host time one call takes to return (its launches queued, no
    synchronisation in the timing), the best of `calls`: what a decode step costs the CPU."""
    best = math.inf
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return round(best * 1e3, 4)


def graph_replay(run: Run, call):
    """The call captured once in a CUDA graph, replayed (raises where the call cannot be
    captured: a host synchronisation inside it, say)."""
    run.needs_cuda()
    call()  # compiles and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()

    def replay():
        graph.replay()
        return out
    return replay


def bench_training(run: Run):
    """Forward + backward (FLOPs counted as 3.5x the forward's: the backward's five
    products against the forward's two): fattn's Triton forward and backward called
    directly, the same through autograd (fattn.scaled_dot_product_attention), SDPA flash and
    cuDNN; the peak memory one step allocates beyond its inputs; max_err of the three
    gradients against float32 autograd of the definition on the first (batch, 2 heads)."""
    import fattn
    from fattn import cuda_dispatch
    capability = torch.cuda.get_device_capability() if run.cuda else None
    for b, h, s, d in sizes(run.args.smoke)["training"]:
        for dname in run.args.dtypes:
            dtype = DTYPES[dname]
            # which backward the dispatched operator runs (the C++ Hopper backward or Triton)
            op_backward = cuda_dispatch.plan("attention_backward", head_dim=d, dtype=dtype,
                                             capability=capability).engine
            q, k, v, dout = (run.randn(b, h, s, d, dtype=dtype) for _ in range(4))
            for causal in (False, True):
                pairs = b * (s * (s + 1) // 2 if causal else s * s)
                base = {"section": "training", "dtype": dname, "B": b, "Hq": h, "Hkv": h,
                        "Sq": s, "Sk": s, "D": d, "causal": causal, "visible_pairs": pairs}
                leaves = [t[:1, :2].float().requires_grad_() for t in (q, k, v)]
                F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(
                    dout[:1, :2].float())
                ref = [t.grad for t in leaves]

                def check(grads, ref=ref):
                    return max(max_err(g[:1, :2], r) for g, r in zip(grads, ref))

                def work(ms, flops=3.5 * 4 * h * d * pairs):
                    return {"tflops": flops / (ms * 1e9)}

                def autograd_step(forward):
                    def step():
                        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                        return torch.autograd.grad(forward(*leaves), leaves, dout)
                    return step

                def triton_step(c=causal, tiles=None):
                    import fattn.triton

                    def step():
                        out, lse = fattn.triton.attention(q, k, v, causal=c, return_lse=True)
                        return fattn.triton.attention_backward(dout, q, k, v, out, lse,
                                                               causal=c, tiles=tiles)[:3]
                    return step

                def sdpa_step(backend, c=causal):
                    call = None

                    def forward(*t):
                        nonlocal call
                        call = sdpa_call(run, backend, *t, is_causal=c)
                        return call()
                    run.needs_cuda()
                    return autograd_step(forward)

                sweep = [("fattn_triton", f"fattn.triton.attention + attention_backward, "
                                          f"tiles {format_tiles(t)}",
                          lambda t=t: triton_step(tiles=t), True)
                         for t in run.args.backward_tiles]
                for impl, variant, make, deterministic in [
                        ("fattn_triton", "fattn.triton.attention + attention_backward",
                         triton_step, True),
                        ("fattn_op", "autograd through fattn.scaled_dot_product_attention "
                                     f"(backward: {op_backward})",
                         lambda c=causal: autograd_step(
                             lambda *t: fattn.scaled_dot_product_attention(*t, is_causal=c)),
                         True),
                        ("sdpa_flash", "autograd", lambda: sdpa_step("sdpa_flash"), None),
                        ("sdpa_cudnn", "autograd", lambda: sdpa_step("sdpa_cudnn"), None),
                        *sweep]:
                    row = run.row("training", dict(base, causal=causal,
                                                   deterministic=deterministic), impl,
                                  f"{variant} (causal={causal})", make, check, work)
                    if run.cuda and row["status"] == "ok":
                        row["peak_extra_mib"] = peak_extra_mib(make())
                        run.write("training")
                del ref
            del q, k, v, dout
            run.free()


def parse_tiles(text: str):
    """'M,N,W,S/M,N,W,S' -> the (dK/dV, dQ) configurations of attention_backward's tiles=."""
    try:
        kernels = [tuple(int(x) for x in part.split(",")) for part in text.split("/")]
    except ValueError:
        kernels = []
    if len(kernels) != 2 or any(len(k) != 4 for k in kernels):
        raise argparse.ArgumentTypeError(
            f"--backward-tiles takes BLOCK_M,BLOCK_N,WARPS,STAGES/BLOCK_M,BLOCK_N,WARPS,STAGES "
            f"(dK/dV kernel / dQ kernel), got {text!r}")
    return tuple(kernels)


def format_tiles(tiles) -> str:
    return " / ".join("{}x{} w{} s{}".format(*t) for t in tiles)


def peak_extra_mib(step) -> float:
    """MiB one call allocates at its peak beyond what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return round((peak - before) / 2**20, 1)


def write_evidence(out: Path, info: dict) -> None:
    """evidence.json: the machine and software, and per section file in `out` (this run's
    and those a run of other --sections wrote beside them, e.g. one process per section)
    its date, time and row counts by status."""
    doc = dict(info, sections={})
    for section in SECTIONS:
        path = out / f"{section}.json"
        if not path.exists():
            continue
        try:
            sec = json.loads(path.read_text())
        except ValueError:
            continue
        counts = {}
        for r in sec.get("rows", []):
            key = str(r.get("status", "?")).split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        doc["sections"][section] = {"date": sec.get("machine", {}).get("date"),
                                    "seconds": sec.get("seconds"), "rows": counts}
    (out / "evidence.json").write_text(json.dumps(doc, indent=1) + "\n")


BENCHES = {"masked": bench_masked, "forward": bench_forward, "decode": bench_decode,
           "training": bench_training}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fattn.bench --gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes; on the CPU unless --device cuda (proves the script only)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda, or cpu with --smoke")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
                   help="of the masked and forward sections (decode: bfloat16)")
    p.add_argument("--results", default="results",
                   help="the results root: files go to RESULTS/<machine>/gpu/ (default results)")
    p.add_argument("--out", default=None, help="the output directory itself (over --results)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="seconds for the whole run (0: no limit); see the shares above")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backward-tiles", nargs="*", type=parse_tiles, default=[],
                   metavar="M,N,W,S/M,N,W,S",
                   help="training: fattn_triton rows at these backward tiles too (dK/dV "
                        "kernel / dQ kernel: block_m,block_n,num_warps,num_stages; "
                        "fattn.triton.compile_check --backward-sweep lists candidates)")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    device = torch.device(args.device)
    if device.type == "cpu":
        if not args.smoke:
            p.error("--device cpu is for --smoke only: it measures nothing")
        # Triton reads it when a kernel is defined: before fattn.triton is imported.
        os.environ["TRITON_INTERPRET"] = "1"
        if "fattn.triton" in sys.modules:
            print("fattn.bench --gpu: fattn.triton was imported before TRITON_INTERPRET was "
                  "set: its rows will fail on CPU tensors", file=sys.stderr)
    elif not torch.cuda.is_available():
        p.error("no CUDA device visible to torch (--smoke runs on the CPU)")
    info = machine_info(device)
    out = Path(args.out) if args.out else Path(args.results) / info["machine"] / "gpu"
    out.mkdir(parents=True, exist_ok=True)
    write_evidence(out, info)
    print(f"fattn.bench --gpu: {info['device']}, driver {info.get('driver')}, CUDA "
          f"{info['cuda']}, torch {info['torch']}, triton {info['triton']}, fattn "
          f"{info['fattn']} (CUDA backend: {info['fattn_cuda_backend']}); -> {out}", flush=True)
    run = Run(args, device, info, out)
    for section in args.sections:
        print(f"== {section}", flush=True)
        run.begin(section)
        run.write(section)
        try:
            BENCHES[section](run)
        except Exception as e:  # noqa: BLE001 -- a section's set-up failed; the others run
            text = " | ".join(str(e).strip().splitlines()[:4])[:600]
            run.rows[section].append({"section": section, "status":
                                      f"error: {type(e).__name__}: {text}"})
            run.write(section)
            print(f"  {section}: error: {type(e).__name__}: {text}", flush=True)
        run.free()
    seconds = round(time.monotonic() - run.start, 1)
    write_evidence(out, info)
    counts = {}
    for section in args.sections:
        for r in run.rows[section]:
            key = r["status"].split(":")[0]
            counts[key] = counts.get(key, 0) + 1
    print(f"wrote {out}/evidence.json, " + ", ".join(f"{s}.json" for s in args.sections) +
          f" in {seconds} s: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
