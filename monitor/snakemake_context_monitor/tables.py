"""Keyed updates of a DataTable: change what changed, never rebuild on the UI thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.widgets import DataTable

from .model import Cells, Delta

__all__ = ["Column", "apply_delta", "clip", "setup_columns"]

#: (key, label, width or None for the content's width)
Column = tuple[str, str, int | None]


def setup_columns(table: DataTable[Any], columns: Sequence[Column]) -> None:
    """Add the columns once (keys make later updates cell by cell)."""
    if not table.columns:
        for key, label, width in columns:
            table.add_column(label, key=key, width=width)


def apply_delta(table: DataTable[Any], held: dict[str, Cells], delta: Delta) -> int:
    """Apply a change to a table whose rows are ``held`` (kept up to date here): remove
    rows, update the cells that differ, add new rows. Returns the number of changes."""
    changes = 0
    for key in delta.removed:
        if held.pop(key, None) is not None:
            table.remove_row(key)
            changes += 1
    columns = list(table.columns.values())
    for key, cells in delta.upserts.items():
        before = held.get(key)
        if before is None:
            table.add_row(*cells, key=key)
            changes += 1
        else:
            for column, old, new in zip(columns, before, cells, strict=False):
                if old != new:
                    # Only a column sized to its content is measured again: measuring
                    # a fixed one measures every cell of it whenever a value shrinks.
                    table.update_cell(key, column.key, new, update_width=column.auto_width)
                    changes += 1
        held[key] = cells
    return changes


def clip(text: str, width: int) -> str:
    """At most ``width`` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"
