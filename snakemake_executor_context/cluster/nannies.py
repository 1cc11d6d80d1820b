"""The nanny of every server a local cluster starts (:mod:`.serve`): Dask's
:class:`~distributed.Nanny`, plus what a lost server needs done, in the cluster's
process, before it comes back:

- its process's exit code goes to the hub (:attr:`.hub.FleetHub.exits`), which
  classifies the loss with it (a crash or a preemption, :mod:`..fleet.losses`);
- the process groups its plain jobs left are killed (:mod:`..strays.processgroups`), and
  what its jobs detached, which this process adopted as a subreaper
  (:mod:`..strays.nannysweep`);
- a restart a preemption injector holds back (a file in
  :attr:`.infofiles.ClusterFiles.hold_dir`) waits until the hold ends;
- a server that closes itself because it lost its scheduler comes back too (Dask's
  nanny would close with it for good).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

from distributed import Nanny

from .. import paths
from ..defaults import SERVER_MARK_VARIABLE
from ..errors import UnsafePathError
from ..strays.nannysweep import ServerWatch
from ..strays.processgroups import GroupRecord
from .hub import FleetHub
from .infofiles import ClusterFiles

if TYPE_CHECKING:
    from ..settings.shape import Shape
    from .plan import ServerPlan

__all__ = ["LOST_SCHEDULER", "ContextNanny", "held_until", "nanny_options"]

logger = logging.getLogger(__name__)

#: Why a Dask server closes itself when it lost its scheduler (distributed's words).
LOST_SCHEDULER = frozenset(
    {
        "worker-handle-scheduler-connection-broken",
        "worker-heartbeat-missing",
        "worker-heartbeat-error",
    }
)


def nanny_options(
    plan: ServerPlan,
    label: str,
    *,
    shape: Shape,
    memory_budget: str,
    host: str,
    security: Any,
    warm_zygote: bool,
    scratch: str,
) -> dict[str, Any]:
    """The :class:`ContextNanny` options of one planned server (its survival group
    ``label``), on this node: a local cluster's (:mod:`.serve`) and a joined node's
    (:mod:`.join`). Dask's local directory is ``scratch``, the private root's scratch
    space (:func:`..paths.scratch_dir`)."""
    from ..server.config import ServerConfig
    from ..server.plugin import ContextServerPlugin
    from .floodguard import GuardedWorker

    config = ServerConfig(
        name=plan.name,
        memory_budget=memory_budget,
        gpu=asdict(plan.gpu) if plan.gpu else None,
        devices=plan.devices,
        shape=shape,
        memory_bytes=plan.memory_bytes,
        warm_zygote=warm_zygote,
        group=label,
    )
    return {
        "name": plan.name,
        "host": host,
        "nthreads": shape.slots,
        "memory_limit": plan.memory_bytes,
        "resources": plan.resources,
        "local_directory": scratch,
        # The servers' root stays this one while a job points TMPDIR elsewhere.
        "env": {**plan.env, paths.LOCAL_DIR_VARIABLE: str(paths.local_base())},
        "silence_logs": logging.WARNING,
        "security": security,
        "worker_class": GuardedWorker,
        "plugins": (ContextServerPlugin(config),),
    }


def held_until(files: ClusterFiles | None, name: str) -> float:
    """Until when server ``name``'s restart is held back (0: not held; a hold file
    that is not this user's own holds nothing back)."""
    if files is None:
        return 0.0
    try:
        return float((paths.read_trusted(files.hold_file(name)) or b"").strip() or 0)
    except (OSError, ValueError, UnsafePathError):
        return 0.0


class ContextNanny(Nanny):
    """See the module docstring."""

    #: The cluster's files, whose hold directory it reads (set by :mod:`.serve`).
    cluster_files: ClassVar[ClusterFiles | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Its server, marked: what it leaves when it dies is ended here.
        self.watch = ServerWatch(str(self.name))
        self.env[SERVER_MARK_VARIABLE] = self.watch.mark

    async def instantiate(self) -> Any:
        """Start the server's process, and note which it is."""
        status = await super().instantiate()
        self.watch.started(self.pid)
        return status

    def close_gracefully(self, reason: str = "nanny-close-gracefully") -> None:
        """Dask's server asks its nanny not to restart it when it closes; one that
        closes because it lost its scheduler (a connection closed under it: a job
        broke it, the network did) is started again, or the cluster would wait on
        without it for good."""
        if reason in LOST_SCHEDULER:
            logger.warning("server %s lost its scheduler (%s): restarting it", self.name, reason)
            return
        super().close_gracefully(reason)

    async def _on_worker_exit(self, exitcode: Any) -> None:
        address = self.worker_address
        record = GroupRecord(os.getpid(), str(self.name))
        if address and exitcode is not None:
            FleetHub.running_at_exit[str(address)] = record.running()
            FleetHub.exits[str(address)] = int(exitcode)
        killed = record.kill_all()
        if killed:
            logger.warning("server %s: killed its jobs' process groups %s", self.name, killed)
        await asyncio.to_thread(self.watch.end_orphans)
        until = held_until(self.cluster_files, str(self.name))
        if until > time.time():
            logger.warning("server %s: restart held for %.1f s", self.name, until - time.time())
            while time.time() < until and self.status.name not in ("closing", "closed"):
                await asyncio.sleep(min(0.5, max(0.01, until - time.time())))
        await super()._on_worker_exit(exitcode)
