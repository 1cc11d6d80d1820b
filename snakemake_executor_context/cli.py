"""``snakemake-context``: start, stop and inspect a persistent local context cluster.

::

    snakemake-context up     [--scheduler-file F] [--servers N] [--contexts-memory B]
                             [--idle-timeout S] [--catalog PATH|URL|none]
    snakemake-context join   [--scheduler-file F] [--servers N] [--contexts-memory B]
    snakemake-context down   [--scheduler-file F]
    snakemake-context status [--scheduler-file F] [--catalog PATH|URL] [--json]
    snakemake-context monitor [--catalog PATH|URL] [--interval S]
    snakemake-context story JOB|OUTPUT [--run RUN] [--catalog PATH|URL]
    snakemake-context upgrade [--catalog PATH|URL]
    snakemake-context report [--run ID | --since T | --compare RUN RUN] [-o FILE]
    snakemake-context simulate [-s Snakefile] --gpus a10:10 [--preempt 1/min] [--catalog C]

A run attaches with ``snakemake --executor context --context-scheduler-file F``; the
servers keep their contexts loaded between runs, and the cluster records into its
catalog (``F`` with the suffix ``.db`` unless ``--catalog`` says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .defaults import (
    DEFAULT_CATALOG,
    DEFAULT_SCHEDULER_FILE,
)
from .errors import ContextExecutorError

if TYPE_CHECKING:
    from .server.inventory import ServerInventory

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``snakemake-context`` command."""
    from .settings.checks import check_parsed

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        check_parsed(args)
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

    from .cluster.upcommand import add_up_command
    from .settings.checks import NUMBER, WHOLE, Allowed, add_argument

    add_up_command(commands, scheduler_file)
    from .cluster.join import add_join_command

    add_join_command(commands, scheduler_file)

    from .cluster.inject import add_parser as add_inject

    add_inject(commands)
    from .simulate.simcommand import add_parser as add_simulate

    add_simulate(commands)

    def catalog_option(sub: argparse.ArgumentParser) -> None:
        scheduler_file(sub)
        sub.add_argument(
            "--catalog",
            default=None,
            help="a catalog path or SQLAlchemy URL (default: .snakemake/context/catalog.db "
            "here, else the scheduler file's .db)",
        )

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
    add_argument(
        status,
        "--limit",
        Allowed(WHOLE, least=1, most=100_000),
        default=10,
        help="runs, losses and jobs to show",
    )
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
    add_argument(
        monitor,
        "--interval",
        Allowed(NUMBER, least=0.1, most=3600, unit="seconds"),
        default=1.0,
        help="seconds between reads of the catalog",
    )
    monitor.set_defaults(func=_monitor)

    story = commands.add_parser(
        "story",
        help="what happened to one job: where it was placed and why, its attempts and "
        "their logs, losses and the budget each was charged to, its report",
    )
    story.add_argument(
        "job",
        metavar="JOB|OUTPUT",
        help="a job id, an attempt key, a rule with wildcards ('score(shard=3)'), or the "
        "path of one of the job's output files (relative to this directory, or absolute)",
    )
    story.add_argument(
        "--run",
        default=None,
        help="the run's id (default: the latest run; for an output's path, the newest "
        "run that has it)",
    )
    catalog_option(story)
    story.set_defaults(func=_story)

    upgrade = commands.add_parser(
        "upgrade", help="bring a catalog written by an older release to this one's schema"
    )
    catalog_option(upgrade)
    upgrade.set_defaults(func=_upgrade)
    from .report.reportcommand import add_parser as add_report

    add_report(commands, catalog_option, lambda args: _catalog_of(args)[0])
    return parser


def _catalog_of(args: argparse.Namespace) -> tuple[str, str]:
    """The catalog a command reads and whose it is (:func:`_catalog_choice`); a
    one-line error when there is none."""
    found, whose = _catalog_choice(args)
    if found is None:
        raise ContextExecutorError(
            f"No catalog at {DEFAULT_CATALOG.absolute()} nor beside {args.scheduler_file}. "
            "Fix: run this in the workflow's directory, or name one (--catalog PATH|URL)."
        )
    return found, whose


def _catalog_choice(args: argparse.Namespace, running: str | None = None) -> tuple[str | None, str]:
    """The catalog status, story and monitor read, and whose it is: --catalog; else
    the running cluster's (``running``: the one it named when asked, else its record's);
    else this directory's; else the one a stopped cluster left beside its scheduler
    file. (None, '') when there is none."""
    from .cluster.infofiles import ClusterFiles

    if args.catalog:
        return str(args.catalog), "named by --catalog"
    files = ClusterFiles(Path(args.scheduler_file))
    if running is None:
        try:
            info = files.read_info()
            running = info.catalog if info and files.running_pid() is not None else None
        except ContextExecutorError:  # a record that is not this user's names nothing
            running = None
    if running:
        return running, "the running cluster's"
    here = DEFAULT_CATALOG.absolute()
    if here.exists():
        return str(here), "this directory's"
    if files.catalog_file.exists():
        return str(files.catalog_file), f"a stopped cluster's, beside {args.scheduler_file}"
    return None, ""


def _story(args: argparse.Namespace) -> int:
    from .catalog.reading.stories import JobNotFound, find_job, job_story, story_text
    from .catalog.store import open_reader

    catalog, whose = _catalog_of(args)
    reader = open_reader(catalog)
    try:
        with reader.session() as session:
            run, job = find_job(session, args.job, args.run, cwd=os.getcwd())
            print(story_text(run, job, job_story(session, job)))
    except JobNotFound as error:
        raise JobNotFound(
            f"{error} Catalog: {catalog} ({whose}); --catalog PATH reads another."
        ) from None
    finally:
        reader.close()
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from .catalog.store import resolve_location
    from .catalog.writing.writer import open_writer

    catalog = _catalog_of(args)[0]
    location = resolve_location(catalog)
    existing = location.snapshot or location.path  # None: a database server's URL
    if existing is not None and not existing.exists():
        raise ContextExecutorError(
            f"No catalog at {existing}: nothing to upgrade (upgrade never starts a new "
            "one). Fix: name an existing catalog (--catalog PATH|URL)."
        )
    writer = open_writer(
        catalog, owner=f"upgrade-{os.getpid()}", warn=print, say=print, fallback=False
    )
    writer.close()
    print(f"The catalog {catalog} is at this release's schema.")
    return 0


def _monitor(args: argparse.Namespace) -> int:

    catalog = _catalog_choice(args)[0] or str(DEFAULT_CATALOG.absolute())
    try:
        from snakemake_context_monitor import run
    except ImportError as error:
        raise ContextExecutorError(
            f"The monitor is not installed ({error}). Fix: pip install "
            "snakemake-executor-plugin-context (it ships snakemake_context_monitor)."
        ) from error
    run(catalog, interval=args.interval)
    return 0


def _down(args: argparse.Namespace) -> int:
    from .cluster.infofiles import ClusterFiles
    from .cluster.process import LocalClusterProcess

    local = LocalClusterProcess.find_to_stop(args.scheduler_file)
    info = ClusterFiles(args.scheduler_file.resolve()).read_info()
    if local is None:
        stale = LocalClusterProcess.remove_stale(args.scheduler_file)
        note = " (removed the stale scheduler and pid files; signalled nothing)" if stale else ""
        print(f"No context cluster runs for {args.scheduler_file}{note}.")
    else:
        local.stop()
        print(f"Context cluster stopped (log: {local.files.log_file}).")
    if info is not None and info.catalog:
        from .catalog.writing.lease import let_go_of_dead

        let_go_of_dead(info.catalog, info.pid)  # its process killed, or gone before
    return 0


def _status(args: argparse.Namespace) -> int:
    from .cluster.infofiles import ClusterFiles

    inventories, running, pool = _live(args.scheduler_file)
    catalog, whose = _catalog_choice(args, running)
    report: dict[str, Any] = {}
    if catalog is not None:
        from .catalog.reading.status import overview
        from .catalog.store import open_reader

        reader = open_reader(catalog)
        try:
            with reader.session() as session:
                report = overview(session, limit=args.limit)
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
                {
                    "servers": {a: inv.to_wire() for a, inv in (inventories or {}).items()},
                    "pool": pool,
                    "catalog": catalog,
                    "catalog_of": whose,
                    **report,
                },
                indent=1,
                default=str,
            )
        )
        return 0
    from .terminal import format_bytes, shown, shown_values

    # Names and paths the cluster reports may quote a workflow's values: shown escaped.
    pool = shown_values(pool)
    if catalog is not None:
        print(f"Catalog: {shown(catalog)} ({shown(whose)})")
    if inventories is not None:
        from .server.inventory import ServerInventory

        inventories = {
            shown(address): ServerInventory.from_wire(shown_values(inv.to_wire()))
            for address, inv in inventories.items()
        }
        print(f"{len(inventories)} server(s) running at {shown(args.scheduler_file)}:")
        names = {inv.server.name for inv in inventories.values()}
        if short := ClusterFiles(Path(args.scheduler_file)).shortfall(names):
            print(f"  WARNING: {short}")
        if pool:  # pilots of a batch system
            from .fleet.pilotbook import PoolBooks

            books = PoolBooks.from_wire(pool)
            if books is not None:
                print("  " + books.describe())
        for line in _slot_lines(inventories):
            print("  " + line)
        # Each server's expected life left, from the catalog's lives (none: no catalog).
        life = {row["address"]: row["text"] for row in shown_values(report.get("lives", []))}
        for address, inventory in sorted(inventories.items()):
            left = f"; life left {life[address]}" if address in life else ""
            print("  " + _describe(address, inventory) + left)
            limits = inventory.slots.limits
            for context in inventory.contexts:
                at_once = limits.get(context.identity)
                print(
                    f"      {'/'.join(context.names)}: {format_bytes(context.bytes)}, "
                    f"loaded in {context.load_seconds:.1f} s, {context.hits} reuse(s)"
                    + (f", up to {at_once} job(s) at once" if at_once else "")
                )
    if report:
        from .catalog.reading.overview import format_overview

        print(format_overview(str(catalog), report))
    return 0


def _live(
    scheduler_file: Path,
) -> tuple[dict[str, ServerInventory] | None, str | None, Any]:
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


def _slot_lines(inventories: dict[str, ServerInventory]) -> list[str]:
    """Busy and free slots per GPU model ("the shape": servers x slots)."""
    by_model: dict[str, list[int]] = {}
    for inventory in inventories.values():
        gpu = inventory.gpu
        row = by_model.setdefault(gpu.name if gpu else "CPU", [0, 0, 0])
        row[0] += 1
        row[1] += inventory.slots.slots
        row[2] += len(inventory.slots.running)
    return [
        f"{model}: {servers} server(s) x {total // max(1, servers)} slot(s): {busy} busy, "
        f"{max(0, total - busy)} free"
        for model, (servers, total, busy) in sorted(by_model.items())
    ]


def _describe(address: str, inventory: ServerInventory) -> str:
    server, slots, counts = inventory.server, inventory.slots, inventory.counts
    kind = inventory.gpu.name if inventory.gpu else "CPU"
    busy = len(slots.running)
    return (
        f"{server.name} {address} ({kind}, pid {server.pid}): "
        f"{busy}/{slots.slots} slot(s) busy, {len(slots.waiting)} "
        f"waiting; {counts.jobs} job(s), "
        f"{counts.loads} load(s), {counts.evictions} eviction(s), "
        f"{len(inventory.contexts)} context(s) loaded"
    )


if __name__ == "__main__":
    sys.exit(main())
