"""A capacity shared by what uses it at once (processor sharing): the shared
filesystem's bandwidth among the loads reading from it, a GPU's throughput among the
jobs of its slots. Each of ``n`` users progresses at ``capacity(n) / n``.
"""

from __future__ import annotations

from collections.abc import Callable

from .clock import Clock, Timer

__all__ = ["Shared"]

#: Work within this of the least left is done with it (float noise: bytes or seconds).
_EPSILON = 1e-6


class Shared:
    """Users of one capacity, each with work left (bytes, or seconds alone)."""

    def __init__(self, clock: Clock, capacity: Callable[[int], float]) -> None:
        self.clock = clock
        self.capacity = capacity
        self._left: dict[str, float] = {}
        self._done: dict[str, Callable[[], None]] = {}
        self._since = 0.0
        self._timer: Timer | None = None

    def __len__(self) -> int:
        return len(self._left)

    def add(self, key: str, work: float, done: Callable[[], None]) -> None:
        """Start ``work`` for ``key``; ``done()`` is called when it is finished."""
        self._advance()
        self._left[key] = max(0.0, work)
        self._done[key] = done
        self._schedule()

    def remove(self, key: str) -> float:
        """Stop ``key``'s work (its user is gone); the work it had left."""
        self._advance()
        left = self._left.pop(key, 0.0)
        self._done.pop(key, None)
        self._schedule()
        return left

    def _rate(self) -> float:
        n = len(self._left)
        return self.capacity(n) / n if n else 0.0

    def _advance(self) -> None:
        now = self.clock.now
        if self._left:
            progress = (now - self._since) * self._rate()
            for key in self._left:
                self._left[key] -= progress
        self._since = now

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._left:
            return
        rate = self._rate()
        first = min(self._left.values())
        delay = max(0.0, first) / rate if rate > 0 else float("inf")
        if delay != float("inf"):
            self._timer = self.clock.after(delay, self._finish)

    def _finish(self) -> None:
        self._timer = None
        self._advance()
        if not self._left:
            return
        # The timer was set for the least work left: it, and any tied with it, is done.
        floor = min(self._left.values())
        finished = sorted(key for key, left in self._left.items() if left <= floor + _EPSILON)
        callbacks = []
        for key in finished:
            del self._left[key]
            callbacks.append(self._done.pop(key))
        self._schedule()
        for callback in callbacks:
            callback()
