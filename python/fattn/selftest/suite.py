"""The selftest's run: plans every candidate kernel of this device against the grid, runs
and times the ones that take calls here, then records, prints and reports."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from .cases import Case, grid
from .checks import run_case
from .environment import ON_GPU, architecture, environment
from .report import (candidate_lines, default_report_path, failed, progress_line, table,
                     verification, write_records, write_report)
from .routes import Candidate, candidates, matching_rows, plan_kernel
from .timing import time_kernel

TIMED_ENTRIES = ("forward", "backward")


def run_kernel(row: dict, reached: list[tuple[Case, str | None]], timing: bool) -> None:
    """Runs the kernel's cases into its row, then (all passed, on a GPU) its timing."""
    start = time.perf_counter()
    row["cases"] = [run_case(row["kernel"], impl, case) for case, impl in reached]
    row["seconds"] = round(time.perf_counter() - start, 1)
    timed = [(c, impl) for c, impl in reached if c.entry in TIMED_ENTRIES and not c.mask]
    if timing and timed and not failed(row):
        try:
            row["timing"] = time_kernel(row["kernel"], timed[0][1], timed[0][0])
        except Exception as e:  # a timing that cannot run is reported, not a failed case
            row["timing"] = {"error": f"{type(e).__name__}: {e}"}


@dataclasses.dataclass
class Options:
    json: str | None = None
    record: bool = True
    kernels: list[str] | None = None
    quick: bool = False


def chosen_candidates(arch: str | None, names: list[str] | None) -> list[Candidate]:
    found = candidates(arch)
    if not names:
        return found
    known = {c.kernel for c in found}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--kernels: {', '.join(unknown)} not among this device's candidates "
                         f"({', '.join(c.kernel for c in found)})")
    return [c for c in found if c.kernel in names]


def run(options: Options, out=None) -> dict:
    """The selftest: prints as it goes to `out` (stdout), returns the report."""
    out = out or sys.stdout

    def say(text=""):
        print(text, file=out, flush=True)

    env, arch = environment(), architecture()
    say("fattn.selftest: " + ", ".join(f"{k} {env[k] or '-'}" for k in (
        "device", "architecture", "driver", "cuda", "torch", "triton", "fattn")))
    cases = grid(ON_GPU, options.quick)
    planned = [plan_kernel(c, cases, arch) for c in chosen_candidates(arch, options.kernels)]
    rows = [row for row, _ in planned]
    if arch:
        say(f"hashing the machine code of {len(rows)} kernels for {arch} (cached after the "
            "first run)")
    for row, reached in planned:
        row["verified_before"] = verification(row["kernel"], arch)
        row["takes"] = f"yes, {len(reached)} cases" if reached else f"skipped: {row['skipped']}"
    say(f"candidates on {arch or 'this machine (no GPU)'}:")
    for line in candidate_lines(rows):
        say(line)
    for n, (row, reached) in enumerate(planned, 1):
        if reached:
            run_kernel(row, reached, timing=ON_GPU)
        say(progress_line(n, len(rows), row))
    report = {"environment": env, "options": dataclasses.asdict(options),
              "dispatch_rows": matching_rows(arch), "rows": rows, "records": None}
    finish(report, options, say)
    return report


def finish(report: dict, options: Options, say) -> None:
    """Records (a GPU run only), the table, the exit status and the JSON report."""
    env, rows = report["environment"], report["rows"]
    json_path = Path(options.json) if options.json else None
    verified_on_gpu = ON_GPU and not env["interpreter"]
    if options.record and verified_on_gpu and any(r["cases"] for r in rows):
        json_path = json_path or default_report_path(env)
        path, kernels = write_records(rows, env, json_path.resolve())
        report["records"] = {"path": str(path), "kernels": kernels}
    elif not verified_on_gpu:
        report["records"] = {"path": None, "why": "no GPU ran the kernels: nothing recorded"}
    for row in rows:
        row["verified_now"] = verification(row["kernel"], env["architecture"])
    ran = [c for r in rows for c in r["cases"]]
    report["exit_status"] = 0 if all(c["status"] == "passed" for c in ran) else 1
    say()
    say(table(rows))
    say()
    recorded = (report["records"] or {}).get("path")
    say(f"{sum(c['status'] == 'passed' for c in ran)}/{len(ran)} cases passed"
        + (f"; records: {recorded}" if recorded else "") if ran else
        "no case ran: every kernel was skipped (see the reasons above)")
    if json_path:
        write_report(json_path, report)
        say(f"report: {json_path}")
