"""Verification records: which machine code of which kernel a GPU run verified.

A record names a kernel of the dispatch table, the architecture it ran on (sm_90 for an
H100 or H200), the hash of the machine code that ran (machine_code.py), the suite that
passed, the device, the date and the evidence file under results/<machine>/gpu/<date>/.
The project's records are verified.json beside this file; a user's own, written by
`python -m fattn.selftest` on their GPU, live under their cache
($FATTN_CACHE_DIR, default ~/.cache/fattn, in verified/), one file per device, driver and
fattn version, and count the same.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

COMMITTED = Path(__file__).with_name("verified.json")


@dataclasses.dataclass(frozen=True)
class Record:
    kernel: str
    architecture: str
    machine_code: str
    suite: str
    evidence: str
    device: str = ""
    date: str = ""
    revision: str = ""

    @staticmethod
    def of(row: dict) -> "Record":
        fields = {f.name for f in dataclasses.fields(Record)}
        return Record(**{k: v for k, v in row.items() if k in fields})


def cache_dir() -> Path:
    return Path(os.environ.get("FATTN_CACHE_DIR") or Path.home() / ".cache" / "fattn")


def local_dir() -> Path:
    return cache_dir() / "verified"


def read(path: Path) -> list[Record]:
    with open(path) as f:
        return [Record.of(row) for row in json.load(f)["records"]]


def committed() -> list[Record]:
    return read(COMMITTED)


def local() -> list[Record]:
    """The user's own records (an unreadable file is skipped: it verifies nothing)."""
    out: list[Record] = []
    if local_dir().is_dir():
        for path in sorted(local_dir().glob("*.json")):
            try:
                out += read(path)
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return out


_loaded: list[Record] | None = None


def all_records() -> list[Record]:
    """The project's and the user's records, read once per process (reload() after writing)."""
    global _loaded
    if _loaded is None:
        _loaded = committed() + local()
    return _loaded


def reload() -> None:
    global _loaded
    _loaded = None


def find(records: list[Record], kernel: str, architecture: str,
         machine_code: str | None) -> Record | None:
    """The first record of this kernel, architecture and machine code (None: unverified)."""
    if machine_code is None:
        return None
    for r in records:
        if (r.kernel, r.architecture, r.machine_code) == (kernel, architecture, machine_code):
            return r
    return None


def write_local(name: str, records: list[Record], about: str) -> Path:
    """Writes the user's records of one device, driver and fattn version."""
    local_dir().mkdir(parents=True, exist_ok=True)
    path = local_dir() / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"about": about,
                               "records": [dataclasses.asdict(r) for r in records]}, indent=1))
    tmp.replace(path)
    reload()
    return path
