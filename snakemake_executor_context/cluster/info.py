"""The cluster process's record of itself: :class:`ClusterInfo`, written once it is up
(beside the scheduler file, 0600: :meth:`.infofiles.ClusterFiles.write_info`) and read by
the executor, ``up``, ``down``, ``status`` and the injector, all other processes.

What tells the cluster process from a later process given the same pid (its start
time and command line) travels in it too: a record whose process is gone names
nothing (:meth:`.infofiles.ClusterFiles.running_pid`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..fleet.gpus import GpuInfo
from ..settings.table import setting_default

__all__ = ["ClusterInfo", "PlannedServer"]


@dataclass(frozen=True)
class PlannedServer:
    """A server the cluster process started (a pool of pilots plans none)."""

    name: str
    #: Its GPU (the first, when it owns several); None on a CPU server.
    gpu: GpuInfo | None = None
    #: The GPUs it owns, or those a CPU server stands in for.
    devices: int = 1
    #: The Dask resources it offers.
    resources: Mapping[str, float] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict (JSON)."""
        return {
            "name": self.name,
            "gpu": asdict(self.gpu) if self.gpu else None,
            "devices": self.devices,
            "resources": dict(self.resources),
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> PlannedServer:
        """A server from :meth:`to_wire`."""
        gpu = wire.get("gpu")
        return cls(
            name=str(wire["name"]),
            gpu=GpuInfo(**gpu) if isinstance(gpu, Mapping) else None,
            devices=int(wire.get("devices", 1)),
            resources={str(k): float(v) for k, v in dict(wire.get("resources") or {}).items()},
        )


@dataclass(frozen=True)
class ClusterInfo:
    """What a running cluster process says of itself."""

    pid: int
    #: The scheduler's address.
    address: str = ""
    servers: tuple[PlannedServer, ...] = ()
    #: When it was up (the epoch's seconds), and when each step of its start ended.
    started: float = 0.0
    steps: Mapping[str, float] = field(default_factory=dict)
    #: The catalog it writes (None: none).
    catalog: str | None = None
    #: Its pool's options (:meth:`..pilots.PilotOptions.to_json`, parsed); None without.
    pilots: Mapping[str, Any] | None = None
    tls: bool = True
    #: Jobs each server runs at once, and each in-process job's threads.
    slots: int = setting_default("slots")
    threads_per_slot: int = setting_default("threads_per_slot")
    #: Its process's start time (clock ticks since boot) and command line, as
    #: :func:`.infofiles.identity` reads them.
    start_ticks: int | None = None
    cmdline: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict (JSON)."""
        return {
            "pid": self.pid,
            "address": self.address,
            "servers": [server.to_wire() for server in self.servers],
            "started": self.started,
            "steps": dict(self.steps),
            "catalog": self.catalog,
            "pilots": dict(self.pilots) if self.pilots is not None else None,
            "tls": self.tls,
            "slots": self.slots,
            "threads_per_slot": self.threads_per_slot,
            "start_ticks": self.start_ticks,
            "cmdline": list(self.cmdline),
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ClusterInfo:
        """A record from :meth:`to_wire` (KeyError, TypeError or ValueError if it is
        not one)."""
        ticks = wire.get("start_ticks")
        pilots = wire.get("pilots")
        return cls(
            pid=int(wire["pid"]),
            address=str(wire.get("address") or ""),
            servers=tuple(PlannedServer.from_wire(s) for s in wire.get("servers") or ()),
            started=float(wire.get("started") or 0.0),
            steps={str(k): float(v) for k, v in dict(wire.get("steps") or {}).items()},
            catalog=None if wire.get("catalog") is None else str(wire["catalog"]),
            pilots=dict(pilots) if isinstance(pilots, Mapping) else None,
            tls=bool(wire.get("tls", True)),
            slots=int(wire.get("slots", setting_default("slots"))),
            threads_per_slot=int(wire.get("threads_per_slot", setting_default("threads_per_slot"))),
            start_ticks=None if ticks is None else int(ticks),
            cmdline=tuple(str(part) for part in wire.get("cmdline") or ()),
        )
