"""The pilot options of ``snakemake-context up --backend ...``: the command line
that becomes :class:`~.pilots.PilotOptions` and the cluster process's arguments."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..allowed import NUMBER, SIZE, TEXT, WALLTIME, WHOLE, WORDS, Allowed, add_argument
from .pilots import BACKENDS, PilotOptions, jobqueue_arguments

__all__ = [
    "PILOT_SETTINGS",
    "add_pilot_arguments",
    "check_gang_pool",
    "executor_pilot_setting",
    "pilot_command_args",
    "pilot_settings_args",
    "serve_arguments",
    "walltime_line",
]

_POOL = ("backend",)

#: What each pilot option allows, by its name in `up`'s command line (the executor's
#: settings use the same, under their own names: --context-pilot-*).
PILOT_SETTINGS: dict[str, Allowed] = {
    "backend": Allowed(TEXT, choices=tuple(sorted(BACKENDS)), optional=True),
    "queue": Allowed(TEXT, optional=True, needs=_POOL),
    "account": Allowed(TEXT, optional=True, needs=_POOL),
    "qos": Allowed(TEXT, optional=True, needs=_POOL),
    "walltime": Allowed(WALLTIME, backend="backend", needs=_POOL),
    "pilot_gpus": Allowed(WHOLE, least=0, most=64, unit="GPUs", needs=_POOL),
    "pilot_nodes": Allowed(WHOLE, least=1, most=64, unit="nodes", needs=_POOL),
    "gpu_types": Allowed(WORDS, optional=True, needs=_POOL),
    "pilot_cores": Allowed(WHOLE, least=1, most=4096, unit="cores", needs=_POOL),
    "pilot_memory": Allowed(SIZE, least=2**26, needs=_POOL),
    "directives": Allowed(WORDS, optional=True, needs=_POOL),
    "prologue": Allowed(WORDS, optional=True, needs=_POOL),
    "min_pilots": Allowed(WHOLE, least=0, most=10_000, needs=_POOL, at_most="max_pilots"),
    "max_pilots": Allowed(WHOLE, least=1, most=10_000, needs=_POOL),
    "pilot_idle_timeout": Allowed(
        NUMBER, least=0, unit="seconds", zero="never released", needs=_POOL
    ),
    "interface": Allowed(TEXT, optional=True, needs=_POOL),
    "model_cache": Allowed(TEXT, optional=True, needs=_POOL),
    "loads_per_source": Allowed(WHOLE, least=0, most=10_000, zero="no limit", needs=_POOL),
    "pilot_log_dir": Allowed(TEXT, optional=True, needs=_POOL),
    "retire_margin": Allowed(
        NUMBER, least=0, unit="seconds", needs=_POOL, below_walltime="walltime"
    ),
    "lifetime_stagger": Allowed(NUMBER, least=0, unit="seconds", needs=_POOL),
}


def executor_pilot_setting(name: str, walltime: str = "pilot_walltime") -> Allowed:
    """A pilot option's :class:`Allowed` for the executor's settings, whose walltime
    setting is called ``walltime``."""
    allowed = PILOT_SETTINGS[name]
    return replace(allowed, below_walltime=walltime) if allowed.below_walltime else allowed


def add_pilot_arguments(parser: Any) -> None:
    """The options of ``snakemake-context up --backend ...`` (an argparse parser)."""
    group = parser.add_argument_group("pilots on a batch system (with --backend)")

    def add(flag: str, name: str, **kwargs: Any) -> None:
        add_argument(group, flag, PILOT_SETTINGS[name], dest=name, **kwargs)

    add(
        "--backend",
        "backend",
        default=None,
        help="submit pilot jobs to this batch system instead of starting local servers: "
        + ", ".join(sorted(BACKENDS)),
    )
    add("--queue", "queue", help="partition (SLURM) or queue of the pilots")
    add("--account", "account", help="account (project) the pilots are charged to")
    add("--qos", "qos", help="SLURM quality of service of the pilots")
    add(
        "--walltime",
        "walltime",
        default="01:00:00",
        help="walltime of one pilot, as the batch system writes it (SLURM: MM, MM:SS, "
        "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; PBS: [[HH:]MM:]SS; SGE: H:M:S or seconds; "
        "LSF: [HH:]MM; HTCondor: HH:MM:SS); it retires before it",
    )
    add("--pilot-gpus", "pilot_gpus", default=1, help="GPUs per pilot")
    add(
        "--pilot-nodes",
        "pilot_nodes",
        default=1,
        help="pilots that form one server spanning that many nodes (one batch job "
        "each): a context declared with ranks=k puts ranks on all their GPUs (default "
        "1). The pool is then fixed: --min-pilots equal to --max-pilots, a multiple of it",
    )
    add(
        "--gpu-type",
        "gpu_types",
        action="append",
        default=[],
        help="GPU type of the pilots (SLURM GRES type, LSF gmodel); also the model "
        "advertised where NVML sees no GPU. Repeat for a pool of several kinds: new "
        "pilots go to the kind the ready jobs need",
    )
    add("--pilot-cores", "pilot_cores", default=1, help="CPU cores per pilot")
    add("--pilot-memory", "pilot_memory", default="16GB", help="memory per pilot")
    add(
        "--directive",
        "directives",
        action="append",
        default=[],
        help="an extra job-script directive, as the batch system spells it (repeatable)",
    )
    add(
        "--prologue",
        "prologue",
        action="append",
        default=[],
        help="a shell line run before the server starts, e.g. 'source "
        "/shared/venv/bin/activate' (repeatable)",
    )
    add("--interface", "interface", help="network interface the pilots reach the scheduler on")
    add("--min-pilots", "min_pilots", default=0, help="pilots kept when idle")
    add("--max-pilots", "max_pilots", default=4, help="most pilots at once")
    add(
        "--pilot-idle-timeout",
        "pilot_idle_timeout",
        default=120.0,
        help="seconds an idle pilot is kept before it is released",
    )
    add(
        "--model-cache",
        "model_cache",
        help="node-local directory where loaders keep model weights on a "
        "pilot ($SNAKEMAKE_CONTEXT_MODEL_CACHE; created; --prologue lines may stage into it)",
    )
    add(
        "--loads-per-source",
        "loads_per_source",
        default=2,
        help="at most this many pilots load one context from its shared source at "
        "once (0: no limit; loads from the node-local cache take no turn)",
    )
    add("--pilot-log-dir", "pilot_log_dir", help="where pilots write their batch logs")
    add(
        "--retire-margin",
        "retire_margin",
        default=300.0,
        help="seconds before its walltime at which a pilot retires (its jobs go back "
        "to the queue; the pool replaces it while work remains)",
    )
    add(
        "--lifetime-stagger",
        "lifetime_stagger",
        default=60.0,
        help="up to this many seconds earlier, at random, so that pilots started "
        "together do not retire together",
    )


def walltime_line(backend: str, walltime: str, margin: float, flag: str) -> str:
    """The run's line on the pilots' walltime, as the batch system reads it."""
    from ..walltime import read_walltime

    reading = read_walltime(backend, walltime)
    return (
        f"Pilots' walltime ({flag}): {reading.describe()}; a pilot retires {margin:g} s before it."
    )


def pilot_command_args(args: Any) -> list[str]:
    """The ``serve`` arguments for the pilot options of ``up``'s command line."""
    if not getattr(args, "backend", None):
        return []
    options = PilotOptions(
        backend=args.backend,
        queue=args.queue,
        account=args.account,
        qos=args.qos,
        walltime=args.walltime,
        gpus=args.pilot_gpus,
        nodes=args.pilot_nodes,
        gpu_types=tuple(args.gpu_types),
        cores=args.pilot_cores,
        memory=args.pilot_memory,
        extra_directives=tuple(args.directives),
        prologue=tuple(args.prologue),
        interface=args.interface,
        memory_budget=str(args.memory_budget),
        log_directory=args.pilot_log_dir,
        retire_margin=args.retire_margin,
        model_cache=args.model_cache,
        loads_per_source=args.loads_per_source,
        lifetime_stagger=args.lifetime_stagger,
    )
    check_gang_pool(options.nodes, args.min_pilots, args.max_pilots)
    return serve_arguments(options, args.min_pilots, args.max_pilots, args.pilot_idle_timeout)


def check_gang_pool(nodes: int, minimum: int, maximum: int) -> None:
    """Pilots that form servers of several nodes come in a fixed pool (growing and
    shrinking it by demand one pilot at a time would break gangs: not built)."""
    if nodes > 1 and (minimum != maximum or maximum % nodes):
        from ..errors import SettingError

        raise SettingError(
            f"--pilot-nodes {nodes} (--context-pilot-nodes) needs a fixed pool of whole "
            f"servers: --min-pilots ({minimum}) equal to --max-pilots ({maximum}), a "
            f"multiple of {nodes}. Fix: --min-pilots {nodes} --max-pilots {nodes}."
        )


#: The executor's settings that are pilot options, by the destination of ``up``'s
#: option in its parsed namespace (``--gpu-type`` is ``gpu_types``), as
#: :func:`pilot_command_args` reads it.
SETTING_OF_OPTION = {
    "backend": "backend",
    "queue": "pilot_queue",
    "account": "pilot_account",
    "qos": "pilot_qos",
    "walltime": "pilot_walltime",
    "pilot_gpus": "pilot_gpus",
    "pilot_nodes": "pilot_nodes",
    "gpu_types": "pilot_gpu_types",
    "pilot_cores": "pilot_cores",
    "pilot_memory": "pilot_memory",
    "directives": "pilot_directives",
    "prologue": "pilot_prologue",
    "interface": "interface",
    "memory_budget": "memory_budget",
    "retire_margin": "pilot_retire_margin",
    "model_cache": "pilot_model_cache",
    "loads_per_source": "pilot_loads_per_source",
    "min_pilots": "min_pilots",
    "max_pilots": "max_pilots",
    "pilot_idle_timeout": "pilot_idle_timeout",
}
#: Options that take a list (repeatable on ``up``'s command line).
LIST_OPTIONS = ("gpu_types", "directives", "prologue")


def pilot_settings_args(settings: Any, log_directory: str | None = None) -> list[str]:
    """The ``serve`` arguments for a run's ``--context-backend`` settings: ``up``'s
    options with their defaults (one namespace, one way to build the pilots),
    overridden by the executor's settings."""
    if not settings.backend:
        return []
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    add_pilot_arguments(parser)
    args = parser.parse_args([])
    for option, setting in SETTING_OF_OPTION.items():
        value = getattr(settings, setting)
        setattr(args, option, list(_words(value)) if option in LIST_OPTIONS else value)
    args.pilot_log_dir = log_directory
    return pilot_command_args(args)


def _words(value: Any) -> tuple[str, ...]:
    """A list setting's values: Snakemake may hand a list, or its text ("['a', 'b']")."""
    if not value:
        return ()
    if isinstance(value, str):
        import ast

        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        value = parsed if isinstance(parsed, (list, tuple)) else [value]
    return tuple(str(item) for item in value)


def serve_arguments(
    options: PilotOptions, min_pilots: int, max_pilots: int, idle_timeout: float
) -> list[str]:
    """The cluster process's arguments for a pool (its options checked already, by
    :data:`PILOT_SETTINGS`)."""
    for kind in options.kinds():
        _, job_kwargs = jobqueue_arguments(kind)
        if kind.backend == "sge":
            from .sge import check_submission

            check_submission(job_kwargs, kind.memory)
    return [
        "--pilots",
        options.to_json(),
        "--min-pilots",
        str(min_pilots),
        "--max-pilots",
        str(max_pilots),
        "--pilot-idle-timeout",
        str(idle_timeout),
    ]
