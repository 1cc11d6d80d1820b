"""How long each step of a run's start took, for ``--verbose``: Snakemake's own (its
process's start to the executor's), the executor's checks, the embedded cluster's
steps as its process recorded them (imports, certificates, scheduler and servers),
the client's connection, the catalog and the plan."""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["StartSteps"]


class StartSteps:
    """Each step's end, in order; :meth:`line` gives their durations."""

    def __init__(self, began: float, first: str = "snakemake") -> None:
        self._last = began
        self._steps: list[tuple[str, float]] = []
        self.mark(first)

    def mark(self, name: str, at: float | None = None) -> None:
        """The step ``name`` ended now (or ``at``): it took the time since the last."""
        at = time.time() if at is None else at
        self._steps.append((name, max(0.0, at - self._last)))
        self._last = max(self._last, at)

    def marks(self, ends: Mapping[str, float]) -> None:
        """Steps another process recorded (name -> when it ended), in time order."""
        for name, at in sorted(ends.items(), key=lambda item: item[1]):
            self.mark(name, at)

    def line(self) -> str:
        """'start-up (s): snakemake 1.20, checks 0.01, ...': one line for the log."""
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self._steps)
        total = sum(seconds for _, seconds in self._steps)
        return f"start-up (s): {parts}; {total:.2f} in all"
