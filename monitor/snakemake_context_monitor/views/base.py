"""What every view does with a poll's update: labels at once, tables when shown."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from textual.widget import Widget
from textual.widgets import DataTable, Static

from ..model import Cells, ViewUpdate
from ..tables import apply_delta, text

__all__ = ["PolledView"]


class PolledView(Widget):
    """A view kept up to date by :meth:`receive`: its labels change at once (cheap), its
    tables and drawings only while it is shown; a hidden view keeps what changed, merged,
    until :meth:`flush` (when it is shown). The first poll fills every view, so that
    showing one for the first time does not wait for its tables to fill.

    A mixin after the container class (``class FleetView(Vertical, PolledView)``): Textual
    takes a widget's default CSS along its first bases only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: ViewUpdate | None = None
        #: table id -> the rows it holds.
        self.held: dict[str, dict[str, Cells]] = {}
        #: Changes made to tables and drawings (tests count them).
        self.changes = 0
        self.filled = False

    def receive(self, update: ViewUpdate, *, shown: bool) -> None:
        """Take a poll's update: labels now, the rest now if ``shown``, else later."""
        if not update:
            return
        for label, value in update.texts.items():
            # A hidden label is laid out when its view is shown, not now.
            self.query_one(f"#{label}", Static).update(text(value, lines=True), layout=shown)
        rest = ViewUpdate(update.tables, {}, update.extra)
        if rest:
            self.pending = rest if self.pending is None else self.pending.then(rest)
        if shown or not self.filled:
            self.flush()
            self.filled = True

    def flush(self) -> None:
        """Apply what waited while the view was hidden."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        for table, delta in pending.tables.items():
            held = self.held.setdefault(table, {})
            self.changes += apply_delta(self.query_one(f"#{table}", DataTable), held, delta)
        if pending.extra is not None:
            self.changes += 1
            self.draw(pending.extra)

    def draw(self, extra: Hashable) -> None:
        """Show what a view draws besides tables and labels (charts, bars)."""
