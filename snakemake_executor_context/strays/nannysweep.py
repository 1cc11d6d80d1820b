"""What a server that died left running, ended by the process above it: the cluster's
process for the servers it hosts (:class:`..cluster.nannies.ContextNanny`), a pilot's
nanny for its server (:func:`dask_setup`, preloaded with ``--preload-nanny``).

A server killed by SIGKILL takes its reaper role with it (:mod:`.jobsweep`): its
jobs' detached processes, its zygote, what its jobs kept on purpose. The process
above it is a child subreaper too, so they are reparented there, and its nanny ends
them when it sees the server's exit, before it starts a new one: every child of that
process that carries the server's mark (set by the nanny in the server's environment,
inherited by everything it execs), or is a copy of the server forked without an exec,
with everything below them (:func:`..strays.processes.server_orphans`), never the other
servers' processes. What was ended is named in the log of the cluster (or pilot).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from typing import Any

from ..defaults import LEFTOVER_GRACE_SECONDS, SERVER_MARK_VARIABLE
from .decisions import ProcessFacts, describe, server_orphans
from .processes import become_subreaper, end_leftovers, facts_of, read_processes
from .processgroups import GroupRecord, server_mark

__all__ = ["ServerWatch", "dask_setup"]

logger = logging.getLogger(__name__)


class ServerWatch:
    """One nanny's server, as the process above it knows it."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: The mark in the environment of everything the server starts.
        self.mark = server_mark(os.getpid(), name)
        #: The server's process, while it runs (its command and start).
        self.server: ProcessFacts | None = None

    def started(self, pid: int | None) -> None:
        """The nanny started its server's process."""
        self.server = facts_of(pid) if pid else None

    def end_orphans(self) -> list[ProcessFacts]:
        """The server's process ended: end what it left (a few rounds, for what an
        orphan starts as it ends); returns them."""
        ended: list[ProcessFacts] = []
        for _ in range(3):
            # This process's own children: the other servers (multiprocessing's own
            # list: active_children() would reap, and take a worker's exit code from
            # the nanny that waits for it).
            own = {p.pid for p in getattr(multiprocessing.process, "_children", ()) if p.pid}
            facts = read_processes(os.getpid())
            found = server_orphans(facts, os.getpid(), self.mark, self.server, own)
            if not found.end:
                break
            ended += end_leftovers(found.end, LEFTOVER_GRACE_SECONDS)
        if ended:
            logger.warning(
                "server %s: ended %d process(es) it left running: %s",
                self.name,
                len(ended),
                describe(ended),
            )
        return ended


async def dask_setup(nanny: Any) -> None:
    """A pilot's nanny (``--preload-nanny``): a subreaper that marks its server and,
    when the server's process exits, kills its plain jobs' process groups and ends
    what it left, before the nanny starts a new one."""
    become_subreaper()
    watch = ServerWatch(str(nanny.name))
    nanny.env[SERVER_MARK_VARIABLE] = watch.mark
    instantiate, on_worker_exit = nanny.instantiate, nanny._on_worker_exit

    async def instantiate_watched() -> Any:
        status = await instantiate()
        watch.started(nanny.pid)
        return status

    async def on_exit(exitcode: Any) -> None:
        record = GroupRecord(os.getpid(), watch.name)
        killed = record.kill_all()
        if killed:
            logger.warning("server %s: killed its jobs' process groups %s", watch.name, killed)
        await asyncio.to_thread(watch.end_orphans)
        await on_worker_exit(exitcode)

    # Dask's Nanny has no hook for its worker's exit: its own method, wrapped.
    nanny.instantiate = instantiate_watched
    nanny._on_worker_exit = on_exit
