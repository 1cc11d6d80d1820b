"""The roster of gang pilots, in the scheduler's process: servers that started as part
of a gang of n nodes (``--context-pilots nodes=n``) wait here until n of them have
come, and become one server (:class:`~..fleet.events.GangAssembled`).

A pilot's server calls :data:`HANDLER` over its authenticated connection to the
scheduler as soon as it has registered; the call returns its group once the group is
whole (or ``{"wait": true}`` after :data:`WAIT_SECONDS`, and the server asks again).
The leader of a group is its first member by name; a candidate that leaves before its
group is whole is struck off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..defaults import GANG_ROSTER_HANDLER
from ..fleet import events as ev

__all__ = ["HANDLER", "WAIT_SECONDS", "Candidate", "GangRoster", "whole_groups"]

logger = logging.getLogger(__name__)

#: The scheduler handler a gang pilot's server calls.
HANDLER = GANG_ROSTER_HANDLER
#: Seconds one call waits for its group before it answers "wait".
WAIT_SECONDS = 20.0


@dataclass(frozen=True)
class Candidate:
    """A server waiting for the rest of its gang."""

    address: str
    name: str
    node: str
    devices: int
    #: The gang's size (its nodes) and the kind of pilot (only alike ones group).
    size: int
    kind: str = ""


def whole_groups(waiting: list[Candidate]) -> tuple[list[list[Candidate]], list[Candidate]]:
    """Groups of ``size`` candidates of one kind and size (in arrival order, each
    sorted by name: its first is the leader), and who still waits."""
    groups: list[list[Candidate]] = []
    left: list[Candidate] = []
    by_kind: dict[tuple[str, int], list[Candidate]] = {}
    for candidate in waiting:
        by_kind.setdefault((candidate.kind, candidate.size), []).append(candidate)
    for (_, size), found in by_kind.items():
        whole = len(found) - len(found) % size
        for start in range(0, whole, size):
            groups.append(sorted(found[start : start + size], key=lambda c: (c.name, c.address)))
        left.extend(found[whole:])
    return groups, left


@dataclass
class GangRoster:
    """Who waits, and the groups made (by member address), published through
    ``publish`` as they are made."""

    publish: Callable[[ev.Event], None]
    waiting: list[Candidate] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    _changed: asyncio.Event | None = None

    async def join(self, comm: Any = None, **candidate: Any) -> dict[str, Any]:
        """The scheduler handler: wait (a while) for this server's group."""
        me = Candidate(**candidate)
        if me.address not in self.groups and all(c.address != me.address for c in self.waiting):
            self.waiting.append(me)
            self._assemble()
        changed = self._event()
        try:
            await asyncio.wait_for(self._until_grouped(me.address, changed), WAIT_SECONDS)
        except TimeoutError:
            return {"wait": True, "waiting": len(self.waiting)}
        return self.groups[me.address]

    async def _until_grouped(self, address: str, changed: asyncio.Event) -> None:
        while address not in self.groups:
            await changed.wait()
            changed = self._event()

    def strike(self, address: str) -> None:
        """A server left: off the list if it waited; its group is no more."""
        self.waiting = [c for c in self.waiting if c.address != address]
        group = self.groups.pop(address, None)
        if group is not None:
            for member in group["members"]:
                self.groups.pop(member, None)

    def _assemble(self) -> None:
        made, self.waiting = whole_groups(self.waiting)
        for group in made:
            leader, members = group[0], group[1:]
            record = {
                "leader": leader.address,
                "members": [c.address for c in group],
                "nodes": [c.node for c in group],
                "devices": [c.devices for c in group],
            }
            for candidate in group:
                self.groups[candidate.address] = record
            logger.info("gang assembled: %s", record)
            self.publish(
                ev.GangAssembled(
                    leader=leader.address,
                    members=[c.address for c in members],
                    nodes=[c.node for c in group],
                    devices=[c.devices for c in group],
                )
            )
        if made:
            self._event().set()
            self._changed = asyncio.Event()

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed
