"""``snakemake-context simulate``: how long would this run take, on these GPUs, at
this preemption rate? The parser and the command live here; the command line
(:mod:`..cli`) only registers them.

::

    snakemake-context simulate -s Snakefile --gpus a10:10,titanx:10 --preempt 1/min \\
        [--catalog PATH] [--item-seconds RULE[@MODEL]=S] [--load-seconds CTX:KIND=S]
    snakemake-context simulate --spec workload.yaml --gpus a10:20 --pilots --queue-wait 60
    snakemake-context simulate --catalog PATH --replay [-s Snakefile]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run_command"]


def add_parser(commands: Any) -> None:
    """Add ``simulate`` to the command line's subparsers."""
    sub = commands.add_parser(
        "simulate",
        help="predict a run's makespan, GPU-hours by bucket, loads and losses on a fleet "
        "of your choice (the real placement and dispatch code, in simulated time)",
    )
    source = sub.add_argument_group("the workload")
    source.add_argument(
        "-s", "--snakefile", type=Path, help="a Snakefile (its DAG, as Snakemake builds it)"
    )
    source.add_argument("-d", "--directory", type=Path, help="the workflow directory")
    source.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    source.add_argument("--configfile", nargs="*", type=Path, default=[])
    source.add_argument("--spec", type=Path, help="a YAML workload spec instead of a Snakefile")
    source.add_argument(
        "--needed-only",
        action="store_true",
        help="only jobs whose outputs are missing or old (default: every job)",
    )
    times = sub.add_argument_group("times (the catalog's where it measured them)")
    times.add_argument("--catalog", help="a catalog (path or URL): its latest run's times")
    times.add_argument("--run", help="the catalog's run to take times from (default: the latest)")
    times.add_argument(
        "--item-seconds",
        action="append",
        default=[],
        metavar="RULE[@MODEL]=S",
        help="seconds per item of a rule (on a GPU model)",
    )
    times.add_argument(
        "--slowdown",
        action="append",
        default=[],
        metavar="MODEL=F",
        help="a GPU model's time over RULE=S times",
    )
    times.add_argument(
        "--items",
        action="append",
        default=[],
        metavar="RULE=N",
        help="items per job of a rule (default: the catalog's, else 1)",
    )
    times.add_argument(
        "--load-seconds",
        action="append",
        default=[],
        metavar="CONTEXT:KIND=S",
        help="seconds of a load of a kind: source, conversion, cache or peer",
    )
    times.add_argument("--context-bytes", action="append", default=[], metavar="CONTEXT=SIZE")
    times.add_argument(
        "--local-seconds",
        action="append",
        default=[],
        metavar="RULE=S",
        help="seconds of a local rule",
    )
    times.add_argument(
        "--job-cv", type=float, default=0.0, help="spread of job times (coefficient of variation)"
    )
    fleet = sub.add_argument_group("the fleet")
    fleet.add_argument(
        "--gpus", help="GPU models and counts: a10:10,titanx:10 (default: the catalog's servers)"
    )
    fleet.add_argument("--slots", type=int, default=1, help="jobs a server runs at once")
    fleet.add_argument(
        "--slot-gain",
        action="append",
        default=[],
        metavar="K=G",
        help="throughput of K jobs at once over one alone",
    )
    fleet.add_argument(
        "--budget", default="0", help="memory a server fills with contexts (a size; 0: no limit)"
    )
    fleet.add_argument(
        "--shared-bandwidth",
        type=float,
        default=0.0,
        help="the shared filesystem, Gb/s (loads from the source share it)",
    )
    fleet.add_argument(
        "--peer", action="store_true", help="servers fetch a context a peer holds from it"
    )
    fleet.add_argument(
        "--pilots",
        action="store_true",
        help="a pool of pilots (each GPU model's count: what the cluster gives)",
    )
    fleet.add_argument("--min-pilots", type=int, default=0)
    fleet.add_argument("--max-pilots", type=int, default=0, help="default: every GPU of --gpus")
    fleet.add_argument(
        "--queue-wait", type=float, default=60.0, help="mean seconds in the batch queue"
    )
    fleet.add_argument("--walltime", type=float, default=4 * 3600.0, help="pilot walltime, seconds")
    fleet.add_argument("--loads-per-source", type=int, default=2)
    fleet.add_argument(
        "--preempt",
        default="0",
        help="preemptions: 1/min for the fleet, or a10:1/min,titanx:2/h per partition",
    )
    fleet.add_argument("--preempt-signal", choices=["KILL", "TERM"], default="KILL")
    fleet.add_argument(
        "--preempt-trace", type=Path, help="JSON lines of {at, server}: the injector's log"
    )
    run = sub.add_argument_group("the run")
    run.add_argument("--mode", choices=["full", "partial", "agnostic"], default="full")
    run.add_argument(
        "--jobs", type=int, default=0, help="Snakemake's --jobs (default: twice the slots)"
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument(
        "--counts",
        default="",
        help="GPU counts for the table (default: 1/2, 1, 2, 4 times --gpus; 'none')",
    )
    run.add_argument(
        "--replay", action="store_true", help="replay the catalog's run: predicted against measured"
    )
    run.add_argument("--json", action="store_true", help="print JSON")
    sub.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """The ``simulate`` command."""
    from .scenario import build, replay_text

    if args.replay:
        print(replay_text(args))
        return 0
    scenario, totals = build(args)
    from .whatif import over_counts, table

    result = scenario.run()
    rows = over_counts(scenario, totals) if totals else []
    if args.json:
        print(
            json.dumps(
                {
                    "predicted": result.to_json(),
                    "over_counts": [{"gpus": n, **r.to_json()} for n, r in rows],
                },
                indent=1,
            )
        )
        return 0
    from .result import describe

    print(describe(result))
    if rows:
        print(table(rows))
    return 0
