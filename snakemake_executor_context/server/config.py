"""How a server is set up: :class:`ServerConfig`, passed to its worker process by
the cluster (the embedded cluster, ``up``) or built by a pilot's preload from the
:class:`PilotServerSettings` its job script carries, and the memory budget it
resolves (:func:`resolve_budget`)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..defaults import DRAIN_GRACE_SECONDS, SERVER_LEASE_SECONDS
from ..fleet.gpus import GpuInfo
from ..settings.shape import Shape
from ..settings.table import setting_default

__all__ = ["SERVER_DASK_CONFIG", "PilotServerSettings", "ServerConfig", "resolve_budget"]

#: Dask settings of every context server. A loaded model must not make Dask pause
#: (80% of memory) or kill (95%) its server, nor spill it: all four thresholds off.
SERVER_DASK_CONFIG: dict[str, Any] = {
    "distributed.worker.memory.target": False,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
    # Servers run user code that may use multiprocessing: not daemonic.
    "distributed.worker.daemon": False,
    "distributed.worker.profile.enabled": False,
    # Each Dask server (a worker, the scheduler) wakes every 20 ms by default only to
    # measure its event loop's lag, and reads its process's CPU and memory every
    # 0.5 s: 16 idle servers took 1.3% of a core each here, 0.24% with these.
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    # Dask's default pins OMP/MKL/OpenBLAS to 1 thread in workers (jobs set their own)
    # and sets MALLOC_TRIM_THRESHOLD_=65536, which made SmolLM2 scoring 20-25% slower
    # here (50 -> 60 ms per claim): a model's forward passes allocate and free a lot.
    "distributed.nanny.pre-spawn-environ": {},
    # Dask always listens for HTTP too: no routes, so it serves nothing (no metrics,
    # no call stacks, no logs) to anyone, whatever their certificate.
    "distributed.scheduler.http.routes": [],
    "distributed.worker.http.routes": [],
}


@dataclass
class ServerConfig:
    """How a server is set up (its memory cap and leak restarts come from the
    environment: :class:`.policy.ServerLimits`)."""

    name: str = ""
    #: A fraction of the server's memory ("0.8") or a size ("6GB").
    memory_budget: str = setting_default("contexts_memory")
    #: The GPU this server is pinned to (its first, when it owns several), as a
    #: GpuInfo dict; None on a CPU server.
    gpu: dict[str, Any] | None = None
    #: Devices it owns: its GPUs (all in its CUDA_VISIBLE_DEVICES), or on a CPU server
    #: the GPUs it stands in for. A gang context puts one rank on each.
    devices: int = 1
    #: The fleet's shape it runs in: its slots (its Dask threads, set when it starts),
    #: threads per slot, the batched() defaults, template sharing with its peers (0
    #: transfers: it fetches none either, :mod:`.peers`), its own
    #: model cache and that cache's limit (:mod:`..modelcache.cacheroom`), and the gang timeout.
    shape: Shape = field(default_factory=Shape)
    #: Pilots started as one server of this many nodes (1: a server of its own); the
    #: kind of pilot it is (only alike pilots form one).
    gang_nodes: int = 1
    gang_kind: str = ""
    #: Memory of the server in bytes (its share of RAM); 0 = ask the worker.
    memory_bytes: int = 0
    #: Seconds without its scheduler after which the server stops its jobs (0: never).
    lease: float = SERVER_LEASE_SECONDS
    #: Seconds between SIGTERM and the server's exit (:mod:`.policy`).
    drain_grace: float = DRAIN_GRACE_SECONDS
    #: Start the plain-job zygote at once (a persistent cluster), not at a first job.
    warm_zygote: bool = False
    #: When the server retires (a pilot, before its walltime); None: not planned.
    retires_at: float | None = None
    #: A pilot's: when its batch job started (None: not a pilot, or not known).
    allocated_at: float | None = None
    #: Servers that may load one context from its shared source at once, fleet-wide
    #: (0: no limit; pilots only, see :mod:`.loadturns`).
    loads_per_source: int = 0
    #: Where its survival is counted (:func:`~..fleet.survival.survival_group`): the
    #: label its cluster gave it (``server_group``), a pilot's partition (its batch
    #: queue) and pool (its kind of pilot: its GPU type, or 'pilot'); '' if none.
    group: str = ""
    partition: str = ""
    pool: str = ""


@dataclass(frozen=True)
class PilotServerSettings:
    """What a pilot's server is started with: written into its job script by the
    cluster (:meth:`~..pilots.request.PilotOptions.server_settings`, exported as
    :data:`~..defaults.PILOT_VARIABLE`) and read by its preload (:mod:`.pilot`), both
    through :meth:`to_wire` and :meth:`from_wire`."""

    shape: Shape
    memory_budget: str
    #: Pilots that may load one context from its shared source at once (0: no limit).
    loads_per_source: int
    #: The GPUs the batch system grants it, and their type: what it advertises where
    #: NVML sees none.
    gpus: int
    gpu_type: str | None
    #: Seconds after its start at which it retires, moved by up to the stagger.
    lifetime_seconds: float
    lifetime_stagger: float
    #: Pilots that form one server (1: its own), and their kind (only alike ones do).
    gang_nodes: int
    gang_kind: str
    #: The label, partition and pool its survival is counted under (see
    #: :class:`ServerConfig`).
    group: str = ""
    partition: str = ""
    pool: str = ""

    def to_wire(self) -> str:
        """These settings as the JSON text of the job script's variable."""
        return json.dumps(asdict(self))

    @classmethod
    def from_wire(cls, text: str) -> PilotServerSettings:
        """Settings from :meth:`to_wire` (ValueError or TypeError: not a pilot's
        settings of this version)."""
        wire = json.loads(text)
        return cls(**{**wire, "shape": Shape.from_wire(wire["shape"])})

    def server_config(
        self, name: str, gpus: list[GpuInfo], memory_bytes: int, allocated_at: float | None
    ) -> ServerConfig:
        """The pilot's server, now that it runs on its node with these GPUs."""
        lifetime = self.lifetime_seconds
        return ServerConfig(
            name=name,
            memory_budget=self.memory_budget,
            gpu=asdict(gpus[0]) if gpus else None,
            devices=max(1, len(gpus)),
            shape=self.shape,
            gang_nodes=self.gang_nodes,
            gang_kind=self.gang_kind,
            memory_bytes=memory_bytes,
            # Dask's --lifetime-stagger moves the end by up to that much either way.
            retires_at=time.time() + lifetime - self.lifetime_stagger if lifetime else None,
            allocated_at=allocated_at,
            loads_per_source=self.loads_per_source,
            group=self.group,
            partition=self.partition,
            pool=self.pool,
        )


def resolve_budget(spec: str | float, memory_bytes: int) -> int:
    """Bytes a server may fill with contexts: a fraction of its memory, or a size."""
    text = str(spec).strip()
    try:
        fraction = float(text)
    except ValueError:
        from dask.utils import parse_bytes

        return int(parse_bytes(text))
    if not 0 < fraction <= 1:
        raise ValueError(f"memory budget fraction must be in (0, 1], got {text}")
    return int(memory_bytes * fraction)
