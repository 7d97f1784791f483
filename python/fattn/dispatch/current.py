"""The machine code this process would run, per (kernel, architecture), as machine_code.py
hashes it; computed once per process and cached on disk (fattn's cache dir, machine-code/)
under what determines it: for the C++ kernels the extension file's own hash, for Triton's
the Triton version and fattn's Triton sources (an edit that compiles to the same code keeps
the same hash, and so its verification)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

from . import machine_code, records

_TRITON_SOURCES = Path(__file__).resolve().parent.parent / "triton"


def _file_digest(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:24]


def _cached(key: str, compute):
    path = records.cache_dir() / "machine-code" / f"{key}.json"
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError):
        pass
    value = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"value": value}))
        tmp.replace(path)
    except OSError:
        pass
    return value


@functools.cache
def cpp_hashes(arch: str) -> dict:
    """{kernel: {arch: hash}} of the C++ kernels in the loaded extension, for one architecture
    (cuobjdump reads only the cubins it loads; {} without the CUDA backend or a cuobjdump)."""
    from .. import _C
    if not _C.with_cuda or not machine_code.cuobjdump():
        return {}
    library = Path(_C.__file__)
    return _cached(f"cpp-{_file_digest([library])}-{arch}",
                   lambda: machine_code.cpp_hashes([library], architectures=(arch,)))


def _triton_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # not installed
        return None


def _triton_hash_here_or_apart(kernel: str, arch: str) -> str | None:
    """Triton's interpreter compiles nothing: under it, a process without it computes."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return machine_code.triton_hash(kernel, arch)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "fattn.dispatch.machine_code", "triton", kernel,
                          arch], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"fattn: computing {kernel}'s machine code for {arch} failed:\n"
                           f"{run.stderr[-2000:]}")
    return run.stdout.strip() or None


@functools.cache
def triton_hash(kernel: str, arch: str) -> str | None:
    version = _triton_version()
    if version is None:
        return None
    sources = sorted(_TRITON_SOURCES.glob("*.py"))
    spec = json.dumps(machine_code.load_table()["kernels"][kernel], sort_keys=True)
    key = f"triton-{version}-{arch}-{kernel}-{_file_digest(sources)}-" + \
        hashlib.sha256(spec.encode()).hexdigest()[:12]
    return _cached(key, lambda: _triton_hash_here_or_apart(kernel, arch))


_unreadable: set[tuple[str, str]] = set()


def current_machine_code(kernel: str, arch: str) -> str | None:
    """The hash of the code this process would run for the kernel on the architecture (None
    where it cannot be known: not built, no cuobjdump, no triton, or a compile for an
    architecture this Triton does not know: unverified, said once, never an error of the
    call)."""
    engine = machine_code.load_table()["kernels"][kernel]["engine"]
    try:
        if engine == "cuda_cpp":
            return cpp_hashes(arch).get(kernel, {}).get(arch)
        return triton_hash(kernel, arch)
    except Exception as e:  # noqa: BLE001 - whatever failed, the kernel is unverified
        if (kernel, arch) not in _unreadable:
            _unreadable.add((kernel, arch))
            warnings.warn(f"fattn: the machine code of {kernel} for {arch} could not be read, "
                          f"so it counts as unverified: {e}", RuntimeWarning, stacklevel=2)
        return None
