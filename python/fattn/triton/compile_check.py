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

from . import backward, forward

# The policy combinations compiled, named as the calls that use them; launch options as
# problem.tile_config gives them (num_warps 4, num_stages 3: Triton's defaults)
BASE = dict(CAUSAL=0, WINDOW=False, MASK_KIND=0, SOFTCAP=False, ALIBI=False, SINKS_ON=False,
            LENGTHS=0, PAGED=False, PACK_GQA=False, SPLIT=False, PRECISION="tf32x3",
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
    ("decode_paged_split", "bf16", dict(LENGTHS=1, PAGED=True, PACK_GQA=True, SPLIT=True,
                                        CAUSAL=2, BLOCK_M=16)),
]
# the backward's kernels: (name, dtype, constexprs); dK/dV tile 32 × 64, dQ tile 64 × 32
BACKWARD_BASE = dict(CAUSAL=0, WINDOW=False, MASK_KIND=0, SOFTCAP=False, ALIBI=False, LENGTHS=0,
                     PRECISION="tf32x3", UPCAST=False, BLOCK_D=128)
BACKWARD = [
    ("plain", "bf16", {}),
    ("variants", "fp16", dict(CAUSAL=2, WINDOW=True, MASK_KIND=2, SOFTCAP=True, ALIBI=True)),
    ("varlen_float32", "fp32", dict(LENGTHS=2, CAUSAL=2, BLOCK_D=64)),
]
_POINTERS = {"LSE": "fp32", "DELTA": "fp32", "MASK": "i1", "COVER": "i8", "SLOPES": "fp32", "SINKS": "fp32",
             "SEQ_Q": "i32", "SEQ_K": "i32", "TABLE": "i32"}
_FLOATS = {"scale", "softcap"}


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


def compile_all(arch: int = 90, num_warps: int = 4, num_stages: int = 3):
    """Compiles every combination (and the split combine); returns one row per kernel."""
    target = GPUTarget("cuda", arch, 32)
    rows = []
    for name, dtype, over in COMBINATIONS:
        start = time.perf_counter()
        signature, values = _signature(forward._forward_kernel, dtype, {**BASE, **over})
        kernel = triton.compile(ASTSource(forward._forward_kernel, signature, values),
                                target=target,
                                options={"num_warps": num_warps, "num_stages": num_stages})
        rows.append(dict(kernel="forward", combination=name, dtype=dtype,
                         shared_bytes=kernel.metadata.shared,
                         seconds=round(time.perf_counter() - start, 2),
                         **_ptxas_report(kernel.asm["ptx"], arch)))
    for name, dtype, over in BACKWARD:
        for kernel_fn, tiles in ((backward._dkdv_kernel, dict(BLOCK_M=32, BLOCK_N=64)),
                                 (backward._dq_kernel, dict(BLOCK_M=64, BLOCK_N=32))):
            signature, values = _signature(kernel_fn, dtype, {**BACKWARD_BASE, **over, **tiles})
            kernel = triton.compile(ASTSource(kernel_fn, signature, values), target=target,
                                    options={"num_warps": num_warps, "num_stages": num_stages})
            rows.append(dict(kernel=kernel_fn.__name__.strip("_"), combination=name, dtype=dtype,
                             shared_bytes=kernel.metadata.shared,
                             **_ptxas_report(kernel.asm["ptx"], arch)))
    fn = forward._combine_kernel
    signature, values = {}, {}
    for index, name in enumerate(fn.arg_names):
        if fn.params[index].is_constexpr:
            signature[name] = "constexpr"
            values[(index,)] = {"SPLITS": 8, "BLOCK_D": 128}[name]
        elif name in ("OP", "LSEP", "LSE"):
            signature[name] = "*fp32"
        elif name == "O":
            signature[name] = "*bf16"
        else:
            signature[name] = "i32"
    kernel = triton.compile(ASTSource(fn, signature, values), target=target)
    rows.append(dict(kernel="combine", combination="splits8", dtype="bf16",
                     shared_bytes=kernel.metadata.shared, **_ptxas_report(kernel.asm["ptx"], arch)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("fattn.triton.compile_check: unset TRITON_INTERPRET (the interpreter "
                 "compiles nothing)")
    rows = compile_all(args.arch)
    for row in rows:
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
