"""The preload that turns a pilot's Dask worker into a context server.

A pilot job (see :mod:`..cluster.pilots`) runs ``python -m distributed.cli.dask_worker
... --preload snakemake_executor_context.server.pilot``; Dask runs :func:`dask_setup` in
the worker process before the worker registers with the scheduler, so the resources set
here are the ones the scheduler first sees.

What the pilot advertises comes from the node, not from the submit side: its GPUs from
NVML; where NVML sees none (a driver-less test node, a fake GRES), ``gpus`` stand-in GPUs
of the pilot's ``gpu_type`` setting, as the batch system granted them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any

from ..fleet.gpus import GpuInfo
from ..fleet.resources import server_resources
from .nvml import discover_gpus

__all__ = ["PILOT_ENV", "LoadSlot", "dask_setup", "pilot_gpus", "pilot_settings"]

logger = logging.getLogger(__name__)

#: Set in the pilot's job script by :mod:`..cluster.pilots` (kept equal there).
PILOT_ENV = "SNAKEMAKE_CONTEXT_PILOT"


def pilot_settings(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The pilot's server settings from its job script's environment."""
    text = (environ if environ is not None else dict(os.environ)).get(PILOT_ENV, "")
    return json.loads(text) if text else {}


def pilot_gpus(settings: dict[str, Any], found: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs a pilot advertises: NVML's, or stand-ins named by its GPU type."""
    if found:
        return found
    count = int(settings.get("gpus") or 0)
    kind = settings.get("gpu_type")
    if count <= 0 or not kind:
        return []
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return [
        GpuInfo(
            index=index,
            uuid=visible[index] if index < len(visible) else f"{kind}-{index}",
            name=str(kind),
            memory_bytes=0,
            extra={"source": "pilot gpu_type (NVML saw no GPU)"},
        )
        for index in range(count)
    ]


async def dask_setup(worker: Any) -> None:
    """Advertise the pilot's GPUs and memory, and install the context server."""
    from .plugin import ContextServerPlugin
    from .server import ServerConfig

    settings = pilot_settings()
    gpus = pilot_gpus(settings, discover_gpus())
    memory = int(worker.memory_manager.memory_limit or 0)
    resources = server_resources(memory, gpus, stand_in_gpus=0)
    state = worker.state
    for name, amount in resources.items():
        state.total_resources[name] = amount
        state.available_resources[name] = amount
    lifetime = float(settings.get("lifetime_seconds") or 0)
    stagger = float(settings.get("lifetime_stagger") or 0)
    config = ServerConfig(
        # Dask's --lifetime-stagger moves the end by up to that much either way.
        retires_at=time.time() + lifetime - stagger if lifetime else None,
        name=str(worker.name),
        memory_budget=str(settings.get("memory_budget") or "0.8"),
        gpu=asdict(gpus[0]) if len(gpus) == 1 else None,
        memory_bytes=memory,
        threads_per_slot=int(settings.get("threads_per_slot") or 0),
        batch_max=int(settings.get("batch_max") or 0),
        batch_wait=float(settings.get("batch_wait") or 0.0),
    )
    await worker.plugin_add(ContextServerPlugin(config))


class LoadSlot:
    """A pilot's turn to load a context from its shared source (a no-op elsewhere).

    Many pilots starting together would all read the same weights from the shared
    filesystem at once; a Dask semaphore on the scheduler, one per context, lets at
    most the pilot's ``loads_per_source`` of them load at a time. A load from the
    node-local cache reads nothing shared and takes no turn.
    """

    def __init__(self, identity: str, *, cached: bool, environ: dict[str, str] | None = None):
        self._semaphore: Any = None
        limit = int(pilot_settings(environ).get("loads_per_source") or 0)
        if cached or limit <= 0:
            return
        from distributed import Semaphore, get_worker

        try:
            get_worker()
        except ValueError:  # not in a Dask worker: nothing to coordinate with
            return
        self._semaphore = Semaphore(
            max_leases=limit, name=f"snakemake-context-load-{identity[:16]}"
        )
        self._semaphore.acquire()

    def release(self) -> None:
        """End the turn (once)."""
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            try:
                semaphore.release()
            except Exception as error:  # the lease expired meanwhile: nothing held
                logger.debug("releasing a load slot: %r", error)
