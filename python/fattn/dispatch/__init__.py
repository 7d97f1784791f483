"""Which GPU kernel runs a call, and whether a GPU run verified it: fattn's dispatch.

The choice is data: table.json's rows give, per entry (forward, varlen, kvcache, backward,
varlen_backward), architecture, dtype, head dim, variants and attn_mask, the candidate
kernels in order of preference, each with the measurement behind the order. Each engine
answers whether it takes a call (engines.py: Triton; the C++ kernels through the
extension's `_C.cuda_refusal`, the rules the C++ library enforces). The default is the first
candidate that takes the call and whose *current* machine code for the device's architecture
has a verification record (records.py, machine_code.py); where none has, the first that takes
the call runs and fattn warns once per process (FATTN_REQUIRE_VERIFIED=1 makes it an error),
naming `python -m fattn.selftest`, which verifies this GPU's candidates and records them.

    plan("forward", dtype=torch.bfloat16, head_dim=128, capability=(9, 0))
    -> Plan(kernel='fused_tma', engine='cuda_cpp', verified=..., evidence=..., why=...)
"""
from __future__ import annotations

import dataclasses
import os
import warnings

from . import engines, records
from .machine_code import load_table
from .current import current_machine_code

ENTRIES = ("forward", "varlen", "kvcache", "backward", "varlen_backward")
DTYPES = ("float16", "bfloat16", "float32")
REQUIRE_VERIFIED = "FATTN_REQUIRE_VERIFIED"
SELFTEST = "python -m fattn.selftest"
_TABLE = load_table()


@dataclasses.dataclass(frozen=True)
class Call:
    """What the dispatch needs to know of a call. dtype: a name of DTYPES; architecture:
    sm_<major><minor> of the device (None: no GPU, as for CPU tensors in tests); window:
    (left, right), -1 for none; dropout: dropout_p > 0; seqused_k: a varlen call's
    seqused_k given (the features a table row may need)."""
    entry: str
    dtype: str
    head_dim: int | None = None
    architecture: str | None = None
    window: tuple[int, int] = (-1, -1)
    softcap: bool = False
    alibi: bool = False
    sinks: bool = False
    attn_mask: bool = False
    allow_tf32: bool = False
    dropout: bool = False
    seqused_k: bool = False

    @property
    def variants(self) -> bool:
        """A left window, softcap, ALiBi or sinks: what the TMA kernel's variants instantiation
        runs (a right window alone every kernel takes in its plain one)."""
        return self.window[0] >= 0 or self.softcap or self.alibi or self.sinks


@dataclasses.dataclass(frozen=True)
class Candidate:
    kernel: str
    refusal: str          # "" where it takes the call
    machine_code: str | None
    record: records.Record | None


@dataclasses.dataclass(frozen=True)
class Plan:
    kernel: str           # a kernel of table.json (or a C++ kernel named by impl=)
    engine: str           # "triton" or "cuda_cpp"
    verified: bool
    evidence: str | None  # the record's evidence file (or the user's record file)
    why: str
    candidates: tuple[Candidate, ...] = ()


def architecture_of(capability) -> str | None:
    return None if capability is None else f"sm_{capability[0]}{capability[1]}"


def dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise NotImplementedError(f"fattn: the GPU kernels take {', '.join(DTYPES)}, got {name}")
    return name


def _matches(value, allowed) -> bool:
    return allowed == "*" or value in allowed


def row_for(call: Call) -> dict:
    """The first row of the call's entry that matches it."""
    if call.entry not in _TABLE["entries"]:
        raise ValueError(f"entry must be one of {', '.join(ENTRIES)}, got {call.entry!r}")
    for row in _TABLE["entries"][call.entry]:
        # a row with "needs": calls with one of those features alone (their own kernel)
        if "needs" in row and not any(getattr(call, feature) for feature in row["needs"]):
            continue
        if row["architectures"] != "*" and call.architecture not in row["architectures"]:
            continue
        if not _matches(call.dtype, row["dtypes"]) or not _matches(call.head_dim, row["head_dims"]):
            continue
        if row["variants"] == ("some" if not call.variants else "none"):
            continue
        if row["attn_mask"] != "any" and bool(row["attn_mask"]) != call.attn_mask:
            continue
        return row
    raise NotImplementedError(f"fattn: no GPU kernel takes {call}")


def kernels() -> dict:
    return _TABLE["kernels"]


def _candidate(kernel: str, call: Call, known: list[records.Record]) -> Candidate:
    refusal = engines.refusal(kernel, call)
    if refusal or call.architecture is None:
        return Candidate(kernel, refusal, None, None)
    code = current_machine_code(kernel, call.architecture)
    return Candidate(kernel, "", code, records.find(known, kernel, call.architecture, code))


def ran_on_a_gpu(kernel: str) -> bool:
    """Whether a GPU ever ran the kernel (an earlier version of its code: table.json's
    gpu_run), where none verified its current code."""
    return kernels()[kernel]["gpu_run"] is not None


def preferred(names: list[str], verified) -> str:
    """The default among the candidates that take a call, in the table's order: the first
    verified one, else the first a GPU has run at all, else the first (a kernel no GPU ever
    ran only where nothing else takes the call)."""
    for admits in (verified, ran_on_a_gpu):
        for kernel in names:
            if admits(kernel):
                return kernel
    return names[0]


def _chosen(call: Call, names: list[str], why: str) -> Plan:
    known = records.all_records()
    candidates = tuple(_candidate(k, call, known) for k in names)
    taking = [c for c in candidates if not c.refusal]
    if not taking:
        refused = "; ".join(f"{c.kernel}: {c.refusal}" for c in candidates)
        raise NotImplementedError(f"fattn: no GPU kernel takes this {call.entry} call ({refused})")
    by_name = {c.kernel: c for c in taking}
    best = by_name[preferred(list(by_name), lambda kernel: by_name[kernel].record is not None)]
    engine = kernels()[best.kernel]["engine"]
    evidence = best.record.evidence if best.record else None
    status = (f"verified on {call.architecture} by {best.record.suite} ({best.record.evidence})"
              if best.record else
              "no GPU run verified it on this architecture"
              + ("" if ran_on_a_gpu(best.kernel) else ", and no GPU has ever run it")
              if call.architecture else
              "no GPU architecture given")
    return Plan(best.kernel, engine, bool(best.record), evidence,
                f"{best.kernel}: {status}; the table's order: {why}", candidates)


_warned: set[tuple[str, str, str]] = set()


def _unverified(call: Call, chosen: Plan) -> None:
    """The warning (once per process and kernel) or, under FATTN_REQUIRE_VERIFIED=1, the error."""
    message = (f"fattn: {chosen.kernel} runs this {call.entry} call on {call.architecture}, but no "
               f"GPU run verified its current machine code there. Run `{SELFTEST}` on this GPU "
               f"to verify it (its record then makes it a verified default), or pass impl= to "
               f"choose a kernel")
    if os.environ.get(REQUIRE_VERIFIED, "") not in ("", "0"):
        raise RuntimeError(message + f" ({REQUIRE_VERIFIED} is set)")
    key = (call.entry, chosen.kernel, call.architecture or "")
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def plan(call: Call, impl: str = "auto", warn: bool = True) -> Plan:
    """The kernel a call runs under impl ("auto": the table; "triton": the Triton candidate;
    a kernel of the table by name: that one), whether it is verified, and why."""
    row = row_for(call)
    names = list(row["candidates"])
    if impl == "triton":
        names = [k for k in names if kernels()[k]["engine"] == "triton"]
    elif impl in kernels():
        names = [impl]
    elif impl not in ("auto", "decode"):
        raise NotImplementedError(
            f"fattn: impl={impl!r} is not a GPU kernel of this {call.entry} call (auto, triton, "
            f"{', '.join(row['candidates'])})")
    chosen = _chosen(call, names, row["why"])
    if warn and impl in ("auto", "decode") and call.architecture and not chosen.verified:
        _unverified(call, chosen)
    return chosen


def verified_cpp_kernels(arch: str) -> list[str]:
    """The C++ kernels whose current machine code for the architecture (in the loaded
    extension) a record, the user's own included, verifies: "kernel@architecture", as the C++
    library's Impl::automatic takes them (fattn::set_cuda_verified_kernels)."""
    known = records.all_records()
    return [f"{name}@{arch}" for name, spec in kernels().items()
            if spec["engine"] == "cuda_cpp" and arch in spec["machine_code"]
            and records.find(known, name, arch, current_machine_code(name, arch))]


def default(call: Call) -> Plan:
    """plan() without the warning: what the dispatcher would run."""
    return plan(call, warn=False)
