"""View models: what each view shows, as plain data, and what changed since the last poll.

Each view module has a pure function that turns a :class:`~.data.Snapshot` into a
:class:`ViewModel`: the rows of its tables (cells as strings, by row key), the texts of
its labels, and anything else it draws. The :class:`Presenter` runs those functions off
the UI thread, compares each model with the previous one and hands the UI thread a
:class:`ViewUpdate` holding only what changed: rows added, changed or removed, texts
changed. A poll in which nothing changed makes empty updates, and the UI thread has
nothing to do. Rows are built again only when the snapshot's lists they come from are
other objects than at the previous poll (:class:`Memo`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .data import Snapshot

__all__ = ["Cells", "Delta", "Memo", "Presenter", "Rows", "ViewModel", "ViewUpdate", "compare"]

T = TypeVar("T")

#: A table row's cells.
Cells = tuple[str, ...]
#: A table's rows by key, in display order.
Rows = Mapping[str, Cells]


@dataclass(frozen=True)
class Delta:
    """What changed in a table: rows new or changed (in display order), rows gone."""

    upserts: Mapping[str, Cells] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.upserts or self.removed)

    def then(self, later: Delta) -> Delta:
        """This change followed by ``later``, as one."""
        upserts = {key: cells for key, cells in self.upserts.items() if key not in later.removed}
        upserts.update(later.upserts)
        return Delta(upserts, (self.removed | later.removed) - later.upserts.keys())


def delta(before: Rows | None, after: Rows) -> Delta:
    """The change from ``before`` to ``after`` (all of ``after`` when there was none)."""
    if before is after:
        return Delta()
    if not before:
        return Delta(dict(after))
    upserts = {key: cells for key, cells in after.items() if before.get(key) != cells}
    return Delta(upserts, frozenset(before.keys() - after.keys()))


@dataclass(frozen=True)
class ViewModel:
    """Everything a view shows: table id -> rows, label id -> text, and whatever else
    it draws (``extra``, compared by equality)."""

    tables: Mapping[str, Rows] = field(default_factory=dict)
    texts: Mapping[str, str] = field(default_factory=dict)
    extra: Hashable = None


@dataclass(frozen=True)
class ViewUpdate:
    """What a view must change: per table, per label, and the new ``extra`` (None when
    it did not change)."""

    tables: Mapping[str, Delta] = field(default_factory=dict)
    texts: Mapping[str, str] = field(default_factory=dict)
    extra: Hashable = None

    def __bool__(self) -> bool:
        return bool(self.texts) or self.extra is not None or any(self.tables.values())

    def then(self, later: ViewUpdate) -> ViewUpdate:
        """This update followed by ``later``, as one (a hidden view's pending work)."""
        tables = dict(self.tables)
        for table, change in later.tables.items():
            tables[table] = tables[table].then(change) if table in tables else change
        extra = later.extra if later.extra is not None else self.extra
        return ViewUpdate(tables, {**self.texts, **later.texts}, extra)


def compare(before: ViewModel | None, after: ViewModel) -> ViewUpdate:
    """What changed from one model of a view to the next."""
    old = before or ViewModel()
    tables = {
        table: change
        for table, rows in after.tables.items()
        if (change := delta(old.tables.get(table), rows))
    }
    texts = {label: text for label, text in after.texts.items() if old.texts.get(label) != text}
    extra = after.extra if before is None or after.extra != before.extra else None
    return ViewUpdate(tables, texts, extra)


class Memo:
    """A view's rows, built again only when their inputs are other objects."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[object, ...], Rows]] = {}
        self._keyed: dict[str, tuple[object, Rows, dict[str, tuple[object, Cells]]]] = {}

    def keyed(
        self, table: str, items: Sequence[T], key: Callable[[T], str], cells: Callable[[T], Cells]
    ) -> Rows:
        """One row per item (by ``key``), formatted again only for items that are other
        objects than at the previous call (all the same when ``items`` is)."""
        cached = self._keyed.get(table)
        if cached is not None and cached[0] is items:
            return cached[1]
        before = cached[2] if cached is not None else {}
        rows: dict[str, Cells] = {}
        made: dict[str, tuple[object, Cells]] = {}
        for item in items:
            row_key = key(item)
            hit = before.get(row_key)
            rows[row_key] = hit[1] if hit is not None and hit[0] is item else cells(item)
            made[row_key] = (item, rows[row_key])
        self._keyed[table] = (items, rows, made)
        return rows

    def rows(self, table: str, inputs: tuple[object, ...], build: Callable[[], Rows]) -> Rows:
        """``build()``, or the rows it made last time if ``inputs`` are the same objects."""
        cached = self._cache.get(table)
        if cached is not None and _same(cached[0], inputs):
            return cached[1]
        rows = build()
        self._cache[table] = (inputs, rows)
        return rows


def _same(before: tuple[object, ...], now: tuple[object, ...]) -> bool:
    return len(before) == len(now) and all(a is b for a, b in zip(before, now, strict=True))


#: A view's model function: the snapshot (and its memo) to the view's model.
Page = Callable[["Snapshot", Memo], ViewModel]


class Presenter:
    """Turns snapshots into updates per view, off the UI thread; keeps the last models."""

    def __init__(self) -> None:
        self._models: dict[str, ViewModel] = {}
        self._memos: dict[str, Memo] = {}

    def present(self, snapshot: Snapshot, pages: Mapping[str, Page]) -> dict[str, ViewUpdate]:
        """The update of each page (view id -> model function) since the last call; a
        page not asked for is forgotten."""
        for gone in self._models.keys() - pages.keys():
            del self._models[gone]
            self._memos.pop(gone, None)
        updates = {}
        for page, build in pages.items():
            model = build(snapshot, self._memos.setdefault(page, Memo()))
            updates[page] = compare(self._models.get(page), model)
            self._models[page] = model
        return updates
