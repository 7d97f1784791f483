"""Which kernels the selftest checks and how each is reached: the candidates of
fattn.dispatch's table for this device, and per case the C++ operator's impl name that runs
the kernel (or why none does): a C++ forward kernel through impl="auto" with that kernel alone
in the library's verified list."""
from __future__ import annotations

import contextlib
import dataclasses

from fattn import dispatch
from fattn.dispatch import engines
from fattn.dispatch.machine_code import load_table

from .cases import Case
from .environment import ON_GPU, triton_unusable

TRITON, CUDA_CPP = "triton", "cuda_cpp"


@dataclasses.dataclass
class Candidate:
    kernel: str
    engine: str
    entries: list[str]


def matching_rows(arch: str | None) -> dict[str, list[dict]]:
    """Per entry, the table's rows whose architectures match this device."""
    table = load_table()
    return {entry: [row for row in rows
                    if row["architectures"] == "*" or arch in row["architectures"]]
            for entry, rows in table["entries"].items()}


def candidates(arch: str | None) -> list[Candidate]:
    """Every kernel this device would dispatch, once, in the table's order."""
    found: dict[str, Candidate] = {}
    for entry, rows in matching_rows(arch).items():
        for row in rows:
            for kernel in row["candidates"]:
                engine = dispatch.kernels()[kernel]["engine"]
                c = found.setdefault(kernel, Candidate(kernel, engine, []))
                if entry not in c.entries:
                    c.entries.append(entry)
    return list(found.values())


@contextlib.contextmanager
def only_verified(kernel: str, arch: str | None):
    """The C++ library's Impl::automatic runs the first verified candidate of the table that
    takes a call: with this kernel alone in its verified list, impl="auto" runs this kernel
    (the list is the process's again after)."""
    from fattn import _C
    saved = _C.cuda_verified_kernels()
    _C.set_cuda_verified_kernels([f"{kernel}@{arch}"])
    try:
        yield
    finally:
        _C.set_cuda_verified_kernels(saved)


def route(kernel: str, case: Case, arch: str | None) -> tuple[str | None, str]:
    """(impl, why): how forcing the kernel runs this case (the C++ operator's impl name;
    None for a kernel with its own function or operator), or why it cannot: the case is no
    call of a row that lists the kernel, the kernel refuses it, or no impl name reaches it."""
    call = case.call(arch)
    try:
        row = dispatch.row_for(call)
    except NotImplementedError as e:
        return None, str(e)
    if kernel not in row["candidates"]:
        return None, "not a candidate of this call's row"
    refused = engines.refusal(kernel, call)
    if refused:
        return None, refused
    impl = dispatch.kernels()[kernel]["impl"]
    if dispatch.kernels()[kernel]["engine"] == TRITON or case.entry == "backward":
        return None, ""
    if impl == "decode":
        return "decode", ""
    return "auto", ""  # with the kernel alone verified (only_verified): Impl::automatic runs it


def skip_reason(candidate: Candidate) -> str:
    """Why none of the kernel's cases can run on this machine ("" where they can)."""
    if candidate.engine == CUDA_CPP and not ON_GPU:
        return "no GPU"
    if candidate.engine == TRITON:
        return triton_unusable()
    return ""


def plan_kernel(candidate: Candidate, cases: list[Case], arch: str | None):
    """The kernel's row before anything runs, and the cases it takes here: those of its
    entries that reach it (or, in the row, why it takes none)."""
    row = {"kernel": candidate.kernel, "engine": candidate.engine,
           "entries": candidate.entries, "architecture": arch or "-", "cases": [],
           "not_reached": [], "skipped": skip_reason(candidate)}
    if row["skipped"]:
        return row, []
    reached = []
    for case in (c for c in cases if c.entry in candidate.entries):
        impl, why = route(candidate.kernel, case, arch)
        (row["not_reached"].append({"case": case.name, "why": why}) if why
         else reached.append((case, impl)))
    if not reached:
        first = row["not_reached"][0]["why"] if row["not_reached"] else "no case of the grid"
        row["skipped"] = f"takes no call of the grid here ({first})"
    return row, reached
