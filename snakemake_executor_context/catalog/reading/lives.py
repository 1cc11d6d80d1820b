"""Servers' lives as the catalog tells them: how long each live server is likely to
live still (``snakemake-context status`` and the monitor), and, over a run, how long
its servers lived against what the history before the run predicted (the report).

Both take the ended lives :func:`~.fleetseed.survival_history` reads and the estimates of
:mod:`...fleet.survival` (Kaplan-Meier per survival group, else per GPU model, else
over every server, else the prior). An estimate whose curve is the prior is shown as
the prior, not as a number: it says nothing about that server. A pilot's walltime is
not in the catalog, so a live server's estimate is its curve's alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ...fleet.losses import LossKind
from ...fleet.survival import (
    REFRESH_SECONDS,
    Curve,
    Life,
    SurvivalBook,
    kaplan_meier,
    survival_group,
)
from ..models import Server
from .fleetseed import LIFE_COLUMNS, survival_history

__all__ = [
    "REFRESH_SECONDS",
    "GroupLives",
    "LifeLeft",
    "LiveServer",
    "catalog_lives_left",
    "group_lives",
    "live_servers",
    "lives_left",
    "lives_text",
    "median_life",
    "rough_duration",
]

# REFRESH_SECONDS, the fleet's, is exported for the monitor (which imports only the
# catalog): how long an estimate of a live server stands before it is made again.

#: How a server without a survival group is named.
NO_GROUP = "(no group)"


def rough_duration(seconds: float) -> str:
    """A duration to about two figures, short enough for a narrow column: '40 s', '12 min',
    '3.5 h', '2.1 d', '41 d'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    days = seconds / 86400
    return f"{days:.1f} d" if days < 10 else f"{days:.0f} d"


class LiveServer(NamedTuple):
    """A server alive in the catalog, as its estimate needs it."""

    address: str
    joined: float
    #: Its survival group (:func:`~...fleet.survival.survival_group`).
    group: str
    gpu_model: str
    name: str = ""

    @classmethod
    def of(
        cls,
        address: str,
        joined: float,
        group_label: str | None,
        partition: str | None,
        pool: str | None,
        gpu_model: str | None,
        name: str | None = None,
    ) -> LiveServer:
        """The live server of a catalog row's columns."""
        group = survival_group(group_label or "", partition or "", pool or "")
        return cls(address, joined, group, gpu_model or "", name or address)


@dataclass(frozen=True)
class LifeLeft:
    """A live server's expected remaining life, and whose lives the estimate comes
    from (``source``: 'group gpu-short', 'gpu a10', 'all servers', or 'prior')."""

    seconds: float
    source: str
    lives: int
    deaths: int

    @property
    def known(self) -> bool:
        """Whether lives were seen for it (else the estimate is the prior's)."""
        return self.source != "prior"

    def short(self) -> str:
        """'~12 min', or 'prior' when no lives were seen (a narrow column's)."""
        return f"~{rough_duration(self.seconds)}" if self.known else "prior"

    def text(self) -> str:
        """'~12 min (group short, 14 lives)', or '- (prior)' when no lives were seen."""
        if not self.known:
            return "- (prior)"
        return f"{self.short()} ({self.source}, {self.lives} lives)"


def lives_left(
    history: Mapping[str, Any], live: Iterable[LiveServer], *, now: float
) -> dict[str, LifeLeft]:
    """Each live server's expected remaining life at ``now``, by address, from the
    ended lives of ``history`` (:func:`~.fleetseed.survival_history`'s form) and the live
    servers themselves (censored at their age; one that joined after ``now`` is new)."""
    book = SurvivalBook()
    book.merge_wire(history)
    for server in live:
        joined = min(server.joined, now)
        book.joined(server.address, joined, server.group, server.gpu_model)
    out: dict[str, LifeLeft] = {}
    for address, alive in book.alive.items():
        seconds = book.remaining(address, now=now)
        assert seconds is not None  # the book knows every server it was told of
        curve = book.curve(alive.group, alive.gpu_model, now)
        out[address] = LifeLeft(seconds, curve.source, curve.lives, curve.deaths)
    return out


def live_servers(session: Session) -> list[LiveServer]:
    """The catalog's live servers (not left), oldest first."""
    rows = session.execute(
        select(
            Server.address,
            Server.joined,
            Server.group_label,
            Server.partition,
            Server.pool,
            Server.gpu_model,
            Server.name,
        )
        .where(Server.left.is_(None))
        .order_by(Server.joined, Server.id)
    )
    return [LiveServer.of(*row) for row in rows]


def catalog_lives_left(session: Session, *, now: float) -> list[tuple[LiveServer, LifeLeft]]:
    """Each live server (oldest first, one per address) and its expected remaining
    life at ``now`` (:func:`lives_left` over the catalog's history and live servers)."""
    live = live_servers(session)
    left = lives_left(survival_history(session), live, now=now)
    return [(server, left.pop(server.address)) for server in live if server.address in left]


def median_life(curve: Curve) -> float:
    """The life half the servers of ``curve`` outlive (in its tail: where the
    constant hazard brings it to one half)."""
    for t, level in zip(curve.times, curve.survival, strict=True):
        if level <= 0.5:
            return t
    level = curve.at(curve.horizon)
    return curve.horizon + math.log(level / 0.5) / curve.tail_rate


@dataclass(frozen=True)
class GroupLives:
    """One survival group's servers over a window (a run): how long they lived,
    against what the lives that ended before it predicted for a new server of that
    group."""

    group: str
    #: The prediction: a new server's mean and median life, and whose lives it came
    #: from ('group short', 'all servers', 'prior') and how many.
    predicted_mean: float
    predicted_median: float
    source: str
    history: int
    #: The window's servers of the group, and how many of them died (preempted or
    #: crashed) in it; the others are censored at their close or the window's end.
    servers: int
    deaths: int
    #: The longest life watched (to a server's end, or the window's).
    longest: float
    #: Their Kaplan-Meier mean life (None: none died, so it would be the prior's).
    actual_mean: float | None
    #: Their Kaplan-Meier share alive at the predicted median (the prediction says
    #: one half; None: no server was watched that long).
    past_median: float | None

    def text(self) -> str:
        """One line: the prediction, then what the window's servers did."""
        source = "prior" if self.source == "prior" else f"{self.source}, {self.history} lives"
        line = (
            f"{self.group}: predicted mean life {rough_duration(self.predicted_mean)}, "
            f"median {rough_duration(self.predicted_median)} ({source}); "
            f"here {self.servers} server(s), "
        )
        if self.actual_mean is None:
            line += f"none died (watched up to {rough_duration(self.longest)})"
        else:
            line += f"{self.deaths} died, mean life {rough_duration(self.actual_mean)}"
        if self.past_median is None:
            return line + ", none watched as long as the predicted median"
        return line + f", {100 * self.past_median:.0f}% outlived the predicted median"

    def to_wire(self) -> dict[str, Any]:
        """Its fields, as the report's JSON holds them."""
        return asdict(self)


def group_lives(session: Session, start: float, end: float) -> list[GroupLives]:
    """Per survival group, the lives of the servers alive in [start, end] against
    the prediction the catalog's lives that ended before ``start`` make. A server's
    life runs from its join (before ``start`` too) to its end, or to ``end``
    (censored); one that ended without a recorded cause (before schema 8) is left
    out, as the history leaves it out."""
    book = SurvivalBook()
    book.merge_wire(survival_history(session, before=start))
    lives: dict[str, list[Life]] = {}
    for joined, left, ended_by, label, partition, pool, model in session.execute(
        select(*LIFE_COLUMNS).where(
            Server.joined <= end, or_(Server.left.is_(None), Server.left >= start)
        )
    ):
        ended = left is not None and left <= end
        if ended and ended_by is None:
            continue
        died = ended and ended_by != LossKind.CLOSED
        group = survival_group(label or "", partition or "", pool or "")
        seconds = max(0.0, (left if ended else end) - joined)
        lives.setdefault(group, []).append(Life(seconds, died, group, model or ""))
    rows = []
    for group, members in sorted(lives.items()):
        predicted = book.curve(group, "", start)
        median = median_life(predicted)
        actual = kaplan_meier(members, source=f"group {group}")
        longest = max(life.seconds for life in members)
        rows.append(
            GroupLives(
                group=group or NO_GROUP,
                predicted_mean=predicted.mean(),
                predicted_median=median,
                source=predicted.source,
                history=predicted.lives,
                servers=len(members),
                deaths=actual.deaths,
                longest=longest,
                actual_mean=actual.mean() if actual.deaths else None,
                past_median=actual.at(median) if median <= longest else None,
            )
        )
    return rows


def lives_text(rows: Iterable[GroupLives]) -> list[str]:
    """The predicted-against-actual lines of a window (a heading, a line a group)."""
    lines = [row.text() for row in rows]
    if not lines:
        return []
    return ["Server lives by group: predicted from the lives ended before, and here:"] + [
        "  " + line for line in lines
    ]
