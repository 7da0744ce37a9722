"""Plain-text tables for the CLI and the benchmarks (Markdown pipe format, so output pastes into docs)."""
from __future__ import annotations

from typing import Any, Sequence


def human(n: float) -> str:
    """1234567 -> '1.23M'; keeps tables readable while the exact figure stays available elsewhere."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.2f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
