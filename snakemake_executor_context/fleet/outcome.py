"""The one record of what an attempt did on its server: :class:`Outcome`.

A server seals it when a job ends and sends it inside the job's result (and the
fleet's :class:`~.events.JobFinished` event, derived from it here); the executor's
fleet state learns from it (:meth:`.state.FleetState.learn`), and the run summary's
entry is derived from it (:mod:`..executor.summary`). Plain data, frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .events import JobFinished

__all__ = ["Outcome", "ServerIdentity"]


@dataclass(frozen=True)
class ServerIdentity:
    """Which server ran a job."""

    name: str
    host: str
    pid: int
    address: str = ""

    def describe(self) -> str:
        """'server-0 on host (pid 123)'."""
        return f"{self.name} on {self.host} (pid {self.pid})"


@dataclass(frozen=True)
class Outcome:
    """What one attempt did on its server: how it ended, its times, its items and
    what it did to the server's contexts."""

    #: The attempt's key.
    key: str
    server: ServerIdentity
    ok: bool = False
    #: Stopped on request (Ctrl-C, a limit, the executor gave it up).
    cancelled: bool = False
    #: Why its failure was its server's fault, not its own ('a full or failing disk
    #: (OSError ENOSPC)'); '' for a script's own error, which fails on any server.
    fault: str = ""
    #: Wall-clock seconds on the server, loads included.
    started: float = 0.0
    finished: float = 0.0
    #: Work done, as the script reported through report_items().
    items: int = 0
    #: The context it ran against (None: a plain job), and its server's GPU model.
    context: str | None = None
    gpu_model: str = ""
    #: Seconds it spent loading contexts (0.0 when every context was warm).
    load_seconds: float = 0.0
    #: Identities it loaded (cold) and found loaded (warm).
    loaded: tuple[str, ...] = ()
    reused: tuple[str, ...] = ()
    #: Identities the server evicted to make room during it.
    evicted: tuple[str, ...] = ()
    #: Conversions its load did, and how long that load took after converting.
    conversions: int = 0
    reload_seconds: float | None = None
    #: Calls of batched functions (forward batches) it led: (size, calls) pairs.
    batches: tuple[tuple[int, int], ...] = ()

    @property
    def job_seconds(self) -> float:
        """Its time on its server, loads excluded."""
        return max(0.0, self.finished - self.started - self.load_seconds)

    def but(self, **changes: Any) -> Outcome:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def finished_event(self, run_id: str, at: float | None = None) -> JobFinished:
        """The fleet's event of its end (sent by its server, or recorded by the
        executor when the result beats the event)."""
        fields: dict[str, Any] = {
            "run_id": run_id,
            "key": self.key,
            "address": self.server.address,
            "ok": self.ok,
            "cancelled": self.cancelled,
            "fault": self.fault,
            "started": self.started,
            "finished": self.finished,
            "items": self.items,
            "load_seconds": self.load_seconds,
            "loaded": list(self.loaded),
            "context": self.context,
            "gpu_model": self.gpu_model,
            "batches": {str(size): calls for size, calls in self.batches},
        }
        return JobFinished(**fields) if at is None else JobFinished(at=at, **fields)
