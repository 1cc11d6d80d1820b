"""The views' tables, and keyed updates of them: change what changed, never rebuild.

What a view shows comes from a catalog another user may have written: every cell and
label reaches Textual as plain :func:`text` (Textual reads a plain string's ``[red]``,
``[/x]`` as markup, and passes an ESC sequence on to the terminal), never as a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from snakemake_executor_context.terminal import printable, shown

from .model import Cells, Delta

__all__ = ["Column", "Table", "apply_delta", "clip", "setup_columns", "text"]


def text(value: str, *, lines: bool = False) -> Text:
    """``value`` as Textual shows it: its characters as they are, no markup read in
    them, control characters escaped visibly (newlines too, unless ``lines``: a label
    of several lines)."""
    return Text(printable(value) if lines else shown(value), end="")


class Table(DataTable[Any]):
    """A DataTable that renders again only the rows that changed.

    A DataTable drops every rendered cell whenever one cell changes, and whenever it is
    resized, which Textual does each time its tab is shown: showing a view of 1,000
    rows, or a poll that changed a few of them, rendered all its visible cells again
    (some 400 cells, 40-60 ms on a slow machine). Here :meth:`update_cells` forgets only
    the rendered rows it changes, and a resize to the size the table had keeps them (the
    cells do not depend on the table's size: the columns have fixed widths). This relies
    on DataTable's caches as in the pinned Textual version (tests check what is drawn).
    """

    _rendered_size: Size | None = None

    def _on_resize(self, event: events.Resize) -> None:
        if event.size == self._rendered_size:
            event.prevent_default()  # DataTable's handler would drop the rendered cells
        self._rendered_size = event.size

    def update_cells(self, changes: Sequence[tuple[str, ColumnKey, str]]) -> None:
        """Set cells (row key, column key, value) of fixed-width columns, and forget
        the rendered rows they are in, only those."""
        rows: set[RowKey] = set()
        for row, column, value in changes:
            key = RowKey(row)
            self._data[key][column] = text(value)
            rows.add(key)
        indexes = {self._row_locations.get(key) for key in rows}
        for cache, position, stale in (
            (self._row_render_cache, 0, rows),
            (self._cell_render_cache, 0, rows),
            (self._row_renderable_cache, 1, indexes),
        ):
            keys: Any = cache.keys()  # an LRUCache: no iteration of its own
            for cached in [k for k in keys if k[position] in stale]:
                cache.discard(cached)
        self._line_cache.clear()
        self.refresh()


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
    fixed: list[tuple[str, ColumnKey, str]] = []
    for key, cells in delta.upserts.items():
        before = held.get(key)
        if before is None:
            table.add_row(*(text(cell) for cell in cells), key=key)
            changes += 1
        else:
            for column, old, new in zip(columns, before, cells, strict=False):
                if old == new:
                    continue
                changes += 1
                if column.auto_width or not isinstance(table, Table):
                    # Measured again: a column sized to its content (measuring a fixed
                    # one would measure all its cells whenever a value shrinks).
                    table.update_cell(key, column.key, text(new), update_width=column.auto_width)
                else:
                    fixed.append((key, column.key, new))
        held[key] = cells
    if fixed and isinstance(table, Table):
        table.update_cells(fixed)
    return changes


def clip(text: str, width: int) -> str:
    """At most ``width`` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def clip_name(text: str, width: int) -> str:
    """A name cut in its middle, so that its distinguishing end stays: at 10,
    ``pilot-fakea-0`` is ``pilot-…a-0``, ``pilot-fakeb-5`` is ``pilot-…b-5``."""
    if len(text) <= width:
        return text
    tail = max(1, (width - 1) * 2 // 5)
    return text[: width - 1 - tail] + "…" + text[len(text) - tail :]
