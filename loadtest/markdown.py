"""The Markdown the benchmarks write: tables, the figures in their cells, the file.

One writer for compare (``report``), overhead (``overhead``) and calibration
(``calibration.report``): each says what its columns are and what goes in a
row; how a table, a missing figure (``-``), milliseconds or a percentage look
is decided here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

MISSING = "-"
"""A figure that was not measured."""


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table: the header, the separator and one line per row, each ending in a newline."""
    lines = [_line(header), "|" + "---|" * len(header), *(_line(row) for row in rows)]
    return "\n".join(lines) + "\n"


def _line(cells: Sequence[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def num(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def ms(seconds: float | None, digits: int = 1) -> str:
    """Seconds shown as milliseconds."""
    return MISSING if seconds is None else f"{seconds * 1000:.{digits}f}"


def pct(ratio: float | None, digits: int = 1, sign: bool = False) -> str:
    """A ratio shown as a percentage (``sign``: ``+`` before a positive one)."""
    if ratio is None:
        return MISSING
    return f"{ratio:+.{digits}%}" if sign else f"{ratio:.{digits}%}"


def write(path: Path, body: str, title: str | None = None) -> None:
    """Write a Markdown file (its folder made if needed), under ``# title`` when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((f"# {title}\n\n" if title else "") + body)
