"""Plain formatting of numbers and times for the views."""

from __future__ import annotations

import time

from snakemake_executor_context.terminal import format_bytes

__all__ = ["ago", "bytes_", "cache_cell", "clock", "duration", "rate", "window_phrase"]


def bytes_(value: float | None) -> str:
    """'141 GB', '512 MB' (:func:`~snakemake_executor_context.terminal.format_bytes`);
    '-' when unknown."""
    return format_bytes(value) if value else "-"


def duration(seconds: float | None) -> str:
    """'0.4 s', '12 s', '3 min 5 s', '2 h 4 min', '-'."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def rate(value: float | None, digits: int = 1) -> str:
    """A rate, or '-' when unknown."""
    return "-" if value is None else f"{value:.{digits}f}"


def clock(at: float | None) -> str:
    """'14:03:22' (local time), '-'."""
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "-"


def ago(seconds: float) -> str:
    """'now', '5 s ago', '3 min ago'."""
    if seconds < 1:
        return "now"
    return f"{duration(seconds)} ago".replace(".0 s", " s")


def window_phrase(window: str) -> str:
    """A throughput window in a sentence: "the last 15 min", "the whole history"."""
    if window == "all":
        return "the whole history"
    return "the last run (no run is live)" if window == LAST_RUN else f"the last {window}"


#: The window's label when no run is live: it covers the last run.
LAST_RUN = "last run"


def cache_cell(from_cache: bool | None) -> str:
    """Whether a load came from the local cache: "hit", "miss", or "-" (no probe)."""
    return "-" if from_cache is None else ("hit" if from_cache else "miss")


#: How the monitor names each load kind in its narrow "from" column.
KIND_CELLS = {"source": "source", "cache": "cache", "peer": "peer", "conversion": "convert"}


def kind_cell(kind: str) -> str:
    """How a placement got its context (its load's kind), "-" before its load ended."""
    return KIND_CELLS.get(kind, kind) or "-"
