"""The top line: the catalog, the age of the data, the last read's duration."""

from __future__ import annotations

from textual.widgets import Static

from .format import ago, clock
from .tables import text


class StatusBar(Static):
    """Always shows how old the data is (updated every second, off the polls)."""

    def __init__(self, catalog: str, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.catalog = catalog
        self.fetched_at: float | None = None
        self.query_ms: float | None = None
        self.problem = False
        self.stale_run = False

    def refresh_age(self, now: float) -> None:
        """Redraw with the current age."""
        if self.fetched_at is None:
            age = "reading..."
        else:
            age = f"data from {clock(self.fetched_at)} ({ago(now - self.fetched_at)})"
            if self.query_ms is not None:
                age += f", read in {self.query_ms:.0f} ms"
        flags = " | run STALE" if self.stale_run else ""
        flags += " | catalog unreadable" if self.problem else ""
        self.set_class(self.stale_run or self.problem, "warning")
        self.update(text(f"{self.catalog} | {age}{flags}"), layout=False)  # one line, always
