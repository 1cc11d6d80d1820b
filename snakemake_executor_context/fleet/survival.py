"""How long a server is likely to live: survival estimates from the lives seen. Pure.

A server's life runs from its registration to its end. It *died* when it was lost
(preempted or crashed: :class:`~.losses.LossKind`); a server still alive, one closed
(the run's or the cluster's end, a released or retired pilot) is *censored*: it lived
at least that long. :func:`kaplan_meier` turns such lives into a survival curve
(Kaplan & Meier 1958): at each time ``t`` a server died, the share of servers still
at risk (alive and watched at ``t``) that survived it. Beyond the longest life seen,
the curve goes on at a constant hazard: the group's deaths over its servers' seconds
(the memoryless estimate), or, for a group that never lost a server, one death over
its seconds and :data:`PRIOR_MEAN_LIFE` (its mean life is then at least its seconds
plus the prior's, not infinite).

Lives are grouped: a server's *group* (:func:`survival_group`: a label given to an
embedded or ``up`` cluster's servers, else a pilot's partition and pool), then its GPU
model, then every server. A server's estimate is its group's curve when the group has
:data:`MIN_LIVES` lives, else its GPU model's, else every server's, else the prior:
memoryless with a mean of :data:`PRIOR_MEAN_LIFE`. The prior is the same for every
server, so until lives are seen the estimates tell servers apart only by walltime.

A pilot's walltime is a certain end: :meth:`SurvivalBook.survives` is 0 for any span
past its ``retires_at``, whatever the curve says (this is the margin that keeps a job
off a pilot that retires before the job would end).

:class:`SurvivalBook` keeps the lives (the catalog's history, then the run's own, as
the fleet's events arrive) and answers, for one server now: the chance it lives
through a span (:meth:`~SurvivalBook.survives`), and its expected remaining life
(:meth:`~SurvivalBook.remaining`). Placement (:mod:`.placement`) and the pool
(:func:`.poolsizing.next_kind`) ask; neither reads a clock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LIKELY",
    "MIN_LIVES",
    "PRIOR_MEAN_LIFE",
    "REFRESH_SECONDS",
    "UNMEASURED_SPAN",
    "Curve",
    "Life",
    "SurvivalBook",
    "kaplan_meier",
    "prior_curve",
    "survival_group",
]

#: The prior's mean life (seconds): with no lives seen, a server is assumed to live
#: memorylessly this long on average (4 h, a common walltime on GPU partitions).
PRIOR_MEAN_LIFE = 4 * 3600.0
#: Lives a group (or GPU model) needs before its own curve is used.
MIN_LIVES = 3
#: A chance of living through a span at or above this counts as sure: servers that
#: likely are not told apart by it (placement's other keys decide).
LIKELY = 0.9
#: Seconds a load and a job are taken to last before either is measured, where
#: survival is weighed (a guess: a 2-billion-parameter model's loads take 20-40 s).
UNMEASURED_SPAN = 60.0
#: Seconds after which the live servers' censored lives are read again (their ages grow).
REFRESH_SECONDS = 30.0


def survival_group(group: str = "", partition: str = "", pool: str = "") -> str:
    """A server's survival group: its label (an embedded or ``up`` cluster's
    ``--server-group``), else its pilot's partition and pool ('gpu-short/a10'), else ''."""
    if group:
        return group
    return "/".join(part for part in (partition, pool) if part)


@dataclass(frozen=True)
class Life:
    """One server's life: how long it was watched, whether it ended by a loss (died)
    or is censored (still alive, or closed), and what it was."""

    seconds: float
    died: bool
    group: str = ""
    gpu_model: str = ""

    def to_wire(self) -> list[Any]:
        """``[seconds, died, group, gpu_model]``."""
        return [self.seconds, self.died, self.group, self.gpu_model]

    @classmethod
    def from_wire(cls, item: Sequence[Any]) -> Life:
        """A life from :meth:`to_wire` (ValueError: not one)."""
        seconds, died, group, gpu_model = item
        return cls(max(0.0, float(seconds)), bool(died), str(group), str(gpu_model))


@dataclass(frozen=True)
class Curve:
    """A survival curve: Kaplan-Meier steps within the lives seen, then a constant
    hazard. ``source`` says whose lives made it ('group gpu-short', 'gpu a10',
    'all servers', 'prior')."""

    #: The times a server died (ascending, distinct) and the survival just after each.
    times: tuple[float, ...] = ()
    survival: tuple[float, ...] = ()
    #: The longest life seen (the steps' end); the hazard beyond it (per second).
    horizon: float = 0.0
    tail_rate: float = 1.0 / PRIOR_MEAN_LIFE
    lives: int = 0
    deaths: int = 0
    source: str = "prior"

    def at(self, t: float) -> float:
        """The chance a server lives longer than ``t`` seconds."""
        if t <= 0:
            return 1.0
        index = bisect.bisect_right(self.times, min(t, self.horizon))
        steps = self.survival[index - 1] if index else 1.0
        if t <= self.horizon:
            return steps
        return steps * math.exp(-self.tail_rate * (t - self.horizon))

    def survives(self, age: float, span: float) -> float:
        """The chance a server of ``age`` seconds lives ``span`` seconds more."""
        if span <= 0:
            return 1.0
        now = self.at(age)
        if now <= 0:  # older than every life seen ended: the tail's hazard alone
            return math.exp(-self.tail_rate * span)
        return min(1.0, self.at(age + span) / now)

    def remaining(self, age: float) -> float:
        """Expected seconds a server of ``age`` seconds still lives (the area under the
        curve from its age on, over its survival to that age)."""
        now = self.at(age)
        tail = 1.0 / self.tail_rate if self.tail_rate > 0 else math.inf
        if now <= 0 or age >= self.horizon:
            return tail
        area, start = 0.0, age
        index = bisect.bisect_right(self.times, age)
        level = self.at(age)
        for t, s in zip(self.times[index:], self.survival[index:], strict=True):
            area += level * (t - start)
            start, level = t, s
        area += level * (self.horizon - start)
        area += level * tail
        return area / now

    def mean(self) -> float:
        """Expected life of a new server."""
        return self.remaining(0.0)


def kaplan_meier(
    lives: Iterable[Life], *, source: str = "", prior_mean: float = PRIOR_MEAN_LIFE
) -> Curve:
    """The Kaplan-Meier curve of ``lives``, with the smoothed constant hazard beyond
    the longest (see the module's docstring). A censored life at a death's time is
    at risk at that time."""
    ordered = sorted(lives, key=lambda life: life.seconds)
    deaths = sum(1 for life in ordered if life.died)
    exposure = sum(life.seconds for life in ordered)
    times: list[float] = []
    survival: list[float] = []
    level, at_risk, index = 1.0, len(ordered), 0
    while index < len(ordered):
        t = ordered[index].seconds
        died = ended = 0
        while index < len(ordered) and ordered[index].seconds == t:
            died += ordered[index].died
            ended += 1
            index += 1
        if died:
            level *= 1.0 - died / at_risk
            times.append(t)
            survival.append(level)
        at_risk -= ended
    return Curve(
        times=tuple(times),
        survival=tuple(survival),
        horizon=ordered[-1].seconds if ordered else 0.0,
        tail_rate=deaths / exposure if deaths and exposure > 0 else 1 / (exposure + prior_mean),
        lives=len(ordered),
        deaths=deaths,
        source=source,
    )


def prior_curve(prior_mean: float = PRIOR_MEAN_LIFE) -> Curve:
    """The curve with no lives seen: memoryless, mean ``prior_mean``."""
    return Curve(tail_rate=1.0 / prior_mean, source="prior")


@dataclass
class _Live:
    joined: float
    group: str = ""
    gpu_model: str = ""


@dataclass
class SurvivalBook:
    """Lives seen and servers alive, and the estimates they give (see the module).

    ``lives`` are ended lives (the catalog's history, then this run's); servers alive
    count as censored at their age when the curves are made, which happens again when a
    server joins or leaves, or :data:`REFRESH_SECONDS` after the last time."""

    lives: list[Life] = field(default_factory=list)
    prior_mean: float = PRIOR_MEAN_LIFE
    alive: dict[str, _Live] = field(default_factory=dict)
    _curves: dict[tuple[str, str], Curve] = field(default_factory=dict)
    _made_at: float | None = None

    # -- what happens -----------------------------------------------------------

    def joined(self, address: str, at: float, group: str = "", gpu_model: str = "") -> None:
        """A server joined (registered) at ``at``."""
        if address not in self.alive:
            self.alive[address] = _Live(at, group, gpu_model)
            self._curves.clear()

    def described(self, address: str, group: str | None = None, gpu_model: str = "") -> None:
        """A server said its group and GPU model."""
        live = self.alive.get(address)
        if live is None:
            return
        if group is not None and group != live.group:
            live.group = group
            self._curves.clear()
        if gpu_model and gpu_model != live.gpu_model:
            live.gpu_model = gpu_model
            self._curves.clear()

    def left(self, address: str, at: float, *, died: bool) -> Life | None:
        """A server left at ``at``: lost (``died``) or closed. Its life, if it was known."""
        live = self.alive.pop(address, None)
        if live is None:
            return None
        life = Life(max(0.0, at - live.joined), died, live.group, live.gpu_model)
        self.lives.append(life)
        self._curves.clear()
        return life

    def merge_wire(self, data: Mapping[str, Any]) -> None:
        """Take lives and live servers from :meth:`to_wire` (a hub's snapshot, or the
        catalog's history: :func:`~..catalog.reading.fleetseed.survival_history`). Malformed items
        are skipped."""
        for item in data.get("lives", ()):
            try:
                self.lives.append(Life.from_wire(item))
            except (ValueError, TypeError):
                continue
        for address, item in dict(data.get("alive", {})).items():
            try:
                joined, group, gpu_model = item
                self.joined(str(address), float(joined), str(group), str(gpu_model))
            except (ValueError, TypeError):
                continue
        self._curves.clear()

    def to_wire(self) -> dict[str, Any]:
        """``{"lives": [Life.to_wire(), ...], "alive": {address: [joined, group, gpu_model]}}``."""
        return {
            "lives": [life.to_wire() for life in self.lives],
            "alive": {a: [x.joined, x.group, x.gpu_model] for a, x in self.alive.items()},
        }

    # -- estimates ----------------------------------------------------------------

    def curve(self, group: str, gpu_model: str, now: float) -> Curve:
        """The curve for a server of ``group`` and ``gpu_model`` (see the module: the
        group's, else the GPU model's, else every server's, else the prior)."""
        if self._made_at is None or now - self._made_at > REFRESH_SECONDS:
            self._curves.clear()
        key = (group, gpu_model)
        made = self._curves.get(key)
        if made is not None:
            return made
        if not self._curves:
            self._made_at = now
        every = self.lives + [
            Life(max(0.0, now - live.joined), False, live.group, live.gpu_model)
            for live in self.alive.values()
        ]
        levels: list[tuple[str, list[Life]]] = []
        if group:
            levels.append((f"group {group}", [x for x in every if x.group == group]))
        if gpu_model:
            levels.append((f"gpu {gpu_model}", [x for x in every if x.gpu_model == gpu_model]))
        levels.append(("all servers", every))
        made = prior_curve(self.prior_mean)
        for source, lives in levels:
            if len(lives) >= MIN_LIVES:
                made = kaplan_meier(lives, source=source, prior_mean=self.prior_mean)
                break
        self._curves[key] = made
        return made

    def age(self, address: str, now: float) -> float | None:
        """Seconds since a live server joined (None: not known)."""
        live = self.alive.get(address)
        return None if live is None else max(0.0, now - live.joined)

    def survives(
        self, address: str, span: float, *, now: float, retires_at: float | None = None
    ) -> float:
        """The chance the server at ``address`` lives ``span`` seconds from ``now``:
        0 past its planned retirement, else its curve's at its age."""
        if retires_at is not None and now + span > retires_at:
            return 0.0
        live = self.alive.get(address)
        if live is None:
            return self.curve("", "", now).survives(0.0, span)
        return self.curve(live.group, live.gpu_model, now).survives(now - live.joined, span)

    def remaining(
        self, address: str, *, now: float, retires_at: float | None = None
    ) -> float | None:
        """Expected seconds the server at ``address`` still lives, at most until its
        planned retirement (None: not known to the book)."""
        live = self.alive.get(address)
        if live is None:
            return None
        expected = self.curve(live.group, live.gpu_model, now).remaining(now - live.joined)
        if retires_at is not None:
            expected = min(expected, max(0.0, retires_at - now))
        return expected

    def new_server(self, group: str, gpu_model: str, span: float, *, now: float) -> float:
        """The chance a server of ``group`` that joins now lives ``span`` seconds (a
        pool's choice of the kind of pilot to add)."""
        return self.curve(group, gpu_model, now).survives(0.0, span)

    def by_group(self, now: float) -> Mapping[str, Curve]:
        """Each group's own curve (groups with any life), for the monitor and the ledger."""
        groups = {life.group for life in self.lives} | {x.group for x in self.alive.values()}
        return {group: self.curve(group, "", now) for group in sorted(groups)}
