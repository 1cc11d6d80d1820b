"""Simulated time: a queue of timed calls, run in order, deterministically.

Ties are broken by the order the calls were scheduled, and every random draw of a
simulation comes from one seeded generator (a server's life from its own, seeded by
the run's seed and its address: :mod:`.preempt`): the same seed gives the same run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Clock", "Timer"]


@dataclass(order=True)
class Timer:
    """A call due at ``when`` (cancel it to skip it)."""

    when: float
    seq: int
    call: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False, default=())
    cancelled: bool = field(compare=False, default=False)

    def cancel(self) -> None:
        """Skip the call."""
        self.cancelled = True


class Clock:
    """The simulation's time and the calls still to come."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[Timer] = []
        self._seq = 0
        #: Calls run so far.
        self.steps = 0

    def at(self, when: float, call: Callable[..., Any], *args: Any) -> Timer:
        """Run ``call(*args)`` at ``when`` (never before now)."""
        self._seq += 1
        timer = Timer(max(when, self.now), self._seq, call, args)
        heapq.heappush(self._heap, timer)
        return timer

    def after(self, delay: float, call: Callable[..., Any], *args: Any) -> Timer:
        """Run ``call(*args)`` ``delay`` seconds from now."""
        return self.at(self.now + max(0.0, delay), call, *args)

    def run(self, done: Callable[[], bool], limit: float = float("inf")) -> None:
        """Run the calls in time order until ``done()`` or time passes ``limit``."""
        heap = self._heap
        while heap and not done():
            timer = heapq.heappop(heap)
            if timer.cancelled:
                continue
            if timer.when > limit:
                self.now = limit
                return
            self.now = timer.when
            self.steps += 1
            timer.call(*timer.args)
