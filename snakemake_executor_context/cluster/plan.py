"""What a local cluster starts: one server per GPU, or CPU servers that stand in for
GPUs, and the Dask settings every context server runs with. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ClusterError
from ..fleet.gpus import GpuInfo
from ..fleet.resources import server_resources

__all__ = [
    "SERVER_DASK_CONFIG",
    "ServerPlan",
    "check_memory_budget",
    "check_servers",
    "plan_servers",
]

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
    # Dask's default pins OMP/MKL/OpenBLAS to 1 thread in workers (jobs set their own)
    # and sets MALLOC_TRIM_THRESHOLD_=65536, which made SmolLM2 scoring 20-25% slower
    # here (50 -> 60 ms per claim): a model's forward passes allocate and free a lot.
    "distributed.nanny.pre-spawn-environ": {},
    # Dask always listens for HTTP too: no routes, so it serves nothing (no metrics,
    # no call stacks, no logs) to anyone, whatever their certificate.
    "distributed.scheduler.http.routes": [],
    "distributed.worker.http.routes": [],
}


@dataclass(frozen=True)
class ServerPlan:
    """One server a local cluster starts."""

    name: str
    memory_bytes: int
    gpu: GpuInfo | None = None
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def plan_servers(
    gpus: Sequence[GpuInfo], cpu_servers: int | None, total_memory: int, cpu_count: int
) -> list[ServerPlan]:
    """One server per GPU (pinned by UUID), or ``cpu_servers`` CPU servers that stand
    in for ``gpu=1`` when the machine has no GPU. Memory is shared out evenly."""
    if gpus:
        share = total_memory // len(gpus)
        return [
            ServerPlan(
                name=gpu.server_name,
                memory_bytes=share,
                gpu=gpu,
                resources=server_resources(share, [gpu]),
                env={"CUDA_VISIBLE_DEVICES": gpu.uuid},
            )
            for gpu in gpus
        ]
    count = cpu_servers if cpu_servers is not None else max(1, min(4, cpu_count))
    if count < 1:
        raise ClusterError(f"--context-servers must be at least 1, got {count}.")
    share = total_memory // count
    return [
        ServerPlan(
            name=f"cpu{index}",
            memory_bytes=share,
            resources=server_resources(share, stand_in_gpus=1),
            env={"CUDA_VISIBLE_DEVICES": ""},
        )
        for index in range(count)
    ]


def check_servers(value: int | None, setting: str) -> None:
    """Refuse a server count below 1 (None: the default), in one line naming ``setting``."""
    if value is not None and (isinstance(value, bool) or int(value) < 1):
        raise ClusterError(
            f"{setting} {value} is not allowed: a whole number of servers, at least 1 "
            "(or leave it out for the default)."
        )


def check_memory_budget(value: str, setting: str) -> None:
    """Refuse a memory budget that is neither a fraction in (0, 1] nor a positive size,
    in one line naming ``setting``."""
    from dask.utils import parse_bytes

    text = str(value).strip()
    try:
        fraction = float(text)
    except ValueError:
        try:
            ok = bool(text) and parse_bytes(text) > 0
        except (ValueError, TypeError, KeyError):
            ok = False
    else:
        ok = 0 < fraction <= 1
    if not ok:
        raise ClusterError(
            f"{setting} {value!r} is not allowed: a fraction of a server's memory in (0, 1] "
            "(e.g. 0.8) or a size (e.g. 6GB)."
        )
