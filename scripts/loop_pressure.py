#!/usr/bin/env python3
"""What bounds the CPU kernels' inner loops on another microarchitecture, without its
hardware: every innermost loop of a compiled kernel object with at least --min-products
vector products (FMA or vdpbf16ps) goes through llvm-mca for --mcpu, and each row says the
cycles per iteration, the products per cycle, and the busiest ports.

On Intel cores the 512-bit FMAs issue on ports 0 and 5, and port 5 also takes the
shuffles, permutes and register-source broadcasts: a loop whose port-5 pressure exceeds
port 0's is shuffle-bound there, where on AMD (separate FP pipes) it is not. A broadcast
from memory is a load and takes no port-5 slot.

Usage:
  scripts/loop_pressure.py build/CMakeFiles/fattn_kernels_avx512.dir/src/cpu/kernels_isa.cpp.o \
      --mcpu sapphirerapids [--json FILE]
Needs objdump (binutils) and llvm-mca (LLVM 14 models sapphirerapids with the Skylake-X
port layout: ports 0 and 5 for 512-bit FP, 2 and 3 for loads).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

PRODUCTS = re.compile(r"^(vfn?m(add|sub)\d+[ps][sd]|vdpbf16ps|vdpphps|vfmadd\w+)\b")
# Port-5 work on Intel besides the FMAs: shuffles and permutes, widening moves (vpmovzx /
# vpmovsx), and broadcasts from a register (from memory they are loads).
SHUFFLES = re.compile(r"^(vperm\w*|vshuf\w*|vunpck\w*|valign\w*|vinsert\w*|vextract\w*|"
                      r"vpunpck\w*|vpshufb|vpalignr|vpmov[sz]x\w*|"
                      r"vp?broadcast\w*\s+\w+,\s*(?!\w+ PTR))")
INSTRUCTION = re.compile(r"^\s+([0-9a-f]+):\s+(.*)$")
FUNCTION = re.compile(r"^([0-9a-f]+) <(.*)>:$")


@dataclass
class Loop:
    function: str
    instructions: int
    products: int
    shuffles: int
    cycles: float          # llvm-mca's block reciprocal throughput
    products_per_cycle: float
    port_pressure: dict    # port name -> uops per iteration


def short_names(names: list[str]) -> list[str]:
    """Demangled, without template arguments, parameters and anonymous namespaces:
    fattn::cpu::TileOps::scores_block."""
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True).stdout.splitlines()
        names = out if len(out) == len(names) else names
    short = []
    for name in names:
        name = name.replace("(anonymous namespace)::", "")
        while re.search(r"<[^<>]*>", name):
            name = re.sub(r"<[^<>]*>", "", name)
        name = re.sub(r"\(.*$", "", name).split(" ")[-1]
        short.append(name)
    return short


def innermost_loops(object_file: str, min_products: int):
    """(function, instructions) of each backward branch's body that holds no other loop."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "intel", object_file],
                          capture_output=True, text=True, check=True).stdout
    function, body, where, addresses = None, [], {}, []
    loops = []
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            function, body, where, addresses = m.group(2), [], {}, []
            continue
        m = INSTRUCTION.match(line)
        if not m or function is None:
            continue
        address, instruction = int(m.group(1), 16), re.sub(r"\s+<[^>]*>", "", m.group(2))
        where[address] = len(body)
        body.append(instruction)
        addresses.append(address)
        target = jump_target(instruction)
        if target is not None and target in where and target < address:
            start = where[target]
            # innermost: no other backward branch inside; branches out of it (a last,
            # partial step) are left out of the steady state llvm-mca sees
            nested = any((t := jump_target(i)) is not None and addresses[start] <= t < a
                         for i, a in zip(body[start:-1], addresses[start:-1]))
            loop = [i for i in body[start:-1] if jump_target(i) is None and not i.startswith("j")]
            if not nested and sum(bool(PRODUCTS.match(i)) for i in loop) >= min_products:
                loops.append((function, loop))
    return loops


def jump_target(instruction: str):
    """The target address of a conditional jump, else None."""
    m = re.match(r"^j(?!mp)\w+\s+([0-9a-f]+)$", instruction)
    return int(m.group(1), 16) if m else None


def analyse(loop: list[str], mcpu: str) -> tuple[float, dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write(".intel_syntax noprefix\n" + "\n".join(loop) + "\n")
        f.flush()
        out = subprocess.run(["llvm-mca", f"-mcpu={mcpu}", "-iterations=200",
                              "-resource-pressure", "-timeline=false", f.name],
                             capture_output=True, text=True, check=True).stdout
    cycles = float(re.search(r"Block RThroughput:\s+([\d.]+)", out).group(1))
    names = dict(re.findall(r"^\[(\d+)\]\s+-\s+(\S+)$", out, re.M))
    table = out.split("Resource pressure per iteration:")[1].splitlines()
    values = table[2].split()
    pressure = {names[str(i)]: float(v) for i, v in enumerate(values)
                if v != "-" and str(i) in names}
    return cycles, pressure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("object_file")
    parser.add_argument("--mcpu", default="sapphirerapids")
    parser.add_argument("--min-products", type=int, default=16)
    parser.add_argument("--json", help="write the rows here as well")
    args = parser.parse_args()
    for tool in ("objdump", "llvm-mca"):
        if not shutil.which(tool):
            print(f"loop_pressure.py: {tool} is not installed", file=sys.stderr)
            return 2
    found = innermost_loops(args.object_file, args.min_products)
    names = short_names([f for f, _ in found])
    rows, seen = [], set()
    for name, (_, loop) in zip(names, found):
        key = (name, tuple(loop))
        if key in seen:
            continue
        seen.add(key)
        cycles, pressure = analyse(loop, args.mcpu)
        products = sum(bool(PRODUCTS.match(i)) for i in loop)
        rows.append(Loop(name, len(loop), products,
                         sum(bool(SHUFFLES.match(i)) for i in loop), cycles,
                         round(products / cycles, 2), pressure))
    rows.sort(key=lambda r: r.products_per_cycle)
    print(f"{args.object_file}: {len(rows)} innermost loops with >= {args.min_products} "
          f"products, llvm-mca -mcpu={args.mcpu} (2.0 products/cycle: both FMA ports busy)")
    print("| products/cycle | cycles | products | shuffles | busiest ports | function |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        top = sorted(r.port_pressure.items(), key=lambda kv: -kv[1])[:3]
        ports = ", ".join(f"{k.split('Port')[-1] if 'Port' in k else k} {v:.1f}" for k, v in top)
        print(f"| {r.products_per_cycle} | {r.cycles} | {r.products} | {r.shuffles} | "
              f"{ports} | `{r.function}` |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"object": args.object_file, "mcpu": args.mcpu,
                       "loops": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
