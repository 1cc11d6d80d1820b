"""What a local cluster starts: one server per GPU, or CPU servers that stand in for
GPUs, and the Dask settings every context server runs with. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ClusterError
from ..fleet.gpus import GpuInfo
from ..fleet.resources import server_resources

__all__ = [
    "ServerPlan",
    "connect_timeout",
    "plan_servers",
    "start_method",
    "start_wait",
    "warm_zygotes",
]

#: The longest path a Unix socket may have on Linux (``sun_path``'s 108 bytes, NUL
#: included); multiprocessing names its forkserver's ``listener-`` and 8 characters.
_SOCKET_PATH_MAX = 107
_LISTENER_NAME = len("/listener-12345678")


def start_method(socket_dir: str) -> str:
    """How a local cluster's nannies start their servers: forked by multiprocessing's
    forkserver, which imported Dask once, where its socket fits in ``socket_dir``;
    else spawned. A spawned server spent about 1.1 of its first 1.2 CPU-seconds
    importing distributed again, n times for n servers (docs/development.md); a
    pilot starts one server, spawned."""
    if len(socket_dir) + _LISTENER_NAME <= _SOCKET_PATH_MAX:
        return "forkserver"
    return "spawn"


def warm_zygotes(servers: int, cpu_count: int) -> bool:
    """Whether a persistent cluster's servers start their zygotes (:mod:`..server.zygote`)
    with them, or each at its first plain job. A zygote's start is a fresh interpreter
    importing Snakemake: 0.75 CPU-seconds and 90 MB RSS each, measured on 2 cores.
    128 of them at once held both cores for over a minute, and the scheduler's one loop,
    starved, answered the servers' TLS handshakes too late: connections timed out at
    Dask's 30 s and heartbeats at its 20 s, servers restarted, and ``up --servers 64``
    took 146 s (``--timeout`` is 120 s). With at most 4 per core they take about 3 s of
    every core, after the start."""
    return servers <= 4 * max(1, cpu_count)


#: Seconds a local cluster's start takes per server, with a margin: 128 servers (CPU,
#: no zygotes) started in 5.9-9.5 s on 2 cores shared with another user's tests (load
#: 14-22), about 0.06 s each, all in the cluster process's one loop (its scheduler and
#: nannies); 0.5 s is 8 times that.
START_SECONDS_PER_SERVER = 0.5


def connect_timeout(servers: int) -> float:
    """Dask's ``distributed.comm.timeouts.connect`` for a cluster of ``servers``: Dask's
    30 s, or more for many servers. Dask gives a connection's first attempt a fifth of
    it; that fifth covers the whole start's queue of handshakes in the scheduler's loop
    (0.1 s a server, against the 0.06 s measured)."""
    return max(30.0, START_SECONDS_PER_SERVER * servers)


def start_wait(servers: int | None, timeout: float) -> float:
    """How long a cluster of ``servers`` (None: the default count, at most 4) is waited
    for: ``timeout``, or longer where that is too short for that many servers."""
    return max(timeout, 60.0 + START_SECONDS_PER_SERVER * (servers or 4))


@dataclass(frozen=True)
class ServerPlan:
    """One server a local cluster starts."""

    name: str
    memory_bytes: int
    gpu: GpuInfo | None = None
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: The GPUs it owns (``gpu`` is the first), or the GPUs a CPU server stands in for.
    devices: int = 1
    gpus: tuple[GpuInfo, ...] = ()


def plan_servers(
    gpus: Sequence[GpuInfo],
    cpu_servers: int | None,
    total_memory: int,
    cpu_count: int,
    gpus_per_server: int = 1,
) -> list[ServerPlan]:
    """One server per ``gpus_per_server`` GPUs (pinned by UUID, in NVML's order), or
    ``cpu_servers`` CPU servers that each stand in for ``gpus_per_server`` GPUs when
    the machine has no GPU. Memory is shared out evenly."""
    k = gpus_per_server
    if gpus:
        if len(gpus) < k:
            raise ClusterError(
                f"--context-gpus-per-server {k} (up: --gpus-per-server), but this machine "
                f"has {len(gpus)} GPU(s) visible. Fix: ask for at most {len(gpus)}."
            )
        groups = [tuple(gpus[i : i + k]) for i in range(0, len(gpus) - k + 1, k)]
        share = total_memory // len(groups)
        return [
            ServerPlan(
                name=_server_name(group),
                memory_bytes=share,
                gpu=group[0],
                resources=server_resources(share, list(group)),
                env={"CUDA_VISIBLE_DEVICES": ",".join(gpu.uuid for gpu in group)},
                devices=k,
                gpus=group,
            )
            for group in groups
        ]
    count = cpu_servers if cpu_servers is not None else max(1, min(4, cpu_count))
    if count < 1:
        raise ClusterError(f"--context-servers must be at least 1, got {count}.")
    share = total_memory // count
    return [
        ServerPlan(
            name=f"cpu{index}",
            memory_bytes=share,
            resources=server_resources(share, stand_in_gpus=k),
            env={"CUDA_VISIBLE_DEVICES": ""},
            devices=k,
        )
        for index in range(count)
    ]


def _server_name(group: Sequence[GpuInfo]) -> str:
    """``gpu0`` for one GPU, ``gpu2-3`` for a server of GPUs 2 and 3."""
    if len(group) == 1:
        return group[0].server_name
    return f"{group[0].server_name}-{group[-1].index}"
