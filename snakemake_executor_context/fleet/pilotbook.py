"""The pool's books: each pilot's life and what it cost, as pure data and functions.

The pool (in the cluster process) fills one :class:`PilotRecord` per pilot from what it
observes: when the batch job was submitted, when its server registered, how long it
had work, when and how it ended (the batch system's own state where it can be read).
:func:`account` sums them up for ``status``, the monitor and the run's summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BATCH_ENDINGS", "PilotRecord", "account", "describe_pool", "ending_of"]

#: What a batch system's final job state says about a pilot's end: "preempted" (an
#: outside kill, counted against a job's preemption budget), "crashed", "retired" (it
#: left as planned).
BATCH_ENDINGS: dict[str, str] = {
    "PREEMPTED": "preempted",
    "CANCELLED": "preempted",
    "NODE_FAIL": "preempted",
    "BOOT_FAIL": "preempted",
    "DEADLINE": "preempted",
    "TIMEOUT": "preempted",
    "REVOKED": "preempted",
    "SUSPENDED": "preempted",
    "FAILED": "crashed",
    "OUT_OF_MEMORY": "crashed",
    "COMPLETED": "retired",
}


def ending_of(batch_state: str | None) -> str:
    """ "preempted", "crashed", "retired", or "unknown" for a batch job state such as
    SLURM's ``CANCELLED by 0`` or ``PREEMPTED``."""
    if not batch_state:
        return "unknown"
    word = batch_state.split()[0].rstrip("+").upper()
    return BATCH_ENDINGS.get(word, "unknown")


@dataclass
class PilotRecord:
    """One pilot, from submission to its end."""

    name: str
    kind: str = ""
    job_id: str = ""
    submitted: float = 0.0
    registered: float | None = None
    first_task: float | None = None
    ended: float | None = None
    #: The batch system's final state (``CANCELLED``, ``PREEMPTED``, ...), when read.
    batch_state: str | None = None
    #: Seconds the pilot had a job, sampled by the pool.
    busy_seconds: float = 0.0
    #: The pool released it (idle, or shut down): whatever the batch system says
    #: (its cancel shows as CANCELLED), it retired.
    released: bool = False

    @property
    def ending(self) -> str:
        """How it ended: "retired" when released, else :func:`ending_of` its state."""
        return "retired" if self.released else ending_of(self.batch_state)

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict (scheduler metadata, JSON)."""
        return asdict(self)


def account(records: Iterable[PilotRecord], now: float) -> dict[str, Any]:
    """Pilot-seconds allocated (registered to end), busy and idle, and how many pilots
    were submitted, started, preempted, crashed and retired."""
    records = list(records)
    allocated = busy = 0.0
    endings = {"preempted": 0, "crashed": 0, "retired": 0, "unknown": 0}
    for record in records:
        if record.registered is not None:
            allocated += max(0.0, (record.ended or now) - record.registered)
        busy += record.busy_seconds
        if record.ended is not None:
            endings[record.ending] += 1
    return {
        "submitted": len(records),
        "started": sum(1 for r in records if r.registered is not None),
        "running": sum(1 for r in records if r.registered is not None and r.ended is None),
        **endings,
        "pilot_seconds": round(allocated, 1),
        "busy_seconds": round(busy, 1),
        "idle_seconds": round(max(0.0, allocated - busy), 1),
    }


def describe_pool(books: dict[str, Any]) -> str:
    """One line about a pool of pilots, from what the pool publishes."""
    a = books.get("account") or {}
    return (
        f"pool: {a.get('running', 0)} pilot(s) running (min {books.get('minimum', 0)}, "
        f"max {books.get('maximum', 0)}); submitted {a.get('submitted', 0)}, started "
        f"{a.get('started', 0)}, preempted {a.get('preempted', 0)}, crashed "
        f"{a.get('crashed', 0)}, retired {a.get('retired', 0)}; pilot-seconds "
        f"{a.get('pilot_seconds', 0):.0f} (busy {a.get('busy_seconds', 0):.0f}, idle "
        f"{a.get('idle_seconds', 0):.0f})"
    )
