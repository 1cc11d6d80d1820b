"""What a server says of itself when asked (``status``, a run's summary): its
:class:`ServerInventory`, written in the server's process with :meth:`~ServerInventory.to_wire`
(a plain dict: Dask's ``Client.run`` carries it, the run summary keeps it as JSON) and
read in the executor's or the command line's with :meth:`~ServerInventory.from_wire`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from ..fleet.gpus import GpuInfo
from ..fleet.outcome import ServerIdentity

__all__ = ["HeldContext", "ServerInventory", "ServerStats", "SlotState", "fields_of"]

T = TypeVar("T")


@dataclass(frozen=True)
class HeldContext:
    """A context loaded on the server."""

    identity: str
    names: tuple[str, ...] = ()
    loader: str = ""
    #: Bytes it holds, seconds its load took, jobs that reused it, jobs using it now.
    bytes: int = 0
    load_seconds: float = 0.0
    hits: int = 0
    pins: int = 0
    conversions: int = 0
    loaded_at: float = 0.0
    last_used: float = 0.0


@dataclass(frozen=True)
class SlotState:
    """The server's slots: how many, the jobs running and waiting, and each context's
    limit of jobs at once and measured memory per job."""

    slots: int = 1
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    limits: Mapping[str, int] = field(default_factory=dict)
    job_memory: Mapping[str, int] = field(default_factory=dict)


@dataclass
class ServerStats:
    """What the server has done since it started (counted as it goes)."""

    loads: int = 0
    load_seconds: float = 0.0
    hits: int = 0
    evictions: int = 0
    conversions: int = 0
    jobs: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    load_failures: int = 0
    #: Jobs that failed with CUDA out of memory (the allocator's cache was freed).
    cuda_ooms: int = 0
    #: The contexts it evicted, by identity.
    evicted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ServerInventory:
    """A server's contexts, slots and counts, as it reports them."""

    server: ServerIdentity
    #: Its GPU (the first, when it owns several); None on a CPU server.
    gpu: GpuInfo | None = None
    #: Its memory, and the bytes its contexts may fill (its budget) and fill now.
    memory_bytes: int = 0
    memory_budget: int = 0
    bytes_loaded: int = 0
    contexts: tuple[HeldContext, ...] = ()
    #: Its jobs running now (plain ones too), and its slots.
    running: tuple[str, ...] = ()
    slots: SlotState = field(default_factory=SlotState)
    #: A copy of its counts when it was asked.
    counts: ServerStats = field(default_factory=ServerStats)

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict: the counts at the top level, beside the rest (the run
        summary's ``servers`` entries, ``status --json``)."""
        return {
            "server": asdict(self.server),
            "gpu": asdict(self.gpu) if self.gpu else None,
            "memory_bytes": self.memory_bytes,
            "memory_budget": self.memory_budget,
            "bytes_loaded": self.bytes_loaded,
            "contexts": [asdict(context) for context in self.contexts],
            "running": list(self.running),
            "slots": asdict(self.slots),
            **asdict(self.counts),
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ServerInventory:
        """An inventory from :meth:`to_wire` (KeyError, TypeError or ValueError if it
        is not one)."""
        gpu = wire.get("gpu")
        slots = dict(wire.get("slots") or {})
        return cls(
            server=ServerIdentity(**wire["server"]),
            gpu=GpuInfo(**gpu) if isinstance(gpu, Mapping) else None,
            memory_bytes=int(wire.get("memory_bytes") or 0),
            memory_budget=int(wire.get("memory_budget") or 0),
            bytes_loaded=int(wire.get("bytes_loaded") or 0),
            contexts=tuple(fields_of(HeldContext, c) for c in wire.get("contexts") or ()),
            running=tuple(str(key) for key in wire.get("running") or ()),
            slots=fields_of(SlotState, slots),
            counts=fields_of(ServerStats, wire, lists=True),
        )


def fields_of(cls: type[T], wire: Mapping[str, Any], *, lists: bool = False) -> T:
    """A record of class ``cls`` from the keys of ``wire`` that name its fields (other
    keys are left out); lists become tuples unless ``lists``."""
    values = {}
    for item in fields(cls):  # type: ignore[arg-type]
        if item.name in wire:
            value = wire[item.name]
            values[item.name] = tuple(value) if isinstance(value, list) and not lists else value
    return cls(**values)
