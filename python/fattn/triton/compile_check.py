"""Compiles fattn's Triton kernels for a GPU without one: Triton's own compiler down to PTX
and ptxas's report (registers, spills) for each policy combination and tile size, for
sm_90 by default.

    python -m fattn.triton.compile_check [--arch 90] [--json FILE]

Triton's interpreter (how the tests run the kernels on a CPU) executes the kernel's Python
with numpy and never compiles it: code that only the compiler rejects (a non-constexpr
global, a type mismatch across an if) passes there. This compiles every combination
below, so such code fails in CI (tests/python/test_triton_compile.py). Run it with
TRITON_INTERPRET unset: under the interpreter @triton.jit gives no compilable function.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import backward, forward, problem

# The policy combinations compiled, named as the calls that use them; launch options as
# problem.tile_config gives them (num_warps 4, num_stages 3: Triton's defaults)
BASE = dict(CAUSAL=0, WINDOW=False, MASK_KIND=0, SOFTCAP=False, ALIBI=False, SINKS_ON=False,
            DROPOUT=False, LENGTHS=0, PAGED=False, PACK_GQA=False, SPLIT=False, PRECISION="tf32x3",
            UPCAST=False, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128)
COMBINATIONS = [  # (name, dtype, constexprs over BASE)
    ("plain", "fp16", {}),
    ("causal", "bf16", dict(CAUSAL=1)),
    ("variants", "bf16", dict(CAUSAL=2, WINDOW=True, MASK_KIND=1, SOFTCAP=True, ALIBI=True,
                              SINKS_ON=True)),
    ("additive_mask_d64", "fp16", dict(MASK_KIND=2, BLOCK_D=64)),
    ("float32_3xtf32", "fp32", dict(CAUSAL=1, BLOCK_D=64)),
    ("float32_tf32", "fp32", dict(PRECISION="tf32", BLOCK_D=64)),
    ("d256_two_chains", "bf16", dict(CAUSAL=2, BLOCK_D=256, BLOCK_N=32)),
    ("varlen", "fp16", dict(LENGTHS=2, CAUSAL=2, WINDOW=True)),
    ("dropout", "bf16", dict(DROPOUT=True, CAUSAL=1)),
    ("varlen_paged_seqused", "fp16", dict(LENGTHS=3, PAGED=True, CAUSAL=2)),
    ("decode_paged_split", "bf16", dict(LENGTHS=1, PAGED=True, PACK_GQA=True, SPLIT=True,
                                        CAUSAL=2, BLOCK_M=16)),
]
# the backward's kernels: (name, dtype, constexprs), each at problem.BACKWARD_TILES' tiles
# and launch options for its BLOCK_D
BACKWARD_BASE = dict(CAUSAL=0, WINDOW=False, MASK_KIND=0, SOFTCAP=False, ALIBI=False,
                     DROPOUT=False, LENGTHS=0,
                     PRECISION="tf32x3", UPCAST=False, BLOCK_D=128)
BACKWARD = [
    ("plain", "bf16", {}),
    ("variants", "fp16", dict(CAUSAL=2, WINDOW=True, MASK_KIND=2, SOFTCAP=True, ALIBI=True)),
    ("d64_causal", "fp16", dict(CAUSAL=1, BLOCK_D=64)),
    ("d256_window", "bf16", dict(CAUSAL=2, WINDOW=True, BLOCK_D=256)),
    ("varlen_float32", "fp32", dict(LENGTHS=2, CAUSAL=2, BLOCK_D=64)),
    ("dropout", "bf16", dict(DROPOUT=True, CAUSAL=1)),
]
# --backward-sweep: candidate (block_m, block_n, num_warps, num_stages) per kernel and
# BLOCK_D, compiled in float16 (what problem.BACKWARD_TILES was chosen from)
BACKWARD_CANDIDATES = {
    "dkdv": {64: [(32, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 3)],
             128: [(32, 64, 4, 3), (16, 64, 4, 3), (32, 64, 8, 3), (32, 64, 8, 2),
                   (64, 64, 8, 2), (32, 128, 8, 2)],
             256: [(16, 32, 4, 3), (16, 32, 8, 2), (16, 64, 8, 2)]},
    "dq": {64: [(64, 32, 4, 3), (64, 32, 8, 3), (128, 32, 8, 3)],
           128: [(64, 32, 4, 3), (64, 32, 8, 3), (128, 32, 8, 3), (64, 64, 8, 3)],
           256: [(32, 16, 4, 3), (32, 16, 8, 2), (32, 32, 8, 2), (64, 16, 8, 2)]},
}
_POINTERS = {"LSE": "fp32", "DELTA": "fp32", "MASK": "i1", "COVER": "i8", "SLOPES": "fp32", "SINKS": "fp32",
             "SEQ_Q": "i32", "SEQ_K": "i32", "SEQ_USED": "i32", "TABLE": "i32", "SEED": "i64"}
_FLOATS = {"scale", "softcap", "dropout_scale"}


def _signature(fn, dtype, constexprs):
    signature, values = {}, {}
    for index, name in enumerate(fn.arg_names):
        if fn.params[index].is_constexpr:
            signature[name] = "constexpr"
            values[(index,)] = constexprs[name]
        elif name in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV"):
            signature[name] = "*" + dtype
        elif name in _POINTERS:
            signature[name] = "*" + _POINTERS[name]
        else:
            signature[name] = "fp32" if name in _FLOATS else "i32"
    return signature, values


def _ptxas_report(ptx: str, arch: int) -> dict:
    """ptxas -v on the PTX: registers and spill bytes (Triton's bundled ptxas)."""
    found = glob.glob(os.path.join(triton.__path__[0], "backends", "nvidia", "bin", "ptxas"))
    if not found:
        return {}
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        run = subprocess.run([found[0], f"-arch=sm_{arch}a" if arch >= 90 else f"-arch=sm_{arch}",
                              "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if run.returncode != 0:
        raise RuntimeError(f"ptxas failed:\n{run.stderr}")
    report = {}
    for line in run.stderr.splitlines():
        if "registers" in line:
            report["registers"] = int(line.split("Used ")[1].split(" registers")[0])
        if "spill stores" in line:
            report["spill_store_bytes"] = int(line.split(",")[1].split("bytes")[0])
    return report


def product_transposes(ttgir: str) -> int:
    """tt.trans ops whose source is a product tile (a tensor in an MMA accumulator layout,
    #mma...) in a kernel's TritonGPU IR. Triton 3.6 on Hopper compiles such a tile feeding
    the next product (dV += trans(P)·dO) wrongly: the dK/dV kernel's gradients at D = 80-128
    on an H200 (docs/triton.md, "The backward"). Transposed loads are not counted: they
    become shared-memory views (ttg.memdesc_trans) for wgmma, or register shuffles of a
    loaded tile for mma.sync."""
    count = 0
    for line in ttgir.splitlines():
        if " = tt.trans " in line:
            source = line.split(" : ", 1)[1].split(" -> ")[0]
            count += ", #mma" in source
    return count


def _forward_compiled(dtype, over, target, num_warps=4, num_stages=3):
    """The forward kernel at BASE with `over`'s constexprs: the one with dropout's and
    seqused_k's arguments where the combination takes them (problem.run_forward's choice)."""
    constexprs = {**BASE, **over}
    full = constexprs["DROPOUT"] or constexprs["LENGTHS"] == 3
    kernel = forward._forward_full_kernel if full else forward._forward_kernel
    signature, values = _signature(kernel, dtype, constexprs)
    return triton.compile(ASTSource(kernel, signature, values), target=target,
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _backward_compiled(kernel_name, dtype, constexprs, config, target):
    """The dK/dV ("dkdv") or dQ ("dq") kernel at a tile configuration."""
    fn = {"dkdv": backward._dkdv_kernel, "dq": backward._dq_kernel}[kernel_name]
    signature, values = _signature(fn, dtype, {**constexprs, "BLOCK_M": config.block_m,
                                               "BLOCK_N": config.block_n})
    return triton.compile(ASTSource(fn, signature, values), target=target,
                          options=problem.launch_options(config))


def _reduction_compiled(name, target):
    """A per-row reduction kernel of REDUCTIONS: pointers as given, every other argument an
    int32."""
    fn, pointers, constexprs = REDUCTIONS[name]()
    signature, values = {}, {}
    for index, arg in enumerate(fn.arg_names):
        if fn.params[index].is_constexpr:
            signature[arg] = "constexpr"
            values[(index,)] = constexprs[arg]
        else:
            signature[arg] = pointers.get(arg, "i32")
    return triton.compile(ASTSource(fn, signature, values), target=target)


def _report(kernel, arch) -> dict:
    return dict(shared_bytes=kernel.metadata.shared,
                product_transposes=product_transposes(kernel.asm["ttgir"]),
                **_ptxas_report(kernel.asm["ptx"], arch))


def _compile_backward(kernel_name, dtype, constexprs, config, target, arch):
    kernel = _backward_compiled(kernel_name, dtype, constexprs, config, target)
    return dict(tiles=f"{config.block_m}x{config.block_n}", num_warps=config.num_warps,
                num_stages=config.num_stages, **_report(kernel, arch))


def compile_named(name: str, arch: int = 90) -> list:
    """The compiled kernels of one named combination, "<kernel>:<combination>": forward:NAME
    (COMBINATIONS), backward:NAME (BACKWARD: its dK/dV and dQ kernels), delta:dlse and
    combine:splits8 (REDUCTIONS). What a verification record's machine code is computed from
    (fattn.dispatch.machine_code)."""
    target = GPUTarget("cuda", arch, 32)
    kind, _, combination = name.partition(":")
    if kind == "forward":
        for combo, dtype, over in COMBINATIONS:
            if combo == combination:
                return [_forward_compiled(dtype, over, target)]
    elif kind == "backward":
        for combo, dtype, over in BACKWARD:
            if combo == combination:
                constexprs = {**BACKWARD_BASE, **over}
                tiles = zip(("dkdv", "dq"), problem.backward_tiles(constexprs["BLOCK_D"],
                                                                    dropout=constexprs["DROPOUT"]))
                return [_backward_compiled(kernel_name, dtype, constexprs, config, target)
                        for kernel_name, config in tiles]
    elif name in REDUCTIONS:
        return [_reduction_compiled(name, target)]
    raise ValueError(f"no compile combination named {name!r}")


# The per-row reduction kernels: name -> (kernel, pointer types, constexprs), bfloat16 data
REDUCTIONS = {
    "delta:dlse": lambda: (backward._delta_kernel,
                           {"O": "*bf16", "DO": "*bf16", "DLSE": "*fp32", "DELTA": "*fp32"},
                           {"HAS_DLSE": True, "BLOCK_M": problem.DELTA_ROWS, "BLOCK_D": 128}),
    "combine:splits8": lambda: (forward._combine_kernel,
                                {"OP": "*fp32", "LSEP": "*fp32", "LSE": "*fp32", "O": "*bf16"},
                                {"SPLITS": 8, "BLOCK_D": 128}),
}


def backward_sweep(arch: int = 90):
    """Every BACKWARD_CANDIDATES configuration of the plain float16 backward: the rows
    problem.BACKWARD_TILES was chosen from."""
    target = GPUTarget("cuda", arch, 32)
    rows = []
    for kernel_name, by_dim in BACKWARD_CANDIDATES.items():
        for block_d, candidates in by_dim.items():
            for m, n, warps, stages in candidates:
                config = problem.TileConfig(m, n, warps, stages)
                rows.append(dict(kernel=kernel_name, combination=f"sweep_d{block_d}",
                                 dtype="fp16", **_compile_backward(
                                     kernel_name, "fp16", {**BACKWARD_BASE, "BLOCK_D": block_d},
                                     config, target, arch)))
    return rows


def compile_all(arch: int = 90, num_warps: int = 4, num_stages: int = 3):
    """Compiles every combination (and the split combine); returns one row per kernel."""
    target = GPUTarget("cuda", arch, 32)
    rows = []
    for name, dtype, over in COMBINATIONS:
        start = time.perf_counter()
        kernel = _forward_compiled(dtype, over, target, num_warps, num_stages)
        rows.append(dict(kernel="forward", combination=name, dtype=dtype,
                         seconds=round(time.perf_counter() - start, 2), **_report(kernel, arch)))
    for name, dtype, over in BACKWARD:
        constexprs = {**BACKWARD_BASE, **over}
        tiles = dict(zip(("dkdv", "dq"), problem.backward_tiles(constexprs["BLOCK_D"],
                                                                dropout=constexprs["DROPOUT"])))
        for kernel_name, config in tiles.items():
            rows.append(dict(kernel=kernel_name, combination=name, dtype=dtype,
                             **_compile_backward(kernel_name, dtype, constexprs, config,
                                                 target, arch)))
    for name in REDUCTIONS:
        kernel_name, combination = name.split(":")
        rows.append(dict(kernel=kernel_name, combination=combination, dtype="bf16",
                         **_report(_reduction_compiled(name, target), arch)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--backward-sweep", action="store_true",
                        help="compile the backward's candidate tiles (BACKWARD_CANDIDATES) "
                             "instead")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("fattn.triton.compile_check: unset TRITON_INTERPRET (the interpreter "
                 "compiles nothing)")
    rows = backward_sweep(args.arch) if args.backward_sweep else compile_all(args.arch)
    for row in rows:
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
