"""The pilot options of ``snakemake-context up --backend ...`` and of a run's
``--context-pilots`` (each declared once, in :mod:`..settings.table`): the arguments, under
the options' names, that become :class:`~..PilotOptions` and the cluster
process's arguments."""

from __future__ import annotations

import argparse
from typing import Any

from ..settings.checks import words_of
from ..settings.shape import Shape
from ..settings.table import (
    OPTIONS,
    PILOT,
    add_option,
    executor_flag,
    options_of,
    server_group_counted,
    up_flag,
)
from .batch.registry import batch_system
from .request import PilotOptions, jobqueue_arguments

__all__ = [
    "add_pilot_arguments",
    "check_gang_pool",
    "check_pilot_group",
    "pilot_command_args",
    "pilot_settings_args",
    "serve_arguments",
    "walltime_line",
]


def add_pilot_arguments(parser: Any) -> None:
    """The options of ``snakemake-context up --backend ...`` (an argparse parser)."""
    group = parser.add_argument_group("pilots on a batch system (with --backend)")
    for declared in options_of(PILOT):
        add_option(group, declared.name)


def walltime_line(backend: str, walltime: str, margin: float, flag: str) -> str:
    """The run's line on the pilots' walltime, as the batch system reads it."""
    from .batch.walltime import read_walltime

    reading = read_walltime(backend, walltime)
    return (
        f"Pilots' walltime ({flag}): {reading.describe()}; a pilot retires {margin:g} s before it."
    )


def pilot_command_args(args: Any) -> list[str]:
    """The ``serve`` arguments for the pilot options of ``up``'s command line, or of
    a run's settings (:func:`pilot_settings_args`): both name them as the options."""
    if not getattr(args, "backend", None):
        return []
    options = PilotOptions(
        backend=args.backend,
        queue=args.pilot_queue,
        account=args.pilot_account,
        qos=args.pilot_qos,
        walltime=args.pilot_walltime,
        gpus=args.pilot_gpus,
        nodes=args.pilot_nodes,
        gpu_types=words_of(args.pilot_gpu_types),
        cores=args.pilot_cores,
        memory=args.pilot_memory,
        extra_directives=words_of(args.pilot_directives),
        prologue=words_of(args.pilot_prologue),
        interface=args.interface,
        memory_budget=str(args.contexts_memory),
        log_directory=args.pilot_log_dir,
        retire_margin=args.pilot_retire_margin,
        loads_per_source=args.pilot_loads_per_source,
        lifetime_stagger=args.pilot_lifetime_stagger,
        shape=Shape.from_args(args),
        group=args.server_group or "",
    )
    check_gang_pool(options.nodes, args.min_pilots, args.max_pilots)
    check_pilot_group(options.group)
    return serve_arguments(options, args.min_pilots, args.max_pilots, args.pilot_idle_timeout)


def check_gang_pool(nodes: int, minimum: int, maximum: int) -> None:
    """Pilots that form servers of several nodes come in a fixed pool (growing and
    shrinking it by demand one pilot at a time would break gangs: not built)."""
    if nodes > 1 and (minimum != maximum or maximum % nodes):
        from ..errors import SettingError

        lowest, highest = up_flag("min_pilots"), up_flag("max_pilots")
        raise SettingError(
            f"{up_flag('pilot_nodes')} {nodes} ({executor_flag('pilot_nodes')}) needs a fixed "
            f"pool of whole servers: {lowest} ({minimum}) equal to {highest} ({maximum}), a "
            f"multiple of {nodes}. Fix: {lowest} {nodes} {highest} {nodes}."
        )


def check_pilot_group(spec: str) -> None:
    """Pilots come and go one batch job at a time: a label counted out to the servers
    a cluster plans at its start (LABEL:N,...) has no servers to count."""
    if server_group_counted(spec):
        from ..errors import SettingError

        flag = up_flag("server_group")
        raise SettingError(
            f"{flag} {spec!r} ({executor_flag('server_group')}) is not allowed with a pool "
            "of pilots: counts give labels to the servers a cluster on this machine "
            f"starts, and pilots come and go. Fix: one label for every pilot ({flag} "
            f"LABEL), or none (each pilot is grouped by its queue and GPU type)."
        )


def pilot_settings_args(settings: Any, log_directory: str | None = None) -> list[str]:
    """The ``serve`` arguments for a run's ``--context-pilots`` request: the options
    it has, and the defaults of those only ``up`` has (one way to build the pilots)."""
    if not settings.backend:
        return []
    args = argparse.Namespace(
        **{name: getattr(settings, name, declared.default) for name, declared in OPTIONS.items()}
    )
    args.pilot_log_dir = log_directory
    return pilot_command_args(args)


def serve_arguments(
    options: PilotOptions, min_pilots: int, max_pilots: int, idle_timeout: float
) -> list[str]:
    """The cluster process's arguments for a pool (its options checked already, as
    :mod:`..settings.table` declares them), the batch system's commands looked up and
    each kind's job checked by the batch system first."""
    batch_system(options.backend).check_commands()
    for kind in options.kinds():
        _, job_arguments = jobqueue_arguments(kind)
        batch_system(kind.backend).check_submission(job_arguments)
    return [
        "--pilots",
        options.to_json(),
        up_flag("min_pilots"),
        str(min_pilots),
        up_flag("max_pilots"),
        str(max_pilots),
        up_flag("pilot_idle_timeout"),
        str(idle_timeout),
    ]
