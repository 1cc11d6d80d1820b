"""The preload that turns a pilot's Dask worker into a context server.

A pilot job (see :mod:`..cluster.pilots`) runs ``python -m distributed.cli.dask_worker
... --preload snakemake_executor_context.server.pilot``; Dask runs :func:`dask_setup` in
the worker process before the worker registers with the scheduler, so the resources set
here are the ones the scheduler first sees. The pilot's settings come from its job
script's environment (:data:`~..defaults.PILOT_VARIABLE`).

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

from ..defaults import BATCH_STARTED_VARIABLE, GANG_TIMEOUT_SECONDS, PILOT_VARIABLE
from ..fleet.gpus import STAND_IN_SOURCE, GpuInfo
from ..fleet.resources import server_resources
from .nvml import discover_gpus

__all__ = ["dask_setup", "pilot_gpus", "pilot_settings"]

logger = logging.getLogger(__name__)


def pilot_settings(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The pilot's server settings from its job script's environment."""
    text = (environ if environ is not None else dict(os.environ)).get(PILOT_VARIABLE, "")
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
    from .config import ServerConfig
    from .plugin import ContextServerPlugin

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
        allocated_at=allocated_at(),
        name=str(worker.name),
        memory_budget=str(settings.get("memory_budget") or "0.8"),
        gpu=asdict(gpus[0]) if gpus else None,
        devices=max(1, len(gpus)),
        gang_timeout=float(settings.get("gang_timeout") or GANG_TIMEOUT_SECONDS),
        gang_nodes=int(settings.get("gang_nodes") or 1),
        gang_kind=str(settings.get("gang_kind") or ""),
        memory_bytes=memory,
        threads_per_slot=int(settings.get("threads_per_slot") or 0),
        batch_max=int(settings.get("batch_max") or 0),
        batch_wait=float(settings.get("batch_wait") or 0.0),
        loads_per_source=int(settings.get("loads_per_source") or 0),
        peer_transfers=int(settings.get("peer_transfers", 2)),
        peer_rate=float(settings.get("peer_mbps") or 0.0) * 1e6,
        own_cache=str(settings.get("own_caches") or ""),
        model_cache_bytes=int(settings.get("model_cache_bytes") or 0),
    )
    await worker.plugin_add(ContextServerPlugin(config))
