"""Which kernel each row of the dispatch table runs by default, per architecture, and whether
a GPU run verified it: computed from the machine code of this checkout, committed as
defaults.json, and shown in README.md and REPORT.md.

    python -m fattn.dispatch.status                 # the table, from this checkout
    python -m fattn.dispatch.status --write         # ... and defaults.json
    python -m fattn.dispatch.status --check         # exit 1 where defaults.json is stale

The C++ kernels' machine code is read from the built libraries (--libraries; default
build/libfattn_cuda*.a) and Triton's compiled for each architecture (cached in fattn's cache
dir). CI runs --check: a change to a verified kernel's machine code changes its row here, so
it cannot land without defaults.json saying that the kernel is no longer verified.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

from . import kernels, preferred, records, _TABLE
from .current import triton_hash
from .machine_code import cpp_hashes

DEFAULTS = Path(__file__).with_name("defaults.json")  # the installed package's copy
SOURCE_DEFAULTS = Path("python/fattn/dispatch/defaults.json")  # a checkout's, from its root
ARCHITECTURES = ("sm_80", "sm_90")  # the ones the C++ build compiles machine code for


def describe(row: dict) -> str:
    """A row's match, in words."""
    parts = [" or ".join(row["needs"])] if "needs" in row else []
    if row["dtypes"] != "*":
        parts.append("/".join(row["dtypes"]))
    if row["head_dims"] != "*":
        parts.append("D " + "/".join(map(str, row["head_dims"])))
    parts.append({"none": "plain", "some": "variants", "any": ""}[row["variants"]])
    if row["attn_mask"] is True:
        parts.append("attn_mask")
    return ", ".join(p for p in parts if p) or "any call"


def machine_code_of(kernel: str, arch: str, cpp: dict) -> str | None:
    if kernels()[kernel]["engine"] == "cuda_cpp":
        return cpp.get(kernel, {}).get(arch)
    return triton_hash(kernel, arch)


def defaults(cpp: dict, known: list[records.Record]) -> list[dict]:
    """Per entry, row and architecture: the default as plan() takes it among the row's
    candidates (dispatch.preferred: the first verified, else the first a GPU has run)."""
    out = []
    for entry, rows in _TABLE["entries"].items():
        for index, row in enumerate(rows):
            for arch in ARCHITECTURES:
                if row["architectures"] != "*" and arch not in row["architectures"]:
                    continue
                found = {kernel: records.find(known, kernel, arch,
                                              machine_code_of(kernel, arch, cpp))
                         for kernel in row["candidates"]}
                chosen = preferred(row["candidates"], lambda kernel: found[kernel] is not None)
                record = found[chosen]
                out.append(dict(entry=entry, row=index, architecture=arch, call=describe(row),
                                kernel=chosen, verified=record is not None,
                                evidence=record.evidence if record else None))
    return out


def markdown(rows: list[dict]) -> str:
    """One line per row of the table, one column per architecture: the default kernel, and
    "verified" with the evidence or "unverified" ("—": the row is for other architectures;
    sm_80 stands for every 8.x GPU, which runs the C++ kernels' sm_80 code)."""
    lines = ["| entry | call | " + " | ".join(ARCHITECTURES) + " |",
             "| --- | --- | " + " | ".join("---" for _ in ARCHITECTURES) + " |"]
    cells: dict[tuple, dict[str, str]] = {}
    for r in rows:
        cells.setdefault((r["entry"], r["row"], r["call"]), {})[r["architecture"]] = (
            f"{r['kernel']}, verified ({r['evidence']})" if r["verified"]
            else f"{r['kernel']}, unverified")
    for (entry, _, call), by_arch in cells.items():
        lines.append(f"| {entry} | {call} | " +
                     " | ".join(by_arch.get(a, "—") for a in ARCHITECTURES) + " |")
    return "\n".join(lines)


BEGIN, END = "<!-- dispatch-status:begin -->", "<!-- dispatch-status:end -->"


def with_table(readme: str, table: str) -> str:
    """README's text with the block between the markers replaced by the table."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table + "\n" + readme[end:]


def libraries(given: list[str] | None) -> list[str]:
    found = given or sorted(glob.glob("build/libfattn_cuda*.a"))
    if not found:
        sys.exit("fattn.dispatch.status: no CUDA library to read the C++ kernels' machine code "
                 "from (build with nvcc first, or pass --libraries)")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libraries", nargs="+", help="the built CUDA libraries (libfattn_cuda*.a)")
    p.add_argument("--write", action="store_true", help="write defaults.json")
    p.add_argument("--check", action="store_true",
                   help="exit 1 where defaults.json or README's table differs")
    p.add_argument("--defaults", type=Path,
                   default=SOURCE_DEFAULTS if SOURCE_DEFAULTS.exists() else DEFAULTS,
                   help="the defaults file (default: this checkout's, run from its root)")
    p.add_argument("--readme", default="README.md",
                   help="the README whose marked block shows the table (default README.md)")
    args = p.parse_args(argv)
    rows = defaults(cpp_hashes(libraries(args.libraries)), records.committed())
    print(markdown(rows))
    document = {"about": "Generated by python -m fattn.dispatch.status --write: the default "
                         "kernel of each row of table.json per architecture, and whether its "
                         "current machine code has a verification record (verified.json).",
                "defaults": rows}
    readme = Path(args.readme)
    if args.write:
        args.defaults.write_text(json.dumps(document, indent=1) + "\n")
        if readme.exists():
            readme.write_text(with_table(readme.read_text(), markdown(rows)))
    if args.check:
        committed = json.loads(args.defaults.read_text())["defaults"]
        if committed != rows:
            stale = [r for r in rows if r not in committed]
            print("fattn.dispatch.status: defaults.json is not what this checkout's machine code "
                  "and verified.json give:", file=sys.stderr)
            for r in stale:
                print(f"  now: {r}", file=sys.stderr)
            print("a verified kernel's machine code changed (it is no longer verified) or a "
                  "record was added: run python -m fattn.dispatch.status --write and commit "
                  "defaults.json", file=sys.stderr)
            return 1
        if readme.exists() and with_table(readme.read_text(), markdown(rows)) != readme.read_text():
            print(f"fattn.dispatch.status: {readme}'s table is not defaults.json's: run python -m "
                  "fattn.dispatch.status --write", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
