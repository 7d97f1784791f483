"""Build fattn just in time with ``torch.utils.cpp_extension.load`` (the "inline" path).

    import fattn
    ext = fattn.jit.load()                       # compiles once, then cached on disk
    out = ext.scaled_dot_product_attention(q, k, v, is_causal=True)
    out, lse = torch.ops.fattn_jit.attention(q, k, v)

The JIT build compiles the same C++ sources as the CMake build (src/, include/,
python/csrc/: from the installed package's ``fattn/_src``, or the source tree, or
``$FATTN_SOURCE_DIR``) into its own extension module, and registers its operators under
its own namespace, ``fattn_jit`` by default, never ``fattn``: a process that imported
fattn already owns ``torch.ops.fattn``, and torch refuses a second registration of a
namespace. Loading the same namespace again in one process returns the module already
loaded; a namespace that something else registered is an error.

The CPU kernels are built once per instruction set, as CMake does with per-file -m flags,
from the same list (src/cpu/isa_flags.json): here a small generated file per ISA sets
``#pragma GCC target(...)``, the macros of src/cpu/common/isa_target.hpp that g++ does not
define for a target pragma (FATTN_TARGET_AVX512 / FATTN_TARGET_AVX /
FATTN_TARGET_AVX512_BF16), and
FATTN_VECTOR_BYTES / FATTN_KERNELS / FATTN_ISA, then includes src/cpu/kernels_isa.cpp
(torch's load() takes one set of flags for all sources). The AMX unit,
src/cpu/amx/kernels_amx.cpp, needs its -m flags on the command line (GCC's target pragma
does not define the __AMX_TILE__ / __AVX512BW__ macros it checks): it is compiled here
into an object that load() links, where the compiler knows AMX.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import types
from pathlib import Path

import torch

__all__ = ["load", "source_dir"]

_lock = threading.Lock()
_loaded: dict[str, types.SimpleNamespace] = {}

def _isa_table(src: Path) -> dict:
    """src/cpu/isa_flags.json: the kernel units' ISAs and target names (CMake reads it too)."""
    return json.loads((src / "src/cpu/isa_flags.json").read_text())


def _target_macros(targets) -> tuple:
    """The macros of src/cpu/common/isa_target.hpp that say what a target pragma enables: g++
    defines no __AVX512F__ / __AVX__ for `#pragma GCC target`."""
    macros = []
    if "avx512bf16" in targets:
        macros.append("FATTN_TARGET_AVX512_BF16")
    if "avx512f" in targets:
        macros.append("FATTN_TARGET_AVX512")
    if "avx" in targets or "avx2" in targets or "avx512f" in targets:
        macros.append("FATTN_TARGET_AVX")
    return tuple(macros)


_LIBRARY_SOURCE_GLOBS = ("src/model/*.cpp", "src/api/*.cpp", "src/cpu/*.cpp",
                         "src/cpu/*/*.cpp")
_PER_ISA_SOURCE = "kernels_isa.cpp"
_AMX_SOURCE = "kernels_amx.cpp"
# The operator's sources (python/CMakeLists.txt builds the same two).
_OPERATOR_SOURCES = ("ops.cpp", "kv_ops.cpp", "kvcache_planner.cpp")


def _library_sources(src: Path) -> list:
    return sorted(str(f) for pattern in _LIBRARY_SOURCE_GLOBS for f in src.glob(pattern)
                  if f.name not in (_PER_ISA_SOURCE, _AMX_SOURCE))


def _amx_object(src: Path, build_dir: Path, cflags: list, verbose: bool):
    """Compiles the AMX kernel unit into build_dir/kernels_amx.o (again only when a source
    is newer) and returns its path, or None where the CPU is not x86-64 or the compiler
    lacks AMX (the build then has no amx kernels, as CMake's would)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    unit = src / "src/cpu/amx" / _AMX_SOURCE
    obj = build_dir / "kernels_amx.o"
    inputs = [unit, *src.glob("src/**/*.hpp"), *src.glob("include/fattn/*.hpp")]
    if obj.is_file() and obj.stat().st_mtime >= max(f.stat().st_mtime for f in inputs):
        return str(obj)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [os.environ.get("CXX", "c++"), *cflags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-fPIC",
           *_amx_flags(src), "-I", str(src / "include"), "-I", str(src / "src"), "-c", str(unit),
           "-o", str(obj)]
    if verbose:
        print("fattn.jit:", " ".join(cmd))
    try:
        subprocess.run(cmd, check=True, capture_output=not verbose)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"fattn.jit: building without the amx kernels ({_AMX_SOURCE} did not compile: {e})")
        return None
    return str(obj)


def source_dir() -> Path:
    """Where the C++ sources are: $FATTN_SOURCE_DIR, else the installed package's copy
    (fattn/_src), else the source tree this file sits in."""
    here = Path(__file__).resolve().parent
    candidates = []
    if os.environ.get("FATTN_SOURCE_DIR"):
        candidates.append(Path(os.environ["FATTN_SOURCE_DIR"]))
    candidates += [here / "_src", here.parent.parent]
    for c in candidates:
        if (c / "src/api/attention.cpp").is_file() and (c / "python/csrc/ops.cpp").is_file():
            return c
    raise FileNotFoundError(
        "fattn.jit: cannot find fattn's C++ sources (looked in "
        + ", ".join(str(c) for c in candidates) + "); set FATTN_SOURCE_DIR to a fattn checkout")


def _write_if_changed(path: Path, text: str) -> None:
    # Unchanged files keep their mtime, so ninja has nothing to rebuild.
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _sync_sources(src: Path, dest: Path) -> Path:
    """Makes dest a copy of the sources the build reads, rewriting only the files whose
    content changed (reinstalling the package, new mtimes and the same bytes, then rebuilds
    nothing) and removing the ones the sources no longer have (a file moved to another
    folder would otherwise be compiled twice)."""
    kept = set()
    for pattern in ("include/fattn/*.hpp", "src/model/*.[ch]pp", "src/api/*.[ch]pp",
                    "src/cpu/*.[ch]pp", "src/cpu/*.json", "src/cpu/*/*.[ch]pp",
                    "python/csrc/*.cpp", "python/csrc/*.hpp"):
        for f in src.glob(pattern):
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_if_changed(target, f.read_text())
            kept.add(target)
    for f in sorted(dest.rglob("*"), reverse=True):  # a folder after its files
        if f.is_file() and f not in kept:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()
    return dest


def _amx_flags(src: Path) -> list[str]:
    table = _isa_table(src)
    return [f"-m{t}" for t in table["isas"]["avx512"]["targets"]
            + table["amx_targets_beyond_avx512"]]


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _isa_wrappers(src: Path, build_dir: Path) -> list[str]:
    isas = _isa_table(src)["isas"]
    names = list(isas) if _x86() else ["portable"]
    out = []
    for name in names:
        base = isas[name].get("base")  # a unit that runs as its base's Isa, with more targets
        vector_bytes = isas[name]["vector_bytes"]
        targets = (isas[base]["targets"] if base else []) + isas[name]["targets"]
        target, macros = ",".join(targets), _target_macros(targets)
        text = (f"// Generated by fattn.jit: the {name} CPU kernels (see fattn/jit.py).\n"
                + (f'#pragma GCC target("{target}")\n' if target else "")
                + "".join(f"#define {m} 1\n" for m in macros)
                + f"#define FATTN_VECTOR_BYTES {vector_bytes}\n"
                + f"#define FATTN_KERNELS {name}_kernels\n"
                + f"#define FATTN_ISA {base or name}\n"
                + '#include "cpu/kernels_isa.cpp"\n')
        path = build_dir / f"kernels_{name}.cpp"
        _write_if_changed(path, text)
        out.append(str(path))
    return out


def _namespace_taken(namespace: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), "attention")
        return True
    except (AttributeError, RuntimeError):
        return False


def _default_build_dir(namespace: str) -> Path:
    root = Path(os.environ.get("FATTN_JIT_DIR",
                               Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                               / "fattn" / "jit"))
    version = torch.__version__.replace("+", "_")
    return root / f"{namespace}-torch{version}-py{platform.python_version()}"


def load(namespace: str = "fattn_jit", build_directory: str | os.PathLike | None = None,
         verbose: bool = False) -> types.SimpleNamespace:
    """Compiles (or reuses) the JIT build and returns a namespace with:
    ``ext`` (the extension module), ``ops`` (``torch.ops.<namespace>``), ``attention``
    (the operator), ``scaled_dot_product_attention``, ``flash_attention``,
    ``attention_forward``, ``flash_attn_with_kvcache``, ``flash_attn_varlen_func`` (the fattn
    API bound to this build's operators), ``namespace`` and ``build_directory``. The first
    call compiles for a minute or two; later calls in other processes reuse the objects on
    disk; later calls in this process return the same object."""
    from torch.utils import cpp_extension

    from . import _registry, functional, kvcache

    if not namespace.isidentifier():
        raise ValueError(f"fattn.jit.load: namespace must be an identifier, got {namespace!r}")
    with _lock:
        if namespace in _loaded:
            return _loaded[namespace]
        if _namespace_taken(namespace):
            raise RuntimeError(
                f"fattn.jit.load: torch.ops.{namespace}.attention is already registered in "
                "this process (by the installed fattn package if the namespace is 'fattn', or "
                "by another library); the JIT build cannot register it twice. Pick another "
                "namespace, e.g. fattn.jit.load(namespace='fattn_jit2').")
        build_dir = Path(build_directory) if build_directory else _default_build_dir(namespace)
        build_dir.mkdir(parents=True, exist_ok=True)
        src = _sync_sources(source_dir(), build_dir / "sources")
        sources = (_library_sources(src) + _isa_wrappers(src, build_dir)
                   + [str(src / "python/csrc" / f) for f in _OPERATOR_SOURCES])
        from . import _C

        common = ["-O3", "-std=c++20", "-ffp-contract=fast", "-fopenmp", "-fvisibility=hidden"]
        amx = _amx_object(src, build_dir, common, verbose)
        torch_lib = Path(torch.__file__).parent / "lib"
        gomp = torch_lib / "libgomp.so.1"  # torch's OpenMP runtime: one runtime per process
        ext = cpp_extension.load(
            name=f"{namespace}_C",
            sources=sources,
            extra_cflags=[*common, f"-DFATTN_OP_NAMESPACE={namespace}",
                          *(["-DFATTN_HAVE_AVX512_BF16=1"] if _x86() else []),
                          f'-DFATTN_VERSION=\\"{_C.version()}\\"',
                          # The stamp changes the flags when the AMX object is rebuilt, so
                          # that load() relinks (ninja does not track extra_ldflags).
                          *(["-DFATTN_HAVE_AMX=1",
                             f"-DFATTN_AMX_STAMP={Path(amx).stat().st_mtime_ns}"] if amx else [])],
            extra_include_paths=[str(src / "include"), str(src / "src")],
            extra_ldflags=([amx] if amx else []) + ([str(gomp)] if gomp.is_file() else ["-fopenmp"]),
            build_directory=str(build_dir),
            verbose=verbose,
            with_cuda=False,
        )
        if ext.op_namespace != namespace:
            raise RuntimeError(f"fattn.jit.load: the module in {build_dir} registers "
                               f"torch.ops.{ext.op_namespace}, not {namespace}")
        _registry.register(namespace)
        ops = getattr(torch.ops, namespace)
        sdpa, flash, forward = functional.bind(ops.attention)
        with_kvcache, varlen = kvcache.bind(ops)
        result = types.SimpleNamespace(
            namespace=namespace, ext=ext, ops=ops, attention=ops.attention,
            scaled_dot_product_attention=sdpa, flash_attention=flash, attention_forward=forward,
            flash_attn_with_kvcache=with_kvcache, flash_attn_varlen_func=varlen,
            build_directory=str(build_dir))
        _loaded[namespace] = result
        return result
