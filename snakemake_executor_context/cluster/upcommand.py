"""``snakemake-context up``: its flags, each declaring what it allows
(:mod:`..settings.checks`), and the command that starts a persistent local cluster."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..catalog import catalog_form
from ..defaults import DEFAULT_SCHEDULER_FILE, catalog_disabled
from ..pilots.arguments import add_pilot_arguments, walltime_line
from ..settings.checks import NUMBER, TEXT, Allowed, add_argument
from ..settings.shape import Shape
from ..settings.table import add_option, check_environment, up_flag

__all__ = ["add_up_command"]


def add_up_command(commands: Any, scheduler_file: Callable[[Any], None]) -> None:
    """The ``up`` subcommand of ``commands`` (argparse subparsers); ``scheduler_file``
    adds the --scheduler-file flag every subcommand shares."""
    up = commands.add_parser("up", help="start a persistent local cluster of context servers")
    scheduler_file(up)
    add_option(up, "servers")
    add_option(up, "contexts_memory")
    add_argument(
        up,
        "--idle-timeout",
        Allowed(NUMBER, least=0, unit="seconds", zero="never"),
        default=3600.0,
        help="seconds without tasks after which the cluster stops itself (0: never)",
    )
    add_argument(
        up,
        "--timeout",
        Allowed(NUMBER, above=0, most=3600, unit="seconds"),
        default=120.0,
        help="seconds to wait for the servers to start (at least 60 plus 0.5 per server)",
    )
    add_argument(
        up,
        "--catalog",
        Allowed(TEXT, optional=True, form=catalog_form),
        default=None,
        help="where the cluster records servers, contexts and jobs: a path, an SQLAlchemy "
        "URL, or 'none' (default: the scheduler file with the suffix .db)",
    )
    Shape.add_arguments(up)
    add_option(up, "server_group")
    add_pilot_arguments(up)

    up.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    """Start the cluster (nothing if one runs for that scheduler file already)."""
    from ..pilots.arguments import pilot_command_args
    from .process import LocalClusterProcess

    # The variables a user exports for the servers, refused as a bad flag is: before
    # anything is made or started.
    check_environment()
    shape = Shape.from_args(args)

    running = LocalClusterProcess.find(args.scheduler_file)
    if running is not None:
        info = running.files.read_info()
        print(
            f"A context cluster already runs at {info.address if info else '?'} "
            f"(scheduler file {running.files.scheduler_file})."
        )
        return 0
    if not args.backend:  # the servers start on this node (pilots make theirs on theirs)
        for note in shape.check_cache_dirs(up_flag):
            print(note)
        if args.interface:
            from .network import interface_address

            interface_address(args.interface)  # one that is not here: one line, now
    from .credentials import private_file
    from .infofiles import ClusterFiles

    catalog = args.catalog or str(ClusterFiles(args.scheduler_file.resolve()).catalog_file)
    made: list[Path] = []  # the catalog's files this command makes
    if catalog_disabled(catalog):
        catalog = None
    else:
        from ..catalog.store import open_store, resolve_location

        where = resolve_location(catalog)
        made = [p for p in (where.path, where.snapshot) if p and not os.path.lexists(p)]
        try:
            if "://" not in catalog:  # a path: the cluster's catalog is private (0600)
                fix = "remove it, or choose another --catalog."
                private_file(Path(catalog).expanduser().absolute(), fix=fix)
            open_store(catalog).close()  # a schema mismatch or unwritable path stops here
        except BaseException:
            _remove_catalog(made)
            raise
    started = time.monotonic()
    try:
        local = LocalClusterProcess.start(
            args.scheduler_file,
            servers=args.servers,
            memory_budget=args.contexts_memory,
            timeout=args.timeout,
            idle_timeout=args.idle_timeout,
            catalog=catalog,
            extra_args=[
                *shape.serve_args(),
                *[up_flag("server_group"), args.server_group],
                *pilot_command_args(args),
                # A pool's scheduler listens as its options say; this one's, here.
                *(
                    [up_flag("interface"), args.interface]
                    if args.interface and not args.backend
                    else []
                ),
            ],
            own_directory=args.scheduler_file.resolve() == DEFAULT_SCHEDULER_FILE.resolve(),
            timeout_setting="--timeout",
        )
    except BaseException:  # refused, or the cluster did not start: no catalog of its own
        _remove_catalog(made)
        raise
    if args.backend:
        walltime, margin = args.pilot_walltime, args.pilot_retire_margin
        print(walltime_line(args.backend, walltime, margin, up_flag("pilot_walltime")))
    info = local.files.read_info()
    servers = info.servers if info else ()
    kinds = ", ".join((s.gpu.name if s.gpu else "CPU") + f" ({s.name})" for s in servers)
    print(
        f"Context cluster up at {info.address if info else '?'} with {len(servers)} "
        f"server(s): {kinds} "
        f"[{time.monotonic() - started:.1f} s]\n"
        f"  scheduler file: {local.files.scheduler_file}\n"
        f"  log:            {local.files.log_file}\n"
        f"  catalog:        {catalog or 'none'}\n"
        f"Attach with: snakemake --executor context --context-scheduler-file "
        f"{local.files.scheduler_file}"
    )
    if not args.backend:
        reach = (
            ""
            if args.interface
            else " (this node only: it listens on the loopback; --interface IF for others)"
        )
        print(
            "Nodes join with: snakemake-context join --scheduler-file "
            f"{local.files.scheduler_file}{reach}"
        )
    return 0


def _remove_catalog(made: list[Path]) -> None:
    """Remove the catalog files a refused ``up`` made (and SQLite's and the writer's
    files beside them): one that existed before stays as it was."""
    from .. import paths
    from .credentials import SQLITE_SIDECARS

    for path in made:
        for suffix in ("", *SQLITE_SIDECARS, ".writer"):
            paths.remove_own(path.with_name(path.name + suffix))
