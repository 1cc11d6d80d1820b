"""The preload that turns a pilot's Dask worker into a context server.

A pilot job (see :mod:`..pilots.request`) runs ``python -m distributed.cli.dask_worker
... --preload snakemake_executor_context.server.pilot``; Dask runs :func:`dask_setup` in
the worker process before the worker registers with the scheduler, so the resources set
here are the ones the scheduler first sees. The pilot's settings come from its job
script's environment (:data:`~..defaults.PILOT_VARIABLE`).

What the pilot advertises comes from the node, not from the submit side: its GPUs from
NVML; where NVML sees none (a driver-less test node, a fake GRES), ``gpus`` stand-in GPUs
of the pilot's ``gpu_type`` setting, as the batch system granted them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..defaults import BATCH_STARTED_VARIABLE, PILOT_VARIABLE
from ..fleet.gpus import STAND_IN_SOURCE, GpuInfo
from ..fleet.resources import server_resources
from .config import PilotServerSettings
from .nvml import discover_gpus

__all__ = ["dask_setup", "pilot_gpus", "pilot_settings"]

logger = logging.getLogger(__name__)


def pilot_settings(environ: dict[str, str] | None = None) -> PilotServerSettings:
    """The pilot's server settings from its job script's environment."""
    text = (environ if environ is not None else dict(os.environ)).get(PILOT_VARIABLE, "")
    return PilotServerSettings.from_wire(text)


def pilot_gpus(settings: PilotServerSettings, found: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs a pilot advertises: NVML's, or stand-ins named by its GPU type."""
    if found:
        return found
    count, kind = settings.gpus, settings.gpu_type
    if count <= 0 or not kind:
        return []
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return [
        GpuInfo(
            index=index,
            uuid=visible[index] if index < len(visible) else f"{kind}-{index}",
            name=str(kind),
            memory_bytes=0,
            extra={"source": STAND_IN_SOURCE},
        )
        for index in range(count)
    ]


def allocated_at(environ: dict[str, str] | None = None) -> float | None:
    """When the pilot's batch job started, as its job script noted it (None: unknown)."""
    text = (environ if environ is not None else dict(os.environ)).get(BATCH_STARTED_VARIABLE, "")
    try:
        return float(text)
    except ValueError:  # a date(1) without %N: its whole seconds
        try:
            return float(text.split(".")[0])
        except ValueError:
            return None


async def dask_setup(worker: Any) -> None:
    """Advertise the pilot's GPUs and memory, and install the context server."""
    from .plugin import ContextServerPlugin

    settings = pilot_settings()
    gpus = pilot_gpus(settings, discover_gpus())
    memory = int(worker.memory_manager.memory_limit or 0)
    resources = server_resources(memory, gpus, stand_in_gpus=0)
    state = worker.state
    for name, amount in resources.items():
        state.total_resources[name] = amount
        state.available_resources[name] = amount
    config = settings.server_config(str(worker.name), gpus, memory, allocated_at())
    await worker.plugin_add(ContextServerPlugin(config))
