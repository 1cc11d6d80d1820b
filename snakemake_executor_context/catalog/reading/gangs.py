"""The gangs held now: contexts spanning several processes, loaded on live servers,
with their members (for ``status`` and the monitor). Read from the placements that
recorded a :class:`~...fleet.events.GangFormed`."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Context, Placement, Server

__all__ = ["GangRow", "gangs"]


@dataclass(frozen=True)
class GangRow:
    """A context spanning several processes, loaded (or loading) on a live server: its
    ranks and their members."""

    context: str
    identity: str
    server: str
    state: str
    ranks: int
    backend: str
    devices: list[str]
    nodes: list[str]
    pids: list[int]
    bytes: list[int]


def gangs(session: Session) -> list[GangRow]:
    """The gangs held now (open placements of several ranks on live servers)."""
    found = session.execute(
        select(Context.name, Context.identity, Server.name, Placement.state, Placement.ranks)
        .add_columns(Placement.gang)
        .join(Context, Placement.context_id == Context.id)
        .join(Server, Placement.server_id == Server.id)
        .where(
            Placement.ranks.is_not(None),
            Placement.state.in_(("loading", "ready")),
            Server.left.is_(None),
        )
        .order_by(Context.name, Server.name)
    ).all()
    rows = []
    for name, identity, server, state, ranks, text in found:
        gang = json.loads(text or "{}")
        members = gang.get("members", [])
        rows.append(
            GangRow(
                context=name,
                identity=identity,
                server=server,
                state=state,
                ranks=int(ranks),
                backend=str(gang.get("backend", "")),
                devices=[str(m.get("device", "")) for m in members],
                nodes=[str(m.get("node", "")) for m in members],
                pids=[int(m.get("pid", 0)) for m in members],
                bytes=[int(m.get("bytes", 0)) for m in members],
            )
        )
    return rows
