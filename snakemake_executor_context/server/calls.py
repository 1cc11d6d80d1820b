"""The functions the executor runs on servers through Dask.

Dask pickles a function by its module and name, so the executor's process imports
this module only: what the functions need on the server (the server, its cache, its
jobs) is imported when they run there, where it is loaded already. Importing the
server's modules in Snakemake's process cost every run 0.05 CPU-s.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from ..contexts import ContextDeclaration
    from ..jobspec import ContextJobSpec, GroupJobSpec, JobResult, PlainJobSpec

__all__ = ["cancel_jobs", "execute_job", "probe_caches", "server_inventory", "server_versions"]


def execute_job(spec: ContextJobSpec | PlainJobSpec | GroupJobSpec) -> JobResult:
    """Run a job (or a group of them) on the server of the worker this task landed on."""
    from .server import ContextServer

    return ContextServer.current().jobs.run_bounded(spec)


async def cancel_jobs(keys: list[str], grace: float = 10.0) -> dict[str, str]:
    """Stop the named jobs on this server (run on every worker by the executor).

    A coroutine, so that waiting for the jobs to stop does not block the worker's
    event loop (heartbeats, the job's own completion message).
    """
    import asyncio

    from .server import ContextServer

    return await asyncio.to_thread(ContextServer.current().jobs.cancel, keys, grace)


def probe_caches(declarations: list[ContextDeclaration]) -> list[str]:
    """The identities whose weights this server's local disk holds (cache probes).
    What the probes import from the workflow is forgotten afterwards: the context's
    load imports it again, and then it lives as long as the context."""
    from .cache import probe
    from .isolation import forget_modules_since
    from .server import ContextServer

    before = set(sys.modules)
    try:
        return [d.identity for d in declarations if probe(d)]
    finally:
        server = ContextServer._current
        if server is None or not server.jobs.running():
            forget_modules_since(before)  # not under a running job's imports


def server_inventory() -> dict[str, Any]:
    """This server's inventory (:meth:`~.inventory.ServerInventory.to_wire`)."""
    from .server import ContextServer

    return ContextServer.current().inventory().to_wire()


def server_versions() -> dict[str, str]:
    """The versions that must agree between the executor and its servers."""
    import distributed

    from ..snakemake_internals import snakemake_version

    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "snakemake": snakemake_version(),
        "snakemake-executor-plugin-context": __version__,
        "distributed": distributed.__version__,
    }
