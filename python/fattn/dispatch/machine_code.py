"""The machine code of fattn's GPU kernels, as one hash per (kernel, architecture).

A verification record (verified.json, or a user's own from `python -m fattn.selftest`)
names the hash of the machine code a GPU run verified; the dispatcher trusts a kernel only
while the code it would run now hashes the same. So a change to a kernel's instructions
demotes it until a GPU run verifies it again, and a refactor that keeps the instructions
keeps the verification. Both kinds are computed without a GPU:

- a CUDA C++ kernel: the SASS of the functions its table entry names ("symbols", a regex
  over mangled names) in the cubin its architecture loads ("cubin": sm_90a for the TMA
  kernels), read with cuobjdump from the built library or extension; instruction text
  only (no addresses, no file's anonymous-namespace hash);
- a Triton kernel: Triton's own compile of the named production combinations
  (fattn.triton.compile_check) for the architecture, each cubin's SASS read the same way.

This file imports neither torch nor fattn (the C++ build and scripts run it with a plain
python3):

    python3 machine_code.py cpp LIBRARY...            hashes of every C++ kernel in the table
    python3 machine_code.py verified-cpp --records verified.json --out FILE LIBRARY...
                                                     the C++ kernels a record verifies, as the
                                                     C++ library's generated list
    python3 -m fattn.dispatch.machine_code triton KERNEL ARCH    one Triton kernel's hash
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TABLE = Path(__file__).with_name("table.json")
ANON = re.compile(r"(\d+)_GLOBAL__N__")  # the length-prefixed anonymous namespace
CUBIN_ARCH = re.compile(r"^\s*code for (sm_\w+)")
FUNCTION = re.compile(r"^\s*Function : (\S+)")
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def load_table(path: Path = TABLE) -> dict:
    with open(path) as f:
        return json.load(f)


def cuobjdump() -> str | None:
    """The CUDA toolkit's cuobjdump, else Triton's bundled one (CUOBJDUMP overrides)."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found and Path("/usr/local/cuda/bin/cuobjdump").exists():
        found = "/usr/local/cuda/bin/cuobjdump"
    if not found:
        for site in sys.path:
            candidate = Path(site) / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump"
            if candidate.exists():
                return str(candidate)
    return found


def normalise(name: str) -> str:
    """A mangled name without its file's anonymous-namespace hash."""
    while m := ANON.search(name):
        length = int(m.group(1))
        start = m.start(1) + len(m.group(1))
        name = name[:m.start()] + "ANON" + name[start + length:]
    return name


def parse_sass(text: str) -> dict[tuple[str, str], str]:
    """cuobjdump -sass output -> {(cubin arch, function name): instructions}."""
    out: dict[tuple[str, str], str] = {}
    arch, key, body = "?", None, []

    def close():
        if key:
            out[key] = "\n".join(body)

    for line in text.splitlines():
        if m := CUBIN_ARCH.match(line):
            arch = m.group(1)
        elif m := FUNCTION.match(line):
            close()
            key, body = (arch, normalise(m.group(1))), []
        elif key and line.lstrip().startswith("/*"):  # an instruction or its encoding
            body.append(ADDRESS.sub("", line).strip())
        elif key and not line.startswith((" ", "\t")):  # the next member of an archive
            close()
            key, body = None, []
    close()
    return out


def sass_functions(paths, tool: str | None = None,
                   cubins: tuple[str, ...] = ()) -> dict[tuple[str, str], str]:
    """Every kernel's SASS in these libraries, objects or cubins (only the cubins of these
    architectures where given: cuobjdump reads a few times faster)."""
    tool = tool or cuobjdump()
    if not tool:
        raise RuntimeError("no cuobjdump (install the CUDA toolkit, or triton, or set CUOBJDUMP)")
    out: dict[tuple[str, str], str] = {}
    jobs = [(path, arch) for path in paths for arch in (cubins or (None,))]
    for path, arch in jobs:
        command = [tool, "-sass", *(["-arch", arch] if arch else []), str(path)]
        listing = subprocess.run(command, capture_output=True, text=True)
        if listing.returncode != 0 and "does not contain device code" not in listing.stderr:
            raise RuntimeError(f"{tool} -sass {path} failed: {listing.stderr.strip()}")
        out.update(parse_sass(listing.stdout))
    return out


def digest(functions: dict[str, str]) -> str | None:
    """One hash over the functions, in name order; None for no function."""
    if not functions:
        return None
    h = hashlib.sha256()
    for name in sorted(functions):
        h.update(name.encode() + b"\n" + functions[name].encode() + b"\n\n")
    return "sha256:" + h.hexdigest()


def cpp_hash(spec: dict, arch: str, functions: dict[tuple[str, str], str]) -> str | None:
    """The hash of a C++ kernel (its table entry `spec`) for a device architecture; None where
    the kernel has no machine code for it (not built, or an architecture it does not run on)."""
    code = spec["machine_code"].get(arch)
    if not code:
        return None
    symbols = re.compile(code["symbols"])
    return digest({name: sass for (cubin, name), sass in functions.items()
                   if cubin == code["cubin"] and symbols.search(name)})


def cpp_hashes(paths, table: dict | None = None,
               architectures: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """{kernel: {architecture: hash}} for every C++ kernel of the table in these files (only
    these architectures where given)."""
    table = table or load_table()

    def wanted(arch: str) -> bool:
        return not architectures or arch in architectures

    cubins = tuple(sorted({code["cubin"] for spec in table["kernels"].values()
                           if spec["engine"] == "cuda_cpp"
                           for arch, code in spec["machine_code"].items() if wanted(arch)}))
    if architectures and not cubins:
        return {}  # no C++ kernel has machine code for these architectures
    functions = sass_functions(paths, cubins=cubins if architectures else ())
    out: dict[str, dict[str, str]] = {}
    for name, spec in table["kernels"].items():
        if spec["engine"] != "cuda_cpp":
            continue
        for arch in filter(wanted, spec["machine_code"]):
            if (h := cpp_hash(spec, arch, functions)) is not None:
                out.setdefault(name, {})[arch] = h
    return out


def verified_cpp(paths, records_path: Path, table: dict | None = None) -> list[tuple[str, str]]:
    """(kernel, architecture) of every C++ kernel whose machine code in these files a record
    of records_path names."""
    with open(records_path) as f:
        known = {(r["kernel"], r["architecture"], r["machine_code"])
                 for r in json.load(f)["records"]}
    architectures = tuple(sorted({arch for _, arch, _ in known}))
    if not architectures:
        return []
    return sorted((kernel, arch) for kernel, by_arch in cpp_hashes(paths, table,
                                                                   architectures).items()
                  for arch, h in by_arch.items() if (kernel, arch, h) in known)


def write_verified_list(out: Path, paths, records_path: Path) -> None:
    """The C++ library's generated list (src/cuda/verified.cpp includes it): one
    {"kernel", "architecture"} initialiser a line. Without a cuobjdump the list is empty:
    the library then knows of no verified kernel, and says so."""
    lines = [f"// Generated from {records_path.name} and this build's SASS by machine_code.py: "
             "the C++ kernels a GPU run verified, per architecture."]
    if cuobjdump():
        lines += [f'{{"{kernel}", "{arch}"}},' for kernel, arch in verified_cpp(paths, records_path)]
    else:
        lines.append("// no cuobjdump was found: no kernel's machine code could be read")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    if not out.exists() or out.read_text() != text:  # unchanged: nothing recompiles
        out.write_text(text)


def triton_arch_number(arch: str) -> int:
    """sm_90 -> 90 (Triton's GPUTarget)."""
    if not re.fullmatch(r"sm_\d+", arch):
        raise ValueError(f"architecture must be sm_<major><minor>, got {arch!r}")
    return int(arch[3:])


def triton_hash(kernel: str, arch: str, table: dict | None = None) -> str | None:
    """The hash of a Triton kernel of the table for an architecture: Triton's compile of each
    of its named combinations, the cubins' SASS. Needs triton (not under its interpreter)."""
    from fattn.triton import compile_check  # imported here: triton is optional

    table = table or load_table()
    spec = table["kernels"][kernel]
    number = triton_arch_number(arch)
    functions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fattn-mc-") as tmp:
        for combination in spec["machine_code"]["compile"]:
            for compiled in compile_check.compile_named(combination, number):
                cubin = Path(tmp) / "kernel.cubin"
                cubin.write_bytes(compiled.asm["cubin"])
                for (_, name), sass in sass_functions([cubin]).items():
                    functions[f"{combination} {name}"] = sass
    return digest(functions)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    cpp = sub.add_parser("cpp", help="every C++ kernel's hash per architecture, as JSON")
    cpp.add_argument("files", nargs="+", help="built libraries, extensions or objects")
    ver = sub.add_parser("verified-cpp", help="the C++ kernels a record verifies, for C++")
    ver.add_argument("--records", type=Path, required=True)
    ver.add_argument("--out", type=Path, required=True)
    ver.add_argument("files", nargs="+", help="built libraries")
    tri = sub.add_parser("triton", help="one Triton kernel's hash for an architecture")
    tri.add_argument("kernel")
    tri.add_argument("arch", help="e.g. sm_90")
    args = p.parse_args(argv)
    if args.what == "cpp":
        print(json.dumps(cpp_hashes(args.files), indent=1, sort_keys=True))
    elif args.what == "verified-cpp":
        write_verified_list(args.out, args.files, args.records)
    else:
        print(triton_hash(args.kernel, args.arch) or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
