"""Indexes :class:`~.state.FleetState` keeps so that placement does not scan every
server for each job (:class:`FleetIndex`): the servers by their free slots and, per
set of wanted resources, the servers that can run it (:class:`Candidates`).

Both answer exactly what a scan over every server would; only the cost differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .resources import covers
from .servers import ServerState

__all__ = ["Candidates", "FleetIndex", "wanted_key"]


def wanted_key(wanted: Mapping[str, float]) -> frozenset[tuple[str, float]]:
    """The hashable form of a job's wanted resources (what the indexes are keyed by)."""
    return frozenset(wanted.items())


@dataclass
class Candidates:
    """The servers whose advertised resources cover one set of wanted resources."""

    #: Their addresses, in the order the fleet learnt of them.
    runnable: list[str]
    #: The same as a set.
    runnable_set: frozenset[str] = frozenset()
    #: Those on the fewest nodes among them (placement never goes across nodes when
    #: one node has what the job needs), in the same order, and as a set.
    fewest: list[str] = field(default_factory=list)
    fewest_set: frozenset[str] = frozenset()
    #: Those of ``fewest`` that retire at a known time (pilots).
    retiring: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, servers: Mapping[str, ServerState], wanted: Mapping[str, float]) -> Candidates:
        """Scan the fleet once for ``wanted``."""
        runnable = [
            a for a, s in servers.items() if s.member_of is None and covers(s.resources, wanted)
        ]
        fewest = runnable
        if runnable:
            least = min(servers[a].nodes for a in runnable)
            fewest = [a for a in runnable if servers[a].nodes == least]
        return cls(
            runnable,
            frozenset(runnable),
            fewest,
            frozenset(fewest),
            [a for a in fewest if servers[a].retires_at is not None],
        )


class FleetIndex:
    """What :class:`~.state.FleetState` keeps besides its servers for placement: the
    candidates per set of wanted resources (rebuilt after :meth:`forget`, which the
    state calls whenever membership, offers, nodes or retirements change) and the
    servers by their spare slots (slots minus busy: negative while jobs wait behind
    the running ones), which the state updates on every change of a server's slots
    or held keys."""

    def __init__(self) -> None:
        self._candidates: dict[frozenset[tuple[str, float]], Candidates] = {}
        self._spare: dict[str, int] = {}
        self._by_spare: dict[int, set[str]] = {}

    def candidates(
        self,
        servers: Mapping[str, ServerState],
        wanted: Mapping[str, float],
        key: frozenset[tuple[str, float]] | None = None,
    ) -> Candidates:
        """The servers that can run ``wanted`` (``key``: its :func:`wanted_key`, when
        the caller has it)."""
        key = wanted_key(wanted) if key is None else key
        found = self._candidates.get(key)
        if found is None:
            found = self._candidates[key] = Candidates.build(servers, wanted)
        return found

    def forget(self) -> None:
        """Drop the candidates: the fleet's membership or a server's offer changed."""
        self._candidates.clear()

    def update(self, server: ServerState) -> None:
        """Take a server's current slots and held keys."""
        address, spare = server.address, server.slots - server.busy
        before = self._spare.get(address)
        if before == spare:
            return
        if before is not None:
            self._discard(address, before)
        self._spare[address] = spare
        self._by_spare.setdefault(spare, set()).add(address)

    def drop(self, address: str) -> None:
        """Forget a server that left."""
        before = self._spare.pop(address, None)
        if before is not None:
            self._discard(address, before)
        self._candidates.clear()

    def _discard(self, address: str, spare: int) -> None:
        bucket = self._by_spare[spare]
        bucket.discard(address)
        if not bucket:
            del self._by_spare[spare]

    def count(self, at_least: int) -> int:
        """How many servers have at least ``at_least`` spare slots."""
        return sum(len(b) for spare, b in self._by_spare.items() if spare >= at_least)

    def with_spare(self, at_least: int) -> list[str]:
        """The servers with at least ``at_least`` spare slots (1: a free slot), in no
        particular order."""
        return [a for spare, b in self._by_spare.items() if spare >= at_least for a in b]
