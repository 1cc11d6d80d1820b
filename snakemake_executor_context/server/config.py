"""How a server is set up: :class:`ServerConfig`, passed to its worker process by
the cluster (the embedded cluster, ``up``) or built by a pilot's preload, and the
memory budget it resolves (:func:`resolve_budget`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..defaults import (
    DEFAULT_MEMORY_BUDGET,
    DRAIN_GRACE_SECONDS,
    GANG_TIMEOUT_SECONDS,
    SERVER_LEASE_SECONDS,
)

__all__ = ["ServerConfig", "resolve_budget"]


@dataclass
class ServerConfig:
    """How a server is set up (its memory cap and leak restarts come from the
    environment: :class:`.limits.ServerLimits`)."""

    name: str = ""
    #: A fraction of the server's memory ("0.8") or a size ("6GB").
    memory_budget: str = DEFAULT_MEMORY_BUDGET
    #: The GPU this server is pinned to (its first, when it owns several), as a
    #: GpuInfo dict; None on a CPU server.
    gpu: dict[str, Any] | None = None
    #: Devices it owns: its GPUs (all in its CUDA_VISIBLE_DEVICES), or on a CPU server
    #: the GPUs it stands in for. A gang context puts one rank on each.
    devices: int = 1
    #: Seconds a gang's collectives (and its rendezvous) may take before they fail.
    gang_timeout: float = GANG_TIMEOUT_SECONDS
    #: Pilots started as one server of this many nodes (1: a server of its own); the
    #: kind of pilot it is (only alike pilots form one).
    gang_nodes: int = 1
    gang_kind: str = ""
    #: Memory of the server in bytes (its share of RAM); 0 = ask the worker.
    memory_bytes: int = 0
    #: Seconds without its scheduler after which the server stops its jobs (0: never).
    lease: float = SERVER_LEASE_SECONDS
    #: Seconds between SIGTERM and the server's exit (:mod:`.drain`).
    drain_grace: float = DRAIN_GRACE_SECONDS
    #: Start the plain-job zygote at once (a persistent cluster), not at a first job.
    warm_zygote: bool = False
    #: When the server retires (a pilot, before its walltime); None: not planned.
    retires_at: float | None = None
    #: A pilot's: when its batch job started (None: not a pilot, or not known).
    allocated_at: float | None = None
    #: Jobs it runs at once (Dask's threads), and the thread pools' size of each
    #: in-process job (0: the rule's threads).
    slots: int = 1
    threads_per_slot: int = 0
    #: Defaults of the contexts' batched() functions (0: each function's own).
    batch_max: int = 0
    batch_wait: float = 0.0
    #: Servers that may load one context from its shared source at once, fleet-wide
    #: (0: no limit; pilots only, see :mod:`.loadturns`).
    loads_per_source: int = 0
    #: Transfers of its context templates it serves to peers at once (0: none, and it
    #: fetches none: every load reads its source; :mod:`.holder`, :mod:`.transfer`).
    peer_transfers: int = 2
    #: Bytes a second each transfer it serves may take (0: no limit).
    peer_rate: float = 0.0
    #: A directory of per-server model caches: this server's is ``<dir>/<its name>``,
    #: as servers on different nodes have ("": the servers of a node share one).
    own_cache: str = ""
    #: Bytes its model cache's entries may take (0: no limit; the least recently used
    #: ones no server of the node uses make room: :mod:`...cacheroom`).
    model_cache_bytes: int = 0


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
