"""Number formatting and Markdown tables for the report."""
from __future__ import annotations

KIB = 1024


def num(value: float, digits: int = 3) -> str:
    """A number with `digits` significant figures, thousands not separated:
    1234.5 → '1235', 0.3 → '0.3', 31.03 → '31.0'."""
    if value is None:
        return "–"
    if value == 0:
        return "0"
    magnitude = abs(value)
    decimals = max(0, digits - 1 - int(f"{magnitude:e}".split("e")[1]))
    return f"{value:.{decimals}f}"


def plain(value: float) -> str:
    """A small exact value without padding: 1.0 → '1', 2.5 → '2.5'."""
    return f"{value:g}"


def integer(value: int) -> str:
    """An exact count with thin groups of three: 2097152 → '2 097 152'."""
    return f"{int(value):,}".replace(",", " ")


def size(n_bytes: float) -> str:
    """Bytes in binary units: 1048576 → '1.0 MiB'."""
    value, unit = float(n_bytes), 0
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    while value >= KIB and unit < len(units) - 1:
        value /= KIB
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def ratio(value: float) -> str:
    """A speed-up factor: 1.234 → '1.23×'."""
    return f"{value:.2f}×"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
