"""Keyed updates of a DataTable: change what changed, never rebuild on the UI thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textual.widgets import DataTable

__all__ = ["Column", "setup_columns", "sync_rows"]

#: (key, label, width or None for the content's width)
Column = tuple[str, str, int | None]


def setup_columns(table: DataTable[Any], columns: Sequence[Column]) -> None:
    """Add the columns once (keys make later updates cell by cell)."""
    if not table.columns:
        for key, label, width in columns:
            table.add_column(label, key=key, width=width)


def sync_rows(table: DataTable[Any], rows: Mapping[str, Sequence[Any]]) -> int:
    """Make the table hold exactly ``rows`` (row key -> cells): remove vanished rows,
    update changed cells, add new rows. Returns the number of changes."""
    changes = 0
    present = {key.value for key in table.rows if key.value is not None}
    for key in present - set(rows):
        table.remove_row(key)
        changes += 1
    columns = list(table.columns)
    for key, cells in rows.items():
        if key in present:
            old = table.get_row(key)
            for column, before, after in zip(columns, old, cells, strict=False):
                if before != after:
                    table.update_cell(key, column, after, update_width=True)
                    changes += 1
        else:
            table.add_row(*cells, key=key)
            changes += 1
    return changes


def clip(text: str, width: int) -> str:
    """At most ``width`` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"
