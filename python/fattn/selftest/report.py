"""What the selftest says and keeps: whether records verify a kernel's machine code, the
records it writes for kernels that passed, the progress lines, the table and the JSON
report."""
from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

from fattn import cuda_dispatch
from fattn.dispatch import records
from fattn.dispatch.current import current_machine_code


def verification(kernel: str, arch: str | None) -> dict:
    """Whether a record verifies the machine code this process would run for the kernel."""
    if arch is None:
        return {"verified": None, "machine_code": None, "why": "no GPU architecture"}
    try:
        code = current_machine_code(kernel, arch)
    except Exception as e:  # a compile or cuobjdump failure: the report says which
        return {"verified": False, "machine_code": None, "why": f"machine code: {e}"}
    if code is None:
        return {"verified": False, "machine_code": None,
                "why": "no machine code hash (not built for it, or no cuobjdump)"}
    record = records.find(records.all_records(), kernel, arch, code)
    return {"verified": record is not None, "machine_code": code,
            "why": f"{record.suite} ({record.evidence})" if record else "no record"}


def failed(row: dict) -> int:
    return sum(c["status"] != "passed" for c in row["cases"])


def max_ratio(row: dict) -> float | None:
    return max((c["ratio"] for c in row["cases"]), default=None)


# --- records -------------------------------------------------------------------------------
def record_name(env: dict) -> str:
    """One file of records per device, driver and fattn version, as a file name."""
    raw = f"{env['device']}-driver-{env['driver'] or 'unknown'}-fattn-{env['fattn']}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")


def write_records(rows: list[dict], env: dict, evidence: Path) -> tuple[Path, list[str]]:
    """A record for each kernel that passed every case, for the machine code that ran; the
    file's earlier records of kernels that did not run now are kept, those of kernels that
    ran are replaced (a failure removes its kernel's record)."""
    arch, ran = env["architecture"], {r["kernel"] for r in rows if r["cases"]}
    date = env["date"][:10]
    fresh = []
    for row in rows:
        code = row["verified_before"].get("machine_code")
        if row["cases"] and not failed(row) and code:
            suite = (f"fattn.selftest: {len(row['cases'])} cases ({', '.join(row['entries'])}; "
                     "float64 reference, error <= 2x torch's in the dtype + floor)")
            fresh.append(records.Record(row["kernel"], arch, code, suite, str(evidence),
                                        device=env["device"], date=date,
                                        revision=env["fattn"]))
    name = record_name(env)
    path = records.local_dir() / f"{name}.json"
    kept = []
    if path.exists():
        try:
            kept = [r for r in records.read(path) if r.kernel not in ran]
        except (OSError, ValueError, KeyError, TypeError):
            kept = []
    about = (f"fattn.selftest on {env['device']} ({arch}), driver {env['driver']}, CUDA "
             f"{env['cuda']}, torch {env['torch']}, triton {env['triton']}, fattn {env['fattn']}")
    written = records.write_local(name, kept + fresh, about)
    cuda_dispatch.forget_plans()
    return written, [r.kernel for r in fresh]


def default_report_path(env: dict) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    return records.cache_dir() / "selftest" / f"{record_name(env)}-{stamp}.json"


# --- output --------------------------------------------------------------------------------
def _yes_no(state: dict) -> str:
    return {True: "yes", False: "no", None: "-"}[state.get("verified")]


def _tflops(row: dict) -> str:
    t = row.get("timing")
    if not t:
        return "-"
    if "error" in t:
        return "error"
    return f"{t['tflops']:.0f} ({t['sdpa_tflops']:.0f})"


def progress_line(n: int, total: int, row: dict) -> str:
    head = f"[{n}/{total}] {row['kernel']} ({', '.join(row['entries'])}, {row['architecture']})"
    if row["skipped"]:
        return f"{head}: skipped: {row['skipped']}"
    passed = len(row["cases"]) - failed(row)
    line = (f"{head}: {passed}/{len(row['cases'])} passed, max error ratio "
            f"{max_ratio(row):.3g}, {row['seconds']} s")
    for case in row["cases"]:
        if case["status"] != "passed":
            line += f"\n    {case['status'].upper()} {case['case']}: " + (
                case.get("error") or ", ".join(
                    f"{k} {m.get('error', 0):.3g} > {m.get('bound', 0):.3g}"
                    for k, m in case["measurements"].items() if m["ratio"] > 1.0))
    return line


def candidate_lines(rows: list[dict]) -> list[str]:
    """The candidates before anything runs: whether each takes calls here, verified now."""
    lines = []
    for row in rows:
        state = row["verified_before"]
        lines.append(f"  {row['kernel']:<20} {row['engine']:<9} {', '.join(row['entries']):<26}"
                     f" takes calls: {row['takes']}; verified: {_yes_no(state)} "
                     f"({state['why']})")
    return lines


def table(rows: list[dict]) -> str:
    header = ["kernel", "entry", "arch", "passed", "failed", "max ratio", "TFLOP/s (SDPA)",
              "verified before", "verified now"]
    body = []
    for row in rows:
        ran = bool(row["cases"])
        ratio = max_ratio(row)
        body.append([row["kernel"], ", ".join(row["entries"]), row["architecture"],
                     str(len(row["cases"]) - failed(row)) if ran else "skipped",
                     str(failed(row)) if ran else "-",
                     f"{ratio:.3g}" if ratio is not None else "-", _tflops(row),
                     _yes_no(row["verified_before"]), _yes_no(row["verified_now"])])
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
                     for r in [header, ["-" * w for w in widths]] + body)


def _jsonable(value):
    """inf and NaN as strings: the report stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(report), indent=1))
