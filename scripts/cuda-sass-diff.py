#!/usr/bin/env python3
"""Compare the SASS of every CUDA kernel between two revisions of fattn.

A change to the CUDA sources that is meant to keep behaviour (a restructure, a rename)
is checked without a GPU by showing that the machine code of the kernels did not move:
each revision's CUDA libraries are built (sm_80, sm_90 and the sm_90a wgmma library),
every kernel's SASS is taken with cuobjdump, and the two are compared function by
function. Names that differ only by the anonymous-namespace hash of their file, or by a
rename given with --rename OLD=NEW, are matched up; instruction bytes must be identical.

  scripts/cuda-sass-diff.py BASE [REV]          REV defaults to the working tree
  scripts/cuda-sass-diff.py BASE --rename fused_tf32x3_kernel=fused_tf32_kernel

Exit status 0 when every kernel of BASE is identical in REV, 1 otherwise (the kernels
that differ are listed), 2 on a usage or build error. Needs nvcc and cuobjdump (the CUDA
toolkit's, or set CUOBJDUMP=path; Triton's bundled one works).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("fattn_cuda", "fattn_cuda_sm90a")
ANON = re.compile(r"(\d+)_GLOBAL__N__")  # the length-prefixed anonymous namespace
ARCH = re.compile(r"^\s*code for (sm_\w+)")
FUNCTION = re.compile(r"^\s*Function : (\S+)")
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        for candidate in Path(sys.prefix).glob("lib/python*/site-packages/triton/backends/nvidia/bin/cuobjdump"):
            found = str(candidate)
    if not found:
        sys.exit("cuda-sass-diff: no cuobjdump (install the CUDA toolkit's, or set CUOBJDUMP)")
    return found


def checkout(rev: str | None, into: Path) -> Path:
    """The sources of `rev` (None: the working tree, tracked and untracked files)."""
    if rev is None:
        return ROOT
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
                   check=True, stdout=subprocess.DEVNULL)
    return into


def build(src: Path, build_dir: Path, jobs: int) -> list[Path]:
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DFATTN_CUDA=ON", "-DFATTN_BUILD_TESTS=OFF", "-DFATTN_BUILD_BENCH=OFF"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *LIBRARIES],
                   check=True, stdout=subprocess.DEVNULL)
    return sorted(build_dir.glob("lib*.a"))


def normalise(name: str, renames: list[tuple[str, str]]) -> str:
    """The kernel's mangled name without its file's anonymous-namespace hash, renames applied."""
    while m := ANON.search(name):
        length = int(m.group(1))
        start = m.start(1) + len(m.group(1))
        name = name[:m.start()] + "ANON" + name[start + length:]
    for old, new in renames:
        name = re.sub(rf"\d+{old}", f"N{new}", name)
        name = re.sub(rf"\d+{new}", f"N{new}", name)
    return name


def kernels(libraries: list[Path], tool: str, renames: list[tuple[str, str]]) -> dict[str, str]:
    """(arch, kernel) -> SASS text with the addresses of the listing removed."""
    out: dict[str, str] = {}
    for lib in libraries:
        text = subprocess.run([tool, "-sass", str(lib)], check=True, capture_output=True,
                              text=True).stdout
        arch, key, body = "?", None, []
        for line in text.splitlines():
            if m := ARCH.match(line):
                arch = m.group(1)
            elif m := FUNCTION.match(line):
                if key:
                    out[key] = "\n".join(body)
                key, body = f"{arch} {normalise(m.group(1), renames)}", []
            elif key and line.lstrip().startswith("/*"):  # an instruction or its encoding
                body.append(ADDRESS.sub("", line).strip())
            elif key and not line.startswith((" ", "\t")):  # the next member of the archive
                out[key] = "\n".join(body)
                key, body = None, []
        if key:
            out[key] = "\n".join(body)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the revision to compare against")
    p.add_argument("rev", nargs="?", help="the revision to check (default: the working tree)")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="a kernel renamed between the revisions")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    if any(len(r) != 2 for r in renames):
        p.error("--rename takes OLD=NEW")
    tool = cuobjdump()
    with tempfile.TemporaryDirectory(prefix="fattn-sass-") as tmp:
        tmp = Path(tmp)
        try:
            sides = {}
            for label, rev in (("base", args.base), ("rev", args.rev)):
                src = checkout(rev, tmp / f"{label}-src")
                sides[label] = kernels(build(src, tmp / f"{label}-build", args.jobs), tool, renames)
        except subprocess.CalledProcessError as e:
            print(f"cuda-sass-diff: {' '.join(map(str, e.cmd))} failed", file=sys.stderr)
            return 2
        finally:
            for label in ("base", "rev"):
                if (tmp / f"{label}-src").exists():
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tmp / f"{label}-src")], check=False)
    base, rev = sides["base"], sides["rev"]
    same = [k for k in base if rev.get(k) == base[k]]
    differ = [k for k in base if k in rev and rev[k] != base[k]]
    missing = [k for k in base if k not in rev]
    added = [k for k in rev if k not in base]
    print(f"{len(same)} kernels identical, {len(differ)} differ, {len(missing)} only in base, "
          f"{len(added)} only in rev")
    for title, keys in (("differ", differ), ("only in base", missing), ("only in rev", added)):
        for k in keys:
            print(f"  {title}: {k}")
    return 0 if not differ and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
