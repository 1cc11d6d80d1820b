"""Which loaded contexts make room for another: the one eviction order.

A server evicts by it (:mod:`..server.cache`) and placement predicts a server's
evictions with it (:func:`.placement.victims`), so the two cannot drift apart: the
least recently used context that no running job holds goes first, until what stays
loaded plus the incoming context fits the server's budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Held", "to_evict"]


@dataclass(frozen=True)
class Held:
    """A context loaded on a server, as eviction sees it."""

    identity: str
    last_used: float
    nbytes: int
    #: A running job holds it: it cannot be evicted now.
    pinned: bool = False


def to_evict(held: Iterable[Held], incoming: int, budget: int) -> list[str]:
    """The identities to evict, least recently used first, so that the bytes of what
    stays plus ``incoming`` fit ``budget`` (as far as unpinned contexts allow)."""
    held = list(held)
    used = sum(item.nbytes for item in held)
    out: list[str] = []
    for item in sorted(
        (item for item in held if not item.pinned), key=lambda i: (i.last_used, i.identity)
    ):
        if used + incoming <= budget:
            break
        out.append(item.identity)
        used -= item.nbytes
    return out
