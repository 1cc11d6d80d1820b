"""How long a simulated server lives: a lifetime distribution given by its hazard. Pure.

A server's *hazard* is its rate of dying at an age, given it lived that long; its
survival to age ``t`` is ``exp(-H(t))``, ``H`` the hazard summed over ``[0, t]``. A
life is drawn by inverting that: a uniform ``u`` gives the age at which
``H(t) = -ln(1 - u)`` (the inverse of the lifetime's CDF), so the same ``u`` gives a
longer life under a kinder hazard (two runs that differ only in a policy draw each
server's life from its own ``u``, :mod:`.preempt`).

Three shapes, written as the ``simulate`` command's ``--lifetimes`` takes them
(seconds, or a number with ``s``, ``min`` or ``h``):

- ``exp:MEAN``: a constant hazard (memoryless; the shape a preemption rate gives);
- ``weibull:SHAPE:SCALE``: a hazard that falls with age (shape below 1: the longer a
  server has lived, the longer it will) or rises (above 1: wear-out);
- ``bathtub:EARLY_MEAN:EARLY_END:MID_MEAN:LATE_START:LATE_MEAN``: a piecewise-constant
  hazard, each stretch given by its mean life (the inverse of its rate): ages below
  ``EARLY_END``, from there to ``LATE_START``, and beyond. Preemptible cloud VMs die
  like this: often in their first minutes, rarely in mid-life, often again near their
  provider's deadline (Kadupitiya, Jadhao & Sharma, arXiv 1911.05160).

:func:`parse_hazard` reads one, :func:`parse_lifetimes` the command's
``PARTITION=SPEC[,...]``; bad text is one :class:`~..errors.SettingError` naming it.
"""

from __future__ import annotations

import math
import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..errors import SettingError

__all__ = [
    "MAX_SECONDS",
    "MIN_MEAN",
    "Bathtub",
    "Hazard",
    "Memoryless",
    "Weibull",
    "parse_hazard",
    "parse_lifetimes",
]

#: The shortest mean life (or Weibull scale) allowed, seconds: every death is an event
#: of the simulation and a fixed fleet's server comes back a second later, so this
#: bounds deaths as ``--preempt``'s 60/min bounds preemptions.
MIN_MEAN = 1.0
#: The longest time a spec may name (the simulator's span, 30 days).
MAX_SECONDS = 30 * 86400.0
#: Weibull shapes allowed: below 0.1 the draws spread over hundreds of orders of
#: magnitude; above 100 every life is the scale.
_SHAPES = (0.1, 100.0)
_UNITS = {"": 1.0, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_FORMS = (
    "exp:MEAN, weibull:SHAPE:SCALE or bathtub:EARLY_MEAN:EARLY_END:MID_MEAN:LATE_START:"
    "LATE_MEAN (seconds, or with s, min or h)"
)


class Hazard(ABC):
    """A lifetime distribution, by its cumulative hazard ``H``."""

    @abstractmethod
    def cumulative(self, age: float) -> float:
        """``H(age)``: the hazard summed from birth to ``age``."""

    @abstractmethod
    def age_at(self, cumulative: float) -> float:
        """The age at which ``H`` reaches ``cumulative`` (the inverse of :meth:`cumulative`)."""

    @abstractmethod
    def mean(self) -> float:
        """The mean life, seconds."""

    def survival(self, age: float) -> float:
        """The chance a server lives longer than ``age`` seconds."""
        return math.exp(-self.cumulative(max(0.0, age)))

    def life(self, u: float) -> float:
        """The life whose CDF is ``u`` (in [0, 1)): the inverse CDF."""
        return self.age_at(-math.log1p(-min(max(u, 0.0), 1.0 - 1e-16)))

    def draw(self, rng: random.Random) -> float:
        """A life drawn with ``rng``."""
        return self.life(rng.random())


@dataclass(frozen=True)
class Memoryless(Hazard):
    """A constant hazard, ``1 / mean`` (``exp:MEAN``)."""

    mean_life: float

    def cumulative(self, age: float) -> float:
        """``age / mean``."""
        return max(0.0, age) / self.mean_life

    def age_at(self, cumulative: float) -> float:
        """``cumulative * mean``."""
        return cumulative * self.mean_life

    def mean(self) -> float:
        """Its mean."""
        return self.mean_life


@dataclass(frozen=True)
class Weibull(Hazard):
    """``H(t) = (t / scale) ** shape`` (``weibull:SHAPE:SCALE``)."""

    shape: float
    scale: float

    def cumulative(self, age: float) -> float:
        """``(age / scale) ** shape``."""
        return (max(0.0, age) / self.scale) ** self.shape

    def age_at(self, cumulative: float) -> float:
        """``scale * cumulative ** (1 / shape)``."""
        return self.scale * cumulative ** (1.0 / self.shape)

    def mean(self) -> float:
        """``scale * Gamma(1 + 1 / shape)``."""
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)


@dataclass(frozen=True)
class Bathtub(Hazard):
    """A hazard constant in three stretches of age: ``[0, early_end)`` at
    ``1 / early_mean``, ``[early_end, late_start)`` at ``1 / mid_mean``, and beyond at
    ``1 / late_mean``."""

    early_mean: float
    early_end: float
    mid_mean: float
    late_start: float
    late_mean: float

    def _stretches(self) -> tuple[tuple[float, float, float], ...]:
        """(start, end, rate) of each stretch."""
        return (
            (0.0, self.early_end, 1.0 / self.early_mean),
            (self.early_end, self.late_start, 1.0 / self.mid_mean),
            (self.late_start, math.inf, 1.0 / self.late_mean),
        )

    def cumulative(self, age: float) -> float:
        """The rates times the time spent in each stretch up to ``age``."""
        return sum(rate * max(0.0, min(age, end) - start) for start, end, rate in self._stretches())

    def age_at(self, cumulative: float) -> float:
        """The stretch where ``H`` reaches ``cumulative``, and the age within it."""
        left = max(0.0, cumulative)
        for start, end, rate in self._stretches():
            span = (end - start) * rate
            if left <= span:
                return start + left / rate
            left -= span
        raise AssertionError("the last stretch is endless")  # pragma: no cover

    def mean(self) -> float:
        """The survival curve's area, stretch by stretch."""
        area = 0.0
        for start, end, rate in self._stretches():
            alive = self.survival(start)
            area += alive * (1.0 - math.exp(-rate * (end - start))) / rate
        return area


def _seconds(text: str, what: str) -> float:
    found = re.fullmatch(r"\s*([0-9.]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    value = None
    if found and found.group(2) in _UNITS:
        try:
            value = float(found.group(1)) * _UNITS[found.group(2)]
        except ValueError:
            pass
    if value is None or not math.isfinite(value):
        raise SettingError(f"{what} is not allowed: {text!r} is not a number of seconds.")
    if value > MAX_SECONDS:
        raise SettingError(
            f"{what} is not allowed: {text!r} is beyond the simulator's span of "
            f"{MAX_SECONDS / 86400:g} days."
        )
    return value


def _mean(text: str, what: str) -> float:
    value = _seconds(text, what)
    if value < MIN_MEAN:
        raise SettingError(
            f"{what} is not allowed: a mean life or scale of {text!r} is below "
            f"{MIN_MEAN:g} s (every death is an event of the simulation)."
        )
    return value


def parse_hazard(text: str, what: str = "--lifetimes") -> Hazard:
    """A hazard from its spec (the module's forms); ``what`` names the flag or part in
    the one-line SettingError for a bad one."""
    name, *fields = [part.strip() for part in text.strip().split(":")]
    shown = f"{what} {text.strip()!r}"
    counts = {"exp": 1, "weibull": 2, "bathtub": 5}
    if name.lower() not in counts or len(fields) != counts[name.lower()]:
        raise SettingError(f"{shown} is not allowed: expected {_FORMS}.")
    kind = name.lower()
    if kind == "exp":
        return Memoryless(_mean(fields[0], shown))
    if kind == "weibull":
        shape = _seconds(fields[0], shown)
        if not _SHAPES[0] <= shape <= _SHAPES[1]:
            raise SettingError(
                f"{shown} is not allowed: the shape is {_SHAPES[0]:g} to {_SHAPES[1]:g} "
                "(below 1 a hazard that falls with age, above 1 one that rises)."
            )
        return Weibull(shape, _mean(fields[1], shown))
    early_mean, mid_mean, late_mean = (_mean(fields[i], shown) for i in (0, 2, 4))
    early_end, late_start = _seconds(fields[1], shown), _seconds(fields[3], shown)
    if not early_end <= late_start:
        raise SettingError(
            f"{shown} is not allowed: EARLY_END ({fields[1]}) is after LATE_START "
            f"({fields[3]}): the stretches are early, then mid-life, then late."
        )
    return Bathtub(early_mean, early_end, mid_mean, late_start, late_mean)


def parse_lifetimes(text: str, flag: str = "--lifetimes") -> dict[str, Hazard]:
    """``PARTITION=SPEC[,...]`` (a bare ``SPEC``, or ``*=SPEC``: every partition not
    named) as each partition's hazard."""
    out: dict[str, Hazard] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        where, sep, spec = part.partition("=")
        if not sep:
            where, spec = "*", part
        where = where.strip()
        if not where:
            raise SettingError(
                f"{flag} {part!r} is not allowed: expected PARTITION=SPEC (a partition's "
                f"name, or * for every other), SPEC one of {_FORMS}."
            )
        if where in out:
            raise SettingError(f"{flag} {part!r} is not allowed: {where!r} is named twice.")
        out[where] = parse_hazard(spec, f"{flag} {where}")
    if not out:
        raise SettingError(f"{flag} {text!r} names no lifetime. Fix: --lifetimes short=exp:120.")
    return out
