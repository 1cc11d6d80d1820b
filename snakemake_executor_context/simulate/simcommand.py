"""``snakemake-context simulate``: how long would this run take, on these GPUs, at
this preemption rate? The command lives here, its flags in :mod:`.flags`; the
command line (:mod:`..cli`) only registers them.

::

    snakemake-context simulate -s Snakefile --gpus a10:10,titanx:10 --preempt 1/min \\
        [--catalog PATH] [--item-seconds RULE[@MODEL]=S] [--load-seconds CTX:KIND=S]
    snakemake-context simulate --spec workload.yaml --gpus a10:20 --pilots --queue-wait 60
    snakemake-context simulate --catalog PATH --replay [-s Snakefile]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import ContextExecutorError
from .bounds import SPAN
from .flags import add_flags

__all__ = ["add_parser", "run_command"]


def add_parser(commands: Any) -> None:
    """Add ``simulate`` to the command line's subparsers."""
    sub = commands.add_parser(
        "simulate",
        help="predict a run's makespan, GPU-hours by bucket, loads and losses on a fleet "
        "of your choice (the real placement and dispatch code, in simulated time)",
    )
    add_flags(sub)
    sub.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """The ``simulate`` command."""
    from .scenario import build, replay_text

    if args.replay:
        print(replay_text(args))
        return 0
    scenario, totals = build(args)
    from .whatif import least_makespan, over_counts, table

    bound = least_makespan(scenario.workload, scenario.times, scenario.fleet.kinds)
    result = scenario.run() if bound <= SPAN else None
    if result is None or not result.ended:
        jobs = len(scenario.workload.jobs)
        done = f"{result.jobs} of {jobs} jobs ended ok" if result else f"at least {bound:,.0f} s"
        raise ContextExecutorError(
            f"simulate: the run cannot end within the simulator's {SPAN / 86400:g} "
            f"simulated days ({done}): its jobs, loads or pilots' waits take longer on this "
            "fleet. Fix: check --item-seconds, --items, --load-seconds, --shared-bandwidth "
            "and --queue-wait, or give more GPUs."
        )
    rows = over_counts(scenario, totals) if totals else []
    if args.json:
        print(
            json.dumps(
                {
                    "predicted": result.to_json(),
                    "over_counts": [
                        {"gpus": n, **(r.to_json() if r else {"ended": False})} for n, r in rows
                    ],
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
