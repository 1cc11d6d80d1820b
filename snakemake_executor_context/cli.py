"""``snakemake-context``: start, stop and inspect a persistent local context cluster.

::

    snakemake-context up     [--scheduler-file F] [--servers N] [--memory-budget B]
                             [--idle-timeout S]
    snakemake-context down   [--scheduler-file F]
    snakemake-context status [--scheduler-file F] [--json]

A run attaches with ``snakemake --executor context --context-scheduler-file F``; the
servers keep their contexts loaded between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .errors import ContextExecutorError

__all__ = ["DEFAULT_SCHEDULER_FILE", "main"]

DEFAULT_SCHEDULER_FILE = Path(
    os.environ.get("SNAKEMAKE_CONTEXT_SCHEDULER_FILE", "~/.snakemake-context/scheduler.json")
).expanduser()


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
        default="0.8",
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
    up.set_defaults(func=_up)

    down = commands.add_parser("down", help="stop a persistent local cluster")
    scheduler_file(down)
    down.set_defaults(func=_down)

    status = commands.add_parser("status", help="servers and the contexts loaded on them")
    scheduler_file(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)
    return parser


def _up(args: argparse.Namespace) -> int:
    from .cluster import LocalClusterProcess

    running = LocalClusterProcess.find(args.scheduler_file)
    if running is not None:
        info = running.files.read_info() or {}
        print(
            f"A context cluster already runs at {info.get('address')} "
            f"(scheduler file {running.files.scheduler_file})."
        )
        return 0
    started = time.monotonic()
    local = LocalClusterProcess.start(
        args.scheduler_file,
        servers=args.servers,
        memory_budget=args.memory_budget,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
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
        f"Attach with: snakemake --executor context --context-scheduler-file "
        f"{local.files.scheduler_file}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    from .cluster import LocalClusterProcess

    local = LocalClusterProcess.find(args.scheduler_file)
    if local is None:
        print(f"No context cluster runs for {args.scheduler_file}.")
        return 0
    local.stop()
    print(f"Context cluster stopped (log: {local.files.log_file}).")
    return 0


def _status(args: argparse.Namespace) -> int:
    from .cluster import Engine

    engine = Engine.attach(address=None, scheduler_file=args.scheduler_file, timeout=10)
    try:
        inventories = engine.inventories()
    finally:
        engine.client.close()
    if args.json:
        print(json.dumps({"servers": inventories}, indent=1, default=str))
        return 0
    print(f"{len(inventories)} server(s) at {args.scheduler_file}:")
    for address, inventory in sorted(inventories.items()):
        print("  " + _describe(address, inventory))
        for context in inventory["contexts"]:
            print(
                f"      {'/'.join(context['names'])}: {context['bytes'] / 1e6:.0f} MB, loaded in "
                f"{context['load_seconds']:.1f} s, {context['hits']} reuse(s)"
            )
    return 0


def _describe(address: str, inventory: dict[str, Any]) -> str:
    server = inventory["server"]
    gpu = inventory.get("gpu")
    kind = gpu["name"] if gpu else "CPU"
    return (
        f"{server['name']} {address} ({kind}, pid {server['pid']}): {inventory['jobs']} job(s), "
        f"{inventory['loads']} load(s), {inventory['evictions']} eviction(s), "
        f"{len(inventory['contexts'])} context(s) loaded"
    )


if __name__ == "__main__":
    sys.exit(main())
