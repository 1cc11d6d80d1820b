"""The ``simulate`` command's flags, each declaring what it allows (:mod:`..settings.checks`,
checked by the command line before anything runs; the values of flags that hold
several are read by :mod:`.bounds`, with the same one-line refusals)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..settings.checks import FLAG, NUMBER, TEXT, WHOLE, WORDS, Allowed, add_argument, filled
from ..settings.table import option
from .bounds import BYTES, MAX_SERVERS, SPAN, pair_form, parse_counts, parse_gpus, parse_rates
from .hazard import parse_lifetimes
from .model import PoolSpec
from .simdefaults import LOADS_PER_SOURCE, MIN_PILOTS, PEER_TRANSFERS, PILOT_WALLTIME, SLOTS

__all__ = ["add_flags"]

_PILOTS = ("pilots",)
_SNAKEFILE = ("snakefile", "directory", "config", "configfile", "needed_only")
#: A pilot retires this long before its walltime (its margin, then its stagger).
_RETIRES = PoolSpec.retire_margin + PoolSpec.stagger


def _gpus(flag: str, text: str) -> None:
    parse_gpus(text)


def _rates(flag: str, text: str) -> None:
    parse_rates(text)


def _lifetimes(flag: str, text: str) -> None:
    parse_lifetimes(text, flag)


def _counts(flag: str, text: str) -> None:
    parse_counts(text)


def _directory(flag: str, text: str) -> str | None:
    return None if os.path.isdir(text) else "no such directory"


def add_flags(sub: Any) -> None:
    """The flags of ``simulate`` (an argparse parser), each with what it allows."""
    _workload(sub.add_argument_group("the workload"))
    _times(sub.add_argument_group("times (the catalog's where it measured them)"))
    _fleet(sub.add_argument_group("the fleet"))
    _pool(sub.add_argument_group("a pool of pilots (with --pilots)"))
    _run(sub.add_argument_group("the run"))


def _workload(group: Any) -> None:
    text = Allowed(TEXT, optional=True)
    add_argument(
        group, "--snakefile", text, short="-s", type=Path,
        help="a Snakefile (its DAG, as Snakemake builds it)",
    )  # fmt: skip
    add_argument(
        group, "--directory", Allowed(TEXT, optional=True, form=_directory), short="-d",
        type=Path, help="the workflow directory",
    )  # fmt: skip
    add_argument(group, "--config", Allowed(WORDS), nargs="*", default=[], metavar="KEY=VALUE")
    add_argument(group, "--configfile", Allowed(WORDS), nargs="*", type=Path, default=[])
    add_argument(
        group, "--spec",
        Allowed(TEXT, optional=True, conflicts=_SNAKEFILE,
                clash="a spec is the whole workload, the Snakefile's options do not apply"),
        type=Path, help="a YAML workload spec instead of a Snakefile",
    )  # fmt: skip
    add_argument(
        group, "--needed-only", Allowed(FLAG), action="store_true",
        help="only jobs whose outputs are missing or old (default: every job)",
    )  # fmt: skip


def _times(group: Any) -> None:
    add_argument(
        group, "--catalog", Allowed(TEXT, optional=True, form=filled),
        help="a catalog (path or URL): its latest run's times",
    )  # fmt: skip
    add_argument(
        group, "--run", Allowed(TEXT, optional=True, needs=("catalog",)),
        help="the catalog's run to take times from (default: the latest)",
    )  # fmt: skip
    for flag, metavar, help in (
        ("--item-seconds", "RULE[@MODEL]=S", "seconds per item of a rule (on a model)"),
        ("--slowdown", "MODEL=F", "a GPU model's time over RULE=S times"),
        ("--items", "RULE=N", "items per job of a rule (default: the catalog's, else 1)"),
        ("--load-seconds", "CONTEXT:KIND=S",
         "seconds of a load of a kind: source, conversion, cache or peer"),
        ("--context-bytes", "CONTEXT=SIZE", "a context's size on disk"),
        ("--local-seconds", "RULE=S", "seconds of a local rule"),
    ):  # fmt: skip
        add_argument(
            group, flag, Allowed(WORDS, form=pair_form), action="append", default=[],
            metavar=metavar, help=help,
        )  # fmt: skip
    add_argument(
        group, "--job-cv", Allowed(NUMBER, least=0, most=10), default=0.0,
        help="spread of job times (coefficient of variation of a lognormal; 0 to 10)",
    )  # fmt: skip


def _fleet(group: Any) -> None:
    add_argument(
        group, "--gpus", Allowed(TEXT, optional=True, form=_gpus),
        help=f"GPU models and counts: a10:10,titanx:10, at most {MAX_SERVERS} in all "
        "(default: the catalog's servers)",
    )  # fmt: skip
    add_argument(
        group, "--slots", option("slots").allowed, default=SLOTS, help="jobs a server runs at once"
    )
    add_argument(
        group, "--slot-gain", Allowed(WORDS, form=pair_form), action="append",
        default=[], metavar="K=G",
        help="throughput of K jobs at once over one alone",
    )  # fmt: skip
    add_argument(
        group, "--budget", replace(BYTES, optional=True, zero="no limit"), default=None,
        help="memory a server fills with contexts (a size; default or 0: no limit)",
    )  # fmt: skip
    add_argument(
        group, "--shared-bandwidth",
        # Below 1 Mb/s a model's gigabytes take days: a simulation that never ends.
        Allowed(NUMBER, least=0.001, most=100_000, unit="Gb/s", zero="not modelled"),
        default=0.0, help="the shared filesystem, Gb/s (loads from the source share it)",
    )  # fmt: skip
    add_argument(
        group, "--peer", Allowed(FLAG), action="store_true",
        help="servers fetch a context a peer holds from it, each serving "
        f"{PEER_TRANSFERS} at once (the plugin's default: "
        f"{'on' if PEER_TRANSFERS else 'off'}; here off unless given)",
    )  # fmt: skip
    add_argument(
        group, "--preempt", Allowed(TEXT, optional=True, form=_rates),
        help="preemptions: 1/min for the fleet, or a10:1/min,titanx:2/h per partition "
        "(at most 60/min each: every preemption is an event the simulation runs)",
    )  # fmt: skip
    add_argument(
        group, "--preempt-signal",
        Allowed(TEXT, choices=("KILL", "TERM"), needs=("preempt", "preempt_trace", "lifetimes")),
        default="KILL",
    )  # fmt: skip
    add_argument(
        group, "--preempt-trace", Allowed(TEXT, optional=True), type=Path,
        help="JSON lines of {at, server}: the injector's log",
    )  # fmt: skip
    add_argument(
        group, "--lifetimes", Allowed(TEXT, optional=True, form=_lifetimes),
        metavar="PARTITION=SPEC[,...]",
        help="each server's life drawn when it joins, preempted at its end: exp:MEAN, "
        "weibull:SHAPE:SCALE or bathtub:EARLY_MEAN:EARLY_END:MID_MEAN:LATE_START:LATE_MEAN "
        "(seconds, or with s, min or h) per partition (a GPU model here; * or a bare SPEC: "
        "every other), like a10=exp:2min,titanx=exp:30min",
    )  # fmt: skip


def _pool(group: Any) -> None:
    add_argument(
        group, "--pilots", Allowed(FLAG), action="store_true",
        help="a pool of pilots (each GPU model's count: what the cluster gives)",
    )  # fmt: skip
    add_argument(
        group,
        "--min-pilots",
        replace(option("min_pilots").allowed, needs=_PILOTS),
        default=MIN_PILOTS,
    )
    add_argument(
        group, "--max-pilots",
        replace(option("max_pilots").allowed, needs=_PILOTS, optional=True),
        default=None, help="default: every GPU of --gpus",
    )  # fmt: skip
    add_argument(
        group, "--queue-wait", Allowed(NUMBER, least=0, most=SPAN, unit="seconds", needs=_PILOTS),
        default=60.0, help="mean seconds in the batch queue",
    )  # fmt: skip
    add_argument(
        group, "--walltime",
        Allowed(NUMBER, above=_RETIRES, most=SPAN, unit="seconds", needs=_PILOTS),
        default=PILOT_WALLTIME,
        help=f"pilot walltime, seconds (the plugin's default: {PILOT_WALLTIME:g}; above "
        f"{_RETIRES:g}: a pilot retires {PoolSpec.retire_margin:g} s before it, staggered "
        f"up to {PoolSpec.stagger:g} s)",
    )  # fmt: skip
    add_argument(
        group, "--loads-per-source",
        replace(option("pilot_loads_per_source").allowed, needs=_PILOTS),
        default=LOADS_PER_SOURCE,
        help="pilots reading a context from its source at once, each read in a turn "
        f"(the plugin's default: {LOADS_PER_SOURCE}; 0: no limit)",
    )  # fmt: skip


def _run(group: Any) -> None:
    add_argument(
        group, "--mode", Allowed(TEXT, choices=("full", "partial", "agnostic")), default="full"
    )
    add_argument(
        group, "--jobs", Allowed(WHOLE, least=0, most=1_000_000, zero="twice the slots"),
        default=0, help="Snakemake's --jobs (default: twice the slots)",
    )  # fmt: skip
    add_argument(group, "--seed", Allowed(WHOLE, least=0, most=2**63 - 1), default=1)
    add_argument(
        group, "--survival", Allowed(FLAG), action="store_true",
        help="placement and the pool weigh how long servers are likely to live (the "
        "plugin's --context-tuning survival_placement)",
    )  # fmt: skip
    add_argument(
        group, "--counts", Allowed(TEXT, form=_counts), default="",
        help=f"GPU counts for the table, each 1 to {MAX_SERVERS} (default: 1/2, 1, 2, 4 "
        "times --gpus; 'none')",
    )  # fmt: skip
    add_argument(
        group, "--replay", Allowed(FLAG), action="store_true",
        help="replay the catalog's run: predicted against measured",
    )  # fmt: skip
    add_argument(group, "--json", Allowed(FLAG), action="store_true", help="print JSON")
