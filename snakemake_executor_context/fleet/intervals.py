"""Sets of time intervals: sorted, disjoint ``(start, end)`` pairs, and the few
operations the ledger cuts a server's life with. Pure, standard library only."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Span", "clip", "gaps", "intersect", "merge", "subtract", "total"]

#: One interval, ``start <= end``, in Unix seconds.
Span = tuple[float, float]


def merge(spans: Iterable[Span]) -> list[Span]:
    """The union of any intervals, as a sorted list of disjoint ones (empty ones dropped;
    touching ones joined)."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def clip(spans: list[Span], low: float, high: float) -> list[Span]:
    """A set cut to ``[low, high]``."""
    return [(max(a, low), min(b, high)) for a, b in spans if b > low and a < high]


def intersect(one: list[Span], other: list[Span]) -> list[Span]:
    """The intersection of two sets."""
    out: list[Span] = []
    i = j = 0
    while i < len(one) and j < len(other):
        start, end = max(one[i][0], other[j][0]), min(one[i][1], other[j][1])
        if end > start:
            out.append((start, end))
        if one[i][1] < other[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(one: list[Span], other: list[Span]) -> list[Span]:
    """``one`` without ``other``."""
    out: list[Span] = []
    j = 0
    for start, end in one:
        while j < len(other) and other[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(other) and other[k][0] < end:
            if other[k][0] > cursor:
                out.append((cursor, other[k][0]))
            cursor = max(cursor, other[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def gaps(taken: list[Span], low: float, high: float) -> list[Span]:
    """The stretches of ``[low, high]`` between the intervals of ``taken``: before the
    first, between each two, and after the last."""
    out: list[Span] = []
    cursor = low
    for start, end in taken:
        if start > cursor:
            out.append((cursor, min(start, high)))
        cursor = max(cursor, end)
        if cursor >= high:
            break
    if cursor < high:
        out.append((cursor, high))
    return [(a, b) for a, b in out if b > a]


def total(spans: Iterable[Span]) -> float:
    """The seconds a set covers."""
    return sum(end - start for start, end in spans)
