"""``snakemake-context join``: this node's servers against a running cluster.

A pilot without a batch system: run on any node that shares the scheduler file's
directory (its credentials lie beside it), it starts one server per GPU (``--servers N``
on a node without one), each under a :class:`.nannies.ContextNanny` in this process,
listening on this node's address on the route to the scheduler. Its servers are named
``<hostname>-gpu0`` (``-cpu0``), and recorded with the node's hostname and GPU models.
SIGTERM (or Ctrl-C) drains them as a pilot's walltime does: each finishes the jobs
that fit its grace and hands the rest back, then the command ends.

Node-local state stays on the node when ``$HOME`` is shared: the private root (pid
files, sockets, zygotes, Dask's scratch) is in the node's temporary directory, and so
is the model cache unless ``--model-cache`` names one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import paths
from ..errors import ClusterError, VersionSkewError
from ..settings.checks import NUMBER, Allowed, add_argument
from ..settings.shape import Shape
from ..settings.table import add_option, check_environment, server_group_labels, up_flag
from .plan import ServerPlan, plan_servers, start_wait

__all__ = ["add_join_command", "node_plans"]

logger = logging.getLogger(__name__)


def add_join_command(commands: Any, scheduler_file: Callable[[Any], None]) -> None:
    """The ``join`` subcommand of ``commands`` (argparse subparsers); ``scheduler_file``
    adds the --scheduler-file flag every subcommand shares."""
    join = commands.add_parser(
        "join",
        help="start this node's context servers against a running cluster (a pilot "
        "without a batch system; SIGTERM drains it)",
    )
    scheduler_file(join)
    add_option(join, "servers")
    add_option(join, "contexts_memory")
    Shape.add_arguments(join)
    add_option(join, "server_group")
    add_argument(
        join,
        "--timeout",
        Allowed(NUMBER, above=0, most=3600, unit="seconds"),
        default=20.0,
        help="seconds to wait for the scheduler to answer, and for the servers to start "
        "(at least 60 plus 0.5 per server)",
    )
    join.set_defaults(func=_join)


def node_plans(
    plans: list[ServerPlan], hostname: str, labels: list[str]
) -> list[tuple[ServerPlan, str]]:
    """A node's planned servers named after it (``node7-gpu0``): names are unique in
    the cluster, as the nodes' hostnames are; each with its survival group label."""
    return [
        (replace(plan, name=f"{hostname}-{plan.name}"), label)
        for plan, label in zip(plans, labels, strict=True)
    ]


def _join(args: argparse.Namespace) -> int:
    """Attach, check, start this node's servers, serve until SIGTERM, drain."""
    check_environment()
    shape = Shape.from_args(args)
    if args.servers == 0:
        raise ClusterError(
            f"{up_flag('servers')} 0: a node that joins starts at least one server. Fix: "
            f"drop {up_flag('servers')} (one per GPU, or per core up to 4), or ask for N."
        )
    from ..modelcache import MODEL_CACHE_VARIABLE

    if not shape.model_cache and not os.environ.get(MODEL_CACHE_VARIABLE):
        # ~/.cache is often shared between nodes: each node keeps its own.
        shape = replace(shape, model_cache=str(paths.private_root() / "models"))
    for note in shape.check_cache_dirs(up_flag):
        print(note)
    target, address = _attach(args)
    from distributed.comm import parse_host_port
    from distributed.comm.addressing import get_address_host

    from .network import route_address

    scheduler_host = get_address_host(address)
    _, port = parse_host_port(address.split("://", 1)[-1])
    host = route_address(scheduler_host, int(port))

    import psutil

    from ..server.nvml import discover_gpus

    plans = plan_servers(
        discover_gpus(),
        args.servers,
        psutil.virtual_memory().total,
        os.cpu_count() or 1,
        shape.gpus_per_server,
    )
    hostname = socket.gethostname()
    named = node_plans(plans, hostname, server_group_labels(args.server_group, len(plans)))
    return asyncio.run(_serve(address, host, named, shape, args, target.security))


def _attach(args: argparse.Namespace) -> tuple[Any, str]:
    """The cluster's target (its credentials) and scheduler address, checked as a run
    attaches (unreachable, wrong credentials, versions), then let go."""
    from ..server.calls import server_versions
    from .attach import resolve_target
    from .connection import ClusterConnection, _format_versions

    target = resolve_target(address=None, scheduler_file=args.scheduler_file)
    try:
        connection = ClusterConnection.attach(
            address=None, scheduler_file=args.scheduler_file, timeout=args.timeout
        )
    except ClusterError as error:
        raise ClusterError(
            f"{error} This node reaches the scheduler on its own network: the cluster "
            "listens where `snakemake-context up --interface IF` put it."
        ) from None
    try:
        mine, theirs = server_versions(), connection.client.run_on_scheduler(server_versions)
        address = str(connection.client.scheduler.address)
    finally:
        connection.client.close()
    if theirs != mine:
        raise VersionSkewError(
            "The cluster's scheduler runs other versions than this node:\n"
            f"  node:      {_format_versions(mine)}\n"
            f"  scheduler: {_format_versions(theirs)}\n"
            "Fix: install the same versions of Python, snakemake, "
            "snakemake-executor-plugin-context and distributed on both."
        )
    return target, address


async def _serve(
    address: str,
    host: str,
    named: list[tuple[ServerPlan, str]],
    shape: Shape,
    args: argparse.Namespace,
    security: Any,
) -> int:
    import dask

    from ..server.config import SERVER_DASK_CONFIG
    from ..strays.processes import become_subreaper
    from .floodguard import install_guard
    from .nannies import ContextNanny, nanny_options

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install_guard()
    scratch = str(paths.scratch_dir())
    tempfile.tempdir = str(paths.private_temporary_directory())
    dask.config.set(SERVER_DASK_CONFIG)
    # A fork of this process would carry its command line: spawned, as a pilot's are.
    dask.config.set({"distributed.worker.multiprocessing-method": "spawn"})
    dask.config.set({"temporary-directory": scratch})
    become_subreaper()  # what a server's jobs leave comes here, not to init
    nannies = [
        ContextNanny(
            address,
            **nanny_options(
                plan,
                label,
                shape=shape,
                memory_budget=args.contexts_memory,
                host=host,
                security=security,
                warm_zygote=True,
                scratch=scratch,
            ),
        )
        for plan, label in named
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    started = time.monotonic()
    wait = start_wait(len(nannies), args.timeout)
    try:
        await asyncio.wait_for(asyncio.gather(*(n.start() for n in nannies)), wait)
    except (TimeoutError, OSError) as error:
        await asyncio.gather(*(n.close(timeout=5) for n in nannies), return_exceptions=True)
        raise ClusterError(
            f"This node's servers did not start within {wait:g} s (--timeout "
            f"{args.timeout:g}, at least 60 plus 0.5 per server): {error!r}"
        ) from None
    kinds = ", ".join(f"{p.name} ({p.gpu.name if p.gpu else 'CPU'})" for p, _ in named)
    print(
        f"{socket.gethostname()} joined {address} from {host} with {len(named)} server(s): "
        f"{kinds} [{time.monotonic() - started:.1f} s]. SIGTERM drains them.",
        flush=True,
    )
    await stop.wait()
    print(f"{socket.gethostname()}: draining {len(nannies)} server(s)", flush=True)
    await _drain(nannies)
    print(f"{socket.gethostname()}: left the cluster", flush=True)
    return 0


async def _drain(nannies: list[Any]) -> None:
    """SIGTERM each server (it drains: :meth:`..server.server.ContextServer.leave`),
    wait for it to end, then close its nanny; one that outlives its grace is killed by
    the nanny's close."""
    from ..defaults import DRAIN_GRACE_SECONDS

    for nanny in nannies:
        nanny.close_gracefully("snakemake-context join: SIGTERM")  # not restarted
        if nanny.pid:
            try:
                os.kill(nanny.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + DRAIN_GRACE_SECONDS + 10
    while time.monotonic() < deadline and any(_alive(n) for n in nannies):
        await asyncio.sleep(0.2)
    await asyncio.gather(*(n.close(timeout=5) for n in nannies), return_exceptions=True)


def _alive(nanny: Any) -> bool:
    process = getattr(nanny, "process", None)
    return bool(process is not None and process.is_alive())
