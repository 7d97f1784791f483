"""The GPU defaults: which kernel each row of fattn's dispatch table runs per architecture,
and whether a GPU run verified its current machine code (fattn/dispatch/defaults.json,
written by `python -m fattn.dispatch.status --write`; records in verified.json)."""
from __future__ import annotations

import json

from fattn.dispatch import records, status


def section() -> str:
    # this checkout's file (the report runs from its root), not the installed package's copy
    defaults = status.SOURCE_DEFAULTS if status.SOURCE_DEFAULTS.exists() else status.DEFAULTS
    rows = json.loads(defaults.read_text())["defaults"]
    verified = [r for r in rows if r["verified"]]
    known = records.committed()
    runs = sorted({(r.date, r.device, r.revision) for r in known})
    ran = "; ".join(f"{device} on {date} at {rev}" for date, device, rev in runs) or "none"
    return "\n".join([
        "## GPU defaults and their verification",
        "",
        f"Of the {len(rows)} (call, architecture) defaults of the dispatch table, "
        f"{len(verified)} run machine code a GPU run verified (records from: {ran}). "
        "Where none is, fattn runs the table's first candidate and warns once; "
        "`python -m fattn.selftest` verifies a GPU's candidates and records them "
        "(`FATTN_REQUIRE_VERIFIED=1` makes an unverified default an error).",
        "",
        status.markdown(rows),
        "",
    ])
