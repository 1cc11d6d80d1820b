"""The cluster process: ``python -m snakemake_executor_context.cluster.serve serve``.

Runs a local cluster (a scheduler with the hub, one server per GPU or CPU servers)
until it is shut down, idle too long, or orphaned, in a session of its own (see
:mod:`.process`). Writes the files of :mod:`.infofiles`.

Dask's local directory (``local_directory``) of the scheduler and of every nanny and
server is the private root's scratch space (:func:`..paths.scratch_dir`): by default
Dask takes ``$TMPDIR/dask-scratch-space``, reuses one that exists without checking
whose it is, and the nanny (and each server it spawns) puts it first on ``sys.path``,
so a package another user planted there would run in every server. This process's
own temporary files go to the private root too.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing.util
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import paths
from ..errors import ClusterError, SettingError
from ..settings.shape import Shape
from ..settings.table import add_option, server_group_labels
from ..strays.processes import become_subreaper, process_tree, stop_processes
from .credentials import Credentials
from .info import ClusterInfo, PlannedServer
from .infofiles import ClusterFiles
from .network import interface_address
from .plan import (
    connect_timeout,
    plan_servers,
    start_method,
    warm_zygotes,
)
from .process import SERVE_MODULE

if TYPE_CHECKING:
    from .hub import FleetHub

__all__ = ["HEARTBEAT_TIMEOUT", "loss_config", "serve"]

#: Seconds without a heartbeat after which Dask restarts a server (a stopped process).
HEARTBEAT_TIMEOUT = 10.0


def loss_config(heartbeat_timeout: float) -> dict[str, Any]:
    """Dask settings for losing servers: a lost server is restarted however long its
    restart takes (Dask's SpecCluster would close it for good after 15 s), one that
    stops heartbeating is restarted, and Dask never fails a task for its servers'
    deaths (the executor's budgets decide, :mod:`..fleet.losses`)."""
    return {
        "distributed.deploy.lost-worker-timeout": "3650d",
        "distributed.scheduler.worker-ttl": f"{heartbeat_timeout}s",
        "distributed.scheduler.allowed-failures": 1000,
    }


def serve(argv: Sequence[str] | None = None) -> int:
    """Run a local cluster until it is shut down, idle too long, or orphaned."""
    parser = argparse.ArgumentParser(prog=f"python -m {SERVE_MODULE} serve")
    parser.add_argument("--scheduler-file", type=Path, required=True)
    add_option(parser, "servers")
    add_option(parser, "contexts_memory")
    add_option(parser, "server_group")
    add_option(parser, "interface")
    parser.add_argument("--idle-timeout", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--catalog", default=None)
    parser.add_argument("--run-id", default=None, help="the run whose embedded cluster this is")
    parser.add_argument("--pilots", default=None, help="PilotOptions as JSON: a batch pool")
    for name in ("min_pilots", "max_pilots", "pilot_idle_timeout"):
        add_option(parser, name)
    # Benchmarks and tests only (TLS off against on, in one run): a plaintext cluster.
    parser.add_argument("--no-tls", action="store_true")
    parser.add_argument("--heartbeat-timeout", type=float, default=HEARTBEAT_TIMEOUT)
    Shape.add_arguments(parser)
    args = parser.parse_args(argv)
    shape = Shape.from_args(args).check("--")
    # When each step of the start ended (the executor's --verbose breakdown).
    steps: dict[str, float] = {"process": time.time()}
    # `python -m` put the directory it started in first on sys.path; the servers'
    # jobs must not import from there (a job in a fresh interpreter would not).
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    # multiprocessing's own directory (mkdtemp: 0700, a name nobody could take first),
    # made before the temporary directory moves below the private root, whose path
    # may be too long for the forkserver's socket in it.
    socket_dir = multiprocessing.util.get_temp_dir()
    method = start_method(socket_dir)

    import dask
    import psutil
    from distributed import Scheduler, SpecCluster

    from ..server.config import SERVER_DASK_CONFIG
    from ..server.nvml import discover_gpus

    # Imported before the forkserver forks from this process: every server it forks
    # has its modules already (nanny_options imports it too, later).
    from ..server.plugin import ContextServerPlugin  # noqa: F401
    from .floodguard import install_guard
    from .hub import FleetHub
    from .nannies import ContextNanny, nanny_options

    if method == "forkserver" and not args.pilots:  # a pool's servers are batch jobs
        _fork_forkserver()
    steps["imports"] = time.time()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:  # this process's listeners: the scheduler's, the nannies'
        install_guard()
    except ClusterError as error:  # one line in the log its starter shows
        logging.error("%s", error)
        return 2
    scratch = str(paths.scratch_dir())
    # dask-jobqueue writes each job script under a name it reserved with mkstemp and
    # then released (dask.utils.tmpfile): in a shared /tmp another user could take it.
    tempfile.tempdir = str(paths.private_temporary_directory())
    dask.config.set(SERVER_DASK_CONFIG)
    dask.config.set({"distributed.worker.multiprocessing-method": method})
    dask.config.set(loss_config(args.heartbeat_timeout))
    dask.config.set({"temporary-directory": scratch})
    files = ClusterFiles(args.scheduler_file.resolve())
    FleetHub.exit_wait = 1.5
    ContextNanny.cluster_files = files
    files.remove()
    # Every listener requires TLS with a certificate of this cluster's own authority.
    if args.interface and not args.pilots:  # a pool's options carry their own
        try:
            args.host = interface_address(args.interface)
        except ClusterError as error:  # one line in the log its starter shows
            logging.error("%s", error)
            return 2
    security = None if args.no_tls else Credentials.generate(files.credentials.directory).security()
    steps["certificates"] = time.time()
    plans = (
        []  # a pool of pilots, or nodes that join: their servers start on their nodes
        if args.pilots or args.servers == 0
        else plan_servers(
            discover_gpus(),
            args.servers,
            psutil.virtual_memory().total,
            os.cpu_count() or 1,
            shape.gpus_per_server,
        )
    )
    # Many servers' handshakes queue in the scheduler's one loop while they start.
    dask.config.set({"distributed.comm.timeouts.connect": f"{connect_timeout(len(plans))}s"})
    # A run's embedded servers start theirs at their first plain job.
    warm = not args.parent_pid and warm_zygotes(len(plans), os.cpu_count() or 1)
    try:
        labels = server_group_labels(args.server_group, len(plans))
    except SettingError as error:  # one line in the log its starter shows
        logging.error("%s", error)
        return 2
    # The fleet's event hub; with --catalog, the catalog's one writer.
    hub = FleetHub(catalog=args.catalog, run_id=args.run_id)
    scheduler_options: dict[str, Any] = {
        # Dask always serves HTTP (metrics); a random loopback port avoids clashes.
        "host": args.host,
        "port": 0,
        "dashboard": False,
        "dashboard_address": f"{args.host}:0",
        "scheduler_file": str(files.dask_scheduler_file),
        "local_directory": scratch,
        "plugins": [hub],
        "security": security,
    }
    if args.idle_timeout > 0:
        scheduler_options["idle_timeout"] = args.idle_timeout
    workers = {
        plan.name: {
            "cls": ContextNanny,
            "options": nanny_options(
                plan,
                label,
                shape=shape,
                memory_budget=args.contexts_memory,
                host=args.host,
                security=security,
                warm_zygote=warm,
                scratch=scratch,
            ),
        }
        for plan, label in zip(plans, labels, strict=True)
    }
    if not args.pilots:
        # Its servers' orphans come here when a server dies, not to init: their
        # nannies end them (:mod:`.nannies`), and its own end ends what is left.
        become_subreaper()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    if args.pilots:
        cluster = _pilot_pool(args, scheduler_options, security)
    else:
        cluster = SpecCluster(
            workers=workers,
            scheduler={"cls": Scheduler, "options": scheduler_options},
            silence_logs=False,
            name="snakemake-context",
            security=security,
        )
    steps["scheduler and servers"] = time.time()
    files.publish_scheduler_file()
    info = ClusterInfo(
        pid=os.getpid(),
        address=cluster.scheduler_address,
        servers=tuple(
            PlannedServer(plan.name, plan.gpu, plan.devices, plan.resources) for plan in plans
        ),
        started=time.time(),
        catalog=args.catalog,
        pilots=json.loads(args.pilots) if args.pilots else None,
        tls=security is not None,
        slots=shape.slots,
        threads_per_slot=shape.threads_per_slot,
        steps=steps,
    )
    files.write_info(info)
    logging.info("context cluster up at %s with %d servers", info.address, len(plans))
    try:
        while not stop.wait(0.5):
            if cluster.scheduler is None or cluster.scheduler.status.name in ("closing", "closed"):
                logging.info("scheduler closed: stopping")
                break
            if args.parent_pid and os.getppid() != args.parent_pid:
                logging.info("the Snakemake process %d is gone: stopping", args.parent_pid)
                break
    finally:
        closing = time.time()
        logging.info(
            "closing the cluster (%s)", "asked to stop" if stop.is_set() else "its loop ended"
        )
        if stop.is_set() and args.parent_pid and not args.pilots:
            _end_with_the_run(files, closing, hub)
        try:
            cluster.close(timeout=10)
        except Exception as error:  # the scheduler closed first (idle timeout)
            logging.info("closing the cluster: %s", error)
        closed = time.time()
        _kill_children()
        files.remove()
        logging.info(
            "cluster closed in %.2f s, what was left killed in %.2f s",
            closed - closing,
            time.time() - closed,
        )
    return 0


#: What multiprocessing's forkserver holds in Python 3.11, the fields this start sets;
#: where it holds others (a later Python's), its own start is used.
_FORKSERVER_FIELDS = {
    "_forkserver_address",
    "_forkserver_alive_fd",
    "_forkserver_pid",
    "_inherited_fds",
    "_lock",
    "_preload_modules",
}


def _fork_forkserver() -> None:
    """Start the forkserver the nannies fork their servers from as a fork of this
    process, which has imported what a server needs (Dask, the server's modules) and
    started no thread yet. multiprocessing's own start runs a new interpreter that
    imports them again: 0.35 of a small run's CPU-seconds, and its wall, here. The
    child runs multiprocessing's forkserver loop, as the one it spawns would."""
    from multiprocessing import connection, forkserver, resource_tracker

    import distributed.utils

    # Dask sets its own list once per process, before its first server starts: the
    # forkserver runs already (distributed/utils.py get_mp_context).
    distributed.utils._forkserver_preload_set = True
    state: Any = forkserver._forkserver
    if set(vars(state)) != _FORKSERVER_FIELDS or state._forkserver_pid is not None:
        forkserver.set_forkserver_preload(SERVER_PRELOAD)
        forkserver.ensure_running()
        return
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        # The forkserver ends when every process holding the write end has ended.
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.close(alive_w)
                forkserver.main(listener.fileno(), alive_r, [])
            except SystemExit as done:  # it exits once this process is gone
                status = done.code if isinstance(done.code, int) else 0
            finally:
                os._exit(status)
        os.close(alive_r)
    state._forkserver_address = address
    state._forkserver_alive_fd = alive_w
    state._forkserver_pid = pid


#: What the forkserver imports where this Python's own start is used.
SERVER_PRELOAD = ["distributed", "snakemake_executor_context.server.plugin"]


def _pilot_pool(args: argparse.Namespace, scheduler_options: dict[str, Any], security: Any) -> Any:
    """A batch system's pool of pilots, scaled by the run's demand. Pilots present the
    cluster's credentials, read from beside the scheduler file: that directory must be
    on a filesystem the compute nodes share."""
    from ..fleet.poolsizing import PoolShape
    from ..pilots.jobqueue import start_pilot_cluster
    from ..pilots.pool import DemandAdaptive
    from ..pilots.request import PilotOptions

    # Its servers' shape travels inside the options, as the pilots' job scripts carry it.
    options = PilotOptions.from_json(args.pilots)
    scheduler_options.pop("host", None)
    if not options.interface:
        from distributed.utils import get_ip

        # Pilots on other nodes reach the scheduler on the default route's address.
        scheduler_options["host"] = get_ip()
    cluster = start_pilot_cluster(options, scheduler_options, security)
    shape = PoolShape(minimum=args.min_pilots, maximum=max(args.min_pilots, args.max_pilots))
    cluster.adapt(
        Adaptive=DemandAdaptive,
        shape=shape,
        idle_timeout=args.pilot_idle_timeout,
        backend=options.backend,
        kinds=options.kind_summaries(),
    )
    return cluster


def _end_with_the_run(files: ClusterFiles, closing: float, hub: FleetHub) -> None:
    """The embedded cluster of a run that ended: its results are in and its catalog
    written and closed (the run asked its hub, :func:`.hub.run_recorded`; a run that
    could not ask has what is queued written here, 2 s at most), so its servers are
    killed at once, as a lost node's would be (nothing of theirs outlives them: their
    jobs and zygotes go with them), instead of closed one by one (0.8 s for two servers
    here, more for more), and this process ends without the interpreter's teardown. The run's exit
    waits for this process: that wait is its shutdown."""
    # SIGKILL, not waited for: they are gone when the signal lands, and this process's
    # exit hands their remains to init (waiting here took 1.9 s: the nannies reap
    # and restart their workers meanwhile).
    stop_processes(process_tree(os.getpid())[:-1], grace=0)
    killed = time.time()
    hub.close_catalog(timeout=2.0)
    files.remove()
    logging.info(
        "the run's servers killed in %.2f s, the cluster gone in %.2f s",
        killed - closing,
        time.time() - closing,
    )
    logging.shutdown()
    os._exit(0)


def _kill_children() -> None:
    """Kill what is left of this process's descendants (servers, their jobs)."""
    stop_processes(process_tree(os.getpid())[:-1], grace=0, wait=5)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2:]))
    print(f"usage: python -m {SERVE_MODULE} serve --scheduler-file FILE ...", file=sys.stderr)
    sys.exit(2)
