"""``snakemake-context``: start, stop and inspect a persistent local context cluster.

::

    snakemake-context up     [--scheduler-file F] [--servers N] [--memory-budget B]
                             [--idle-timeout S] [--catalog PATH|URL|none]
    snakemake-context down   [--scheduler-file F]
    snakemake-context status [--scheduler-file F] [--catalog PATH|URL] [--json]
    snakemake-context monitor [--catalog PATH|URL] [--interval S]

A run attaches with ``snakemake --executor context --context-scheduler-file F``; the
servers keep their contexts loaded between runs, and the cluster records into its
catalog (``F`` with the suffix ``.db`` unless ``--catalog`` says otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .defaults import (
    DEFAULT_CATALOG,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_SCHEDULER_FILE,
    catalog_disabled,
)
from .errors import ContextExecutorError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``snakemake-context`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ContextExecutorError as error:
        print(f"snakemake-context: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snakemake-context",
        description="Persistent context servers for `snakemake --executor context`.",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def scheduler_file(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--scheduler-file",
            type=Path,
            default=DEFAULT_SCHEDULER_FILE,
            help=f"The cluster's scheduler file; its log and pid file lie beside it "
            f"(default: {DEFAULT_SCHEDULER_FILE}, or $SNAKEMAKE_CONTEXT_SCHEDULER_FILE).",
        )

    up = commands.add_parser("up", help="start a persistent local cluster of context servers")
    scheduler_file(up)
    up.add_argument(
        "--servers",
        type=int,
        default=None,
        help="CPU servers when there is no GPU (default: CPU cores, at most 4); "
        "with GPUs, one server per GPU",
    )
    up.add_argument(
        "--memory-budget",
        default=DEFAULT_MEMORY_BUDGET,
        help="memory a server may fill with contexts: a fraction or a size",
    )
    up.add_argument(
        "--idle-timeout",
        type=float,
        default=3600.0,
        help="seconds without tasks after which the cluster stops itself (0: never)",
    )
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the servers to start"
    )
    up.add_argument(
        "--catalog",
        default=None,
        help="where the cluster records servers, contexts and jobs: a path, an SQLAlchemy "
        "URL, or 'none' (default: the scheduler file with the suffix .db)",
    )
    from .cluster.pilot_args import add_pilot_arguments
    from .cluster.triples import Shape

    Shape.add_arguments(up)
    add_pilot_arguments(up)
    up.set_defaults(func=_up)

    from .cluster.inject import add_parser as add_inject

    add_inject(commands)

    down = commands.add_parser("down", help="stop a persistent local cluster")
    scheduler_file(down)
    down.set_defaults(func=_down)

    status = commands.add_parser(
        "status",
        help="the fleet by GPU model, contexts and where they are warm, runs, losses, jobs",
    )
    scheduler_file(status)
    status.add_argument(
        "--catalog",
        default=None,
        help="the catalog to read (default: the running cluster's, else the scheduler "
        "file's .db, else .snakemake/context/catalog.db here)",
    )
    status.add_argument("--limit", type=int, default=10, help="runs, losses and jobs to show")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)

    monitor = commands.add_parser(
        "monitor",
        help="a live terminal view of a catalog: fleet, contexts, losses, throughput, progress",
    )
    scheduler_file(monitor)
    monitor.add_argument(
        "--catalog",
        default=None,
        help="a catalog path or SQLAlchemy URL (default: .snakemake/context/catalog.db "
        "here, else the scheduler file's .db)",
    )
    monitor.add_argument(
        "--interval", type=float, default=1.0, help="seconds between reads of the catalog"
    )
    monitor.set_defaults(func=_monitor)
    return parser


def _monitor(args: argparse.Namespace) -> int:

    catalog = args.catalog
    if catalog is None:
        here = DEFAULT_CATALOG.absolute()
        catalog = str(here) if here.exists() else _default_catalog(args.scheduler_file)
        catalog = catalog or str(here)
    try:
        from snakemake_context_monitor import run
    except ImportError as error:
        raise ContextExecutorError(
            f"The monitor is not installed ({error}). Fix: pip install "
            "snakemake-executor-plugin-context (it ships snakemake_context_monitor)."
        ) from error
    run(catalog, interval=args.interval)
    return 0


def _up(args: argparse.Namespace) -> int:
    from .cluster.pilot_args import pilot_command_args
    from .cluster.plan import check_memory_budget, check_servers
    from .cluster.process import LocalClusterProcess
    from .cluster.triples import Shape

    check_servers(args.servers, "--servers")
    check_memory_budget(args.memory_budget, "--memory-budget")
    shape = Shape.from_args(args).check("--")

    running = LocalClusterProcess.find(args.scheduler_file)
    if running is not None:
        info = running.files.read_info() or {}
        print(
            f"A context cluster already runs at {info.get('address')} "
            f"(scheduler file {running.files.scheduler_file})."
        )
        return 0
    from .cluster.credentials import private_file
    from .cluster.files import ClusterFiles

    catalog = args.catalog or str(ClusterFiles(args.scheduler_file.resolve()).catalog_file)
    if catalog_disabled(catalog):
        catalog = None
    else:
        from .catalog.store import open_store

        if "://" not in catalog:  # a path: the cluster's catalog is private (0600)
            private_file(Path(catalog).expanduser().absolute())

        open_store(catalog).close()  # a schema mismatch or unwritable path stops here
    started = time.monotonic()
    local = LocalClusterProcess.start(
        args.scheduler_file,
        servers=args.servers,
        memory_budget=args.memory_budget,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
        catalog=catalog,
        extra_args=[*shape.serve_args(), *pilot_command_args(args)],
        own_directory=args.scheduler_file.resolve() == DEFAULT_SCHEDULER_FILE.resolve(),
    )
    info = local.files.read_info() or {}
    servers = info.get("servers", [])
    kinds = ", ".join(
        (s["gpu"]["name"] if s.get("gpu") else "CPU") + f" ({s['name']})" for s in servers
    )
    print(
        f"Context cluster up at {info.get('address')} with {len(servers)} server(s): {kinds} "
        f"[{time.monotonic() - started:.1f} s]\n"
        f"  scheduler file: {local.files.scheduler_file}\n"
        f"  log:            {local.files.log_file}\n"
        f"  catalog:        {catalog or 'none'}\n"
        f"Attach with: snakemake --executor context --context-scheduler-file "
        f"{local.files.scheduler_file}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    from .cluster.process import LocalClusterProcess

    local = LocalClusterProcess.find(args.scheduler_file)
    if local is None:
        stale = LocalClusterProcess.remove_stale(args.scheduler_file)
        note = " (removed the stale scheduler and pid files; signalled nothing)" if stale else ""
        print(f"No context cluster runs for {args.scheduler_file}{note}.")
        return 0
    local.stop()
    print(f"Context cluster stopped (log: {local.files.log_file}).")
    return 0


def _status(args: argparse.Namespace) -> int:
    from .cluster.files import ClusterFiles

    inventories, catalog, pool = _live(args.scheduler_file)
    catalog = args.catalog or catalog or _default_catalog(args.scheduler_file)
    report: dict[str, Any] = {}
    if catalog is not None:
        from .catalog import queries
        from .catalog.store import open_reader

        reader = open_reader(catalog)
        try:
            with reader.session() as session:
                report = queries.overview(session, limit=args.limit)
        finally:
            reader.close()
    if inventories is None and catalog is None:
        raise ContextExecutorError(
            f"No context cluster runs for {args.scheduler_file}, and no catalog was found. "
            "Fix: start one (snakemake-context up), or name a catalog (--catalog PATH)."
        )
    if args.json:
        print(
            json.dumps(
                {"servers": inventories or {}, "pool": pool, "catalog": catalog, **report},
                indent=1,
                default=str,
            )
        )
        return 0
    if inventories is not None:
        print(f"{len(inventories)} server(s) running at {args.scheduler_file}:")
        names = {inv["server"]["name"] for inv in inventories.values()}
        if short := ClusterFiles(Path(args.scheduler_file)).shortfall(names):
            print(f"  WARNING: {short}")
        if pool:  # pilots of a batch system
            from .fleet.pilotbook import describe_pool

            print("  " + describe_pool(pool))
        for line in _slot_lines(inventories):
            print("  " + line)
        for address, inventory in sorted(inventories.items()):
            print("  " + _describe(address, inventory))
            limits = inventory.get("slots", {}).get("limits", {})
            for context in inventory["contexts"]:
                at_once = limits.get(context["identity"])
                print(
                    f"      {'/'.join(context['names'])}: {context['bytes'] / 1e6:.0f} MB, "
                    f"loaded in {context['load_seconds']:.1f} s, {context['hits']} reuse(s)"
                    + (f", up to {at_once} job(s) at once" if at_once else "")
                )
    if report:
        from .catalog.overview_text import format_overview

        print(format_overview(str(catalog), report))
    return 0


def _live(scheduler_file: Path) -> tuple[dict[str, Any] | None, str | None, Any]:
    """The running cluster's inventories, the catalog it writes and its pool's books
    (None each when no cluster runs)."""
    from .cluster.connection import ClusterConnection

    if not Path(scheduler_file).exists():
        return None, None, None
    try:
        connection = ClusterConnection.attach(
            address=None, scheduler_file=scheduler_file, timeout=10
        )
    except ContextExecutorError as error:
        print(f"snakemake-context: {error}", file=sys.stderr)
        return None, None, None
    try:
        inventories = connection.inventories()
        pool = connection.client.get_metadata(["snakemake-context", "pool"], default=None)
        catalog = None
        try:
            from .cluster.hub import fleet_snapshot

            snapshot = connection.client.run_on_scheduler(fleet_snapshot)
            catalog = ((snapshot or {}).get("catalog") or {}).get("requested")
        except Exception as error:  # a hub of another version: no catalog to name
            print(f"snakemake-context: the cluster names no catalog ({error!r})", file=sys.stderr)
    finally:
        connection.client.close()
    return inventories, catalog, pool


def _default_catalog(scheduler_file: Path) -> str | None:
    from .cluster.files import ClusterFiles

    for candidate in (ClusterFiles(Path(scheduler_file)).catalog_file, DEFAULT_CATALOG.absolute()):
        if candidate.exists():
            return str(candidate)
    return None


def _slot_lines(inventories: dict[str, Any]) -> list[str]:
    """Busy and free slots per GPU model ("the shape": servers x slots)."""
    by_model: dict[str, list[int]] = {}
    for inventory in inventories.values():
        gpu = inventory.get("gpu")
        slots = inventory.get("slots", {})
        row = by_model.setdefault(gpu["name"] if gpu else "CPU", [0, 0, 0])
        row[0] += 1
        row[1] += int(slots.get("slots", 1))
        row[2] += len(slots.get("running", inventory.get("running", ())))
    return [
        f"{model}: {servers} server(s) x {total // max(1, servers)} slot(s): {busy} busy, "
        f"{max(0, total - busy)} free"
        for model, (servers, total, busy) in sorted(by_model.items())
    ]


def _describe(address: str, inventory: dict[str, Any]) -> str:
    server = inventory["server"]
    gpu = inventory.get("gpu")
    kind = gpu["name"] if gpu else "CPU"
    slots = inventory.get("slots", {})
    busy = len(slots.get("running", inventory.get("running", ())))
    return (
        f"{server['name']} {address} ({kind}, pid {server['pid']}): "
        f"{busy}/{slots.get('slots', 1)} slot(s) busy, {len(slots.get('waiting', ()))} "
        f"waiting; {inventory['jobs']} job(s), "
        f"{inventory['loads']} load(s), {inventory['evictions']} eviction(s), "
        f"{len(inventory['contexts'])} context(s) loaded"
    )


if __name__ == "__main__":
    sys.exit(main())
