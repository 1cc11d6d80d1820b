"""The pool's books: each pilot's life and what it cost, as pure data and functions.

The pool (in the cluster process) fills one :class:`PilotRecord` per pilot from what it
observes: when the batch job was submitted, when its server registered, how long it
had work, when and how it ended (the batch system's own state where it can be read).
:func:`account` sums them up for ``status``, the monitor and the run's summary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["BATCH_ENDINGS", "PilotRecord", "PoolBooks", "account", "ending_of"]

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
    #: The kind of pilot (its GPU type, or the batch system's name).
    pilot_kind: str = ""
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
        return {item.name: getattr(self, item.name) for item in fields(PilotRecord)}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> PilotRecord:
        """A record from :meth:`to_wire` (keys it does not know are left out)."""
        names = {item.name for item in fields(PilotRecord)}
        return cls(**{key: value for key, value in wire.items() if key in names})


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


@dataclass(frozen=True)
class PoolBooks:
    """A pool's books as the pool publishes them in the scheduler's metadata
    (:meth:`to_wire`) and ``status`` reads them (:meth:`from_wire`)."""

    records: tuple[PilotRecord, ...] = ()
    #: One summary per kind of pilot (its GPU type, GPUs, walltime...).
    kinds: tuple[dict[str, Any], ...] = ()
    minimum: int = 0
    maximum: int = 0
    #: When the pool wrote them (the account's "now" for pilots still running).
    at: float = 0.0

    @property
    def account(self) -> dict[str, Any]:
        """:func:`account` of the records at :attr:`at`."""
        return account(self.records, self.at)

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict (msgpack-able; the account included for ``status --json``)."""
        return {
            "records": [record.to_wire() for record in self.records],
            "account": self.account,
            "kinds": [dict(kind) for kind in self.kinds],
            "minimum": self.minimum,
            "maximum": self.maximum,
            "at": self.at,
        }

    @classmethod
    def from_wire(cls, wire: object) -> PoolBooks | None:
        """Books from :meth:`to_wire`; None where the cluster has no pool."""
        if not isinstance(wire, Mapping) or not wire:
            return None
        return cls(
            records=tuple(PilotRecord.from_wire(r) for r in wire.get("records") or ()),
            kinds=tuple(dict(kind) for kind in wire.get("kinds") or ()),
            minimum=int(wire.get("minimum", 0)),
            maximum=int(wire.get("maximum", 0)),
            at=float(wire.get("at", 0.0)),
        )

    def describe(self) -> str:
        """One line about the pool."""
        a = self.account
        return (
            f"pool: {a['running']} pilot(s) running (min {self.minimum}, max {self.maximum}); "
            f"submitted {a['submitted']}, started {a['started']}, preempted {a['preempted']}, "
            f"crashed {a['crashed']}, retired {a['retired']}; pilot-seconds "
            f"{a['pilot_seconds']:.0f} (busy {a['busy_seconds']:.0f}, idle "
            f"{a['idle_seconds']:.0f})"
        )
