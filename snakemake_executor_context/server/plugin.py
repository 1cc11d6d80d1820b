"""How a Dask worker becomes a context server (the functions the executor runs on
servers are in :mod:`.calls`)."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .. import paths
from ..defaults import (
    DEVICES_VARIABLE,
    JOB_MARK_VARIABLE,
    KEEP_VARIABLE,
    MODEL_CACHE_SIZE_VARIABLE,
    MODEL_CACHE_VARIABLE,
)
from ..errors import UnsafePathError
from ..fleet.keys import is_attempt_key, safe_name
from ..strays.processes import become_subreaper
from .config import ServerConfig
from .gangsite import start_gang_site
from .plain import warm_zygote
from .processwide import prepare_server_process
from .server import ContextServer

__all__ = ["ContextServerPlugin"]


class ContextServerPlugin(WorkerPlugin):
    """Turns a Dask worker into a context server."""

    name = "snakemake-context-server"

    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def setup(self, worker: Any) -> None:
        """Install the server; leave the terminal's Ctrl-C to the Snakemake process."""
        config = replace(self.config)
        config.name = config.name or str(worker.name)
        # What its jobs detach is reparented to it, not to init (:mod:`..strays.jobsweep`);
        # a job's mark or keep comes from the job, never from the server's start.
        become_subreaper()
        for variable in (JOB_MARK_VARIABLE, KEEP_VARIABLE):
            os.environ.pop(variable, None)
        if not config.memory_bytes:
            config.memory_bytes = int(worker.memory_manager.memory_limit or 0)
        shape = config.shape = replace(config.shape, slots=worker_slots(worker))
        if shape.own_caches:
            own = Path(shape.own_caches).expanduser().absolute()
            if problem := paths.named_dir_problem(own, make=True):
                raise UnsafePathError(f"Refusing the per-server caches {own}: it {problem}.")
            # A worker's name is the cluster's to give: a plain file name here.
            os.environ[MODEL_CACHE_VARIABLE] = str(own / safe_name(config.name))
        elif shape.model_cache:
            # As a pilot's job script made it ($USER, $TMPDIR: this node's).
            cache = os.path.expandvars(os.path.expanduser(shape.model_cache))
            os.environ[MODEL_CACHE_VARIABLE] = cache
        if shape.model_cache_bytes > 0:
            os.environ[MODEL_CACHE_SIZE_VARIABLE] = str(shape.model_cache_bytes)
        server = ContextServer.install(config, worker.address, worker)
        # What its loaders see as theirs (server_devices()), and its gangs' ranks use.
        os.environ[DEVICES_VARIABLE] = ",".join(server.devices)
        if threading.current_thread() is threading.main_thread():
            prepare_server_process()
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _drain_on_sigterm(server, config.drain_grace)
        if config.lease > 0:
            threading.Thread(
                target=_hold_lease, args=(worker, server, config.lease), daemon=True
            ).start()
        if config.warm_zygote:
            warm_zygote()
        if config.gang_nodes > 1:
            start_gang_site(worker, server, config)
        # Worker plugins are set up before the worker registers with the scheduler,
        # and events sent before that are dropped: announce once it is connected.
        worker.loop.add_callback(_announce_when_connected, worker, server)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """A job Dask cancelled while it ran (its run was cancelled, its Snakemake
        died, or the executor gave the attempt up) is stopped here, not left running."""
        # Dask's worker reports a running task it was told to forget as executing ->
        # released (its state becomes "cancelled": it cannot stop the code itself).
        ran = start in ("executing", "long-running")
        if ran and finish in ("released", "cancelled") and is_attempt_key(key):
            server = ContextServer._current
            if server is not None:
                threading.Thread(target=server.jobs.cancel, args=([key], 10.0), daemon=True).start()

    def teardown(self, worker: Any) -> None:
        """Stop running jobs before the worker goes."""
        server = ContextServer._current
        if server is not None:
            server.shutdown()


def _drain_on_sigterm(server: ContextServer, grace: float) -> None:
    """SIGTERM (a batch system's preemption notice) drains the server; called in the
    process's main thread, which alone may set a signal handler."""

    def on_term(signum: int, frame: Any) -> None:
        threading.Thread(target=server.drain, args=(grace,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)


def worker_slots(worker: Any) -> int:
    """A server's slots: the jobs its Dask worker runs at once (its threads)."""
    state = getattr(worker, "state", None)
    return max(1, int(getattr(state, "nthreads", 1) or 1))


def _hold_lease(worker: Any, server: ContextServer, lease: float) -> None:
    """A server that cannot reach its scheduler for ``lease`` seconds stops its jobs
    and kills their process groups: the executor has requeued them by then (it waits
    at least the lease after losing a server it could not confirm dead), and a late
    orphan must not overwrite the rerun's output."""
    import time

    lost_since: float | None = None
    stopped_for: float | None = None  # the unanswered silence already acted on
    while worker.status.name not in ("closed", "failed"):
        time.sleep(min(1.0, lease / 4))
        if worker.status.name in ("init", "starting"):
            lost_since = None
            continue
        # A worker of the cluster's class notes its answered heartbeats.
        heard = getattr(worker, "heard_at", None)
        if heard is not None and time.monotonic() - heard >= lease:
            if heard != stopped_for:
                server.stop_everything(
                    f"its scheduler answered no heartbeat for {lease:g} s (its lease)"
                )
                stopped_for = heard
            continue
        stream = getattr(worker, "batched_stream", None)
        connected = stream is not None and stream.comm is not None and not stream.comm.closed()
        if connected:
            lost_since = None
            continue
        lost_since = lost_since or time.monotonic()
        if time.monotonic() - lost_since >= lease:
            server.stop_everything("its lease on the scheduler ran out")
            lost_since = None


async def _announce_when_connected(worker: Any, server: ContextServer) -> None:
    import asyncio

    for _ in range(600):
        stream = getattr(worker, "batched_stream", None)
        if stream is not None and stream.comm is not None and not stream.comm.closed():
            server.announce()
            return
        await asyncio.sleep(0.05)
