"""When finished jobs are told to Snakemake: a pure rule (no clock read, no Snakemake).

Snakemake's scheduler makes one pass over its ready jobs for every job reported
finished, and selects as many jobs as there are free slots at that pass. Told one at a
time, each pass fills one slot: with thousands of ready jobs the passes are the run's
bottleneck (measured: 2.4 jobs a pass at 2,000 ready jobs). Told together, they wake
the scheduler once (:func:`..snakemake_internals.finish_together`), and that pass fills
them all.

A success is held back only while holding costs no server any work: while dispatch
still has jobs queued for the servers' slots. It is told once half of the jobs
Snakemake has handed the executor are finished and held, once nothing is queued
(a slot may fall idle), or after :data:`HOLD_SECONDS` at most. Failures are told at
once, and with them whatever is held.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["HOLD_SECONDS", "HeldReports", "tell_now"]

T = TypeVar("T")

#: The longest a finished job waits to be told to Snakemake.
HOLD_SECONDS = 0.25


def tell_now(*, held: int, handed: int, queued: int, held_for: float) -> bool:
    """Whether the ``held`` successes are told now: ``handed`` jobs Snakemake handed
    the executor are not yet told (the held ones among them), ``queued`` of them wait
    in dispatch's queue for a slot, and the oldest held one finished ``held_for``
    seconds ago."""
    if held == 0:
        return False
    return queued == 0 or 2 * held >= handed or held_for >= HOLD_SECONDS


class HeldReports(Generic[T]):
    """Finished jobs not yet told to Snakemake, in the order they finished."""

    def __init__(self) -> None:
        self._held: list[T] = []
        self._since = 0.0

    def __len__(self) -> int:
        return len(self._held)

    def add(self, report: T, now: float) -> None:
        """Hold one finished job's report (``now``: a monotonic clock's reading)."""
        if not self._held:
            self._since = now
        self._held.append(report)

    def due(self, now: float, *, handed: int, queued: int, everything: bool = False) -> list[T]:
        """The reports to tell now (all held ones, or none; all with ``everything``),
        taken out; ``handed`` and ``queued`` as :func:`tell_now` counts them."""
        held_for = now - self._since
        if everything or tell_now(held=len(self), handed=handed, queued=queued, held_for=held_for):
            return self.take()
        return []

    def take(self) -> list[T]:
        """Every held report, taken out (told now, or never: the run is cancelled)."""
        taken, self._held = self._held, []
        return taken

    def pause(self, interval: float) -> float:
        """How long the status loop may sleep: ``interval``, or less while a report is
        held (its hold ends within :data:`HOLD_SECONDS`)."""
        return min(interval, HOLD_SECONDS) if self._held else interval
