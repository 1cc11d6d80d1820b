"""The pilot options of ``snakemake-context up --backend ...``: the command line
that becomes :class:`~.pilots.PilotOptions` and the cluster process's arguments."""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError
from .pilots import BACKENDS, PilotOptions, jobqueue_arguments

__all__ = ["add_pilot_arguments", "pilot_command_args", "pilot_settings_args", "serve_arguments"]


def add_pilot_arguments(parser: Any) -> None:
    """The options of ``snakemake-context up --backend ...`` (an argparse parser)."""
    group = parser.add_argument_group("pilots on a batch system (with --backend)")
    add = group.add_argument
    add(
        "--backend",
        choices=sorted(BACKENDS),
        default=None,
        help="submit pilot jobs to this batch system instead of starting local servers",
    )
    add("--queue", help="partition (SLURM) or queue of the pilots")
    add("--account", help="account (project) the pilots are charged to")
    add("--qos", help="SLURM quality of service of the pilots")
    add(
        "--walltime",
        default="01:00:00",
        help="walltime of one pilot, HH:MM:SS or D-HH:MM:SS; it retires before it",
    )
    add("--pilot-gpus", type=int, default=1, help="GPUs per pilot")
    add(
        "--gpu-type",
        action="append",
        default=[],
        help="GPU type of the pilots (SLURM GRES type, LSF gmodel); also the model "
        "advertised where NVML sees no GPU. Repeat for a pool of several kinds: new "
        "pilots go to the kind the ready jobs need",
    )
    add("--pilot-cores", type=int, default=1, help="CPU cores per pilot")
    add("--pilot-memory", default="16GB", help="memory per pilot")
    add(
        "--directive",
        action="append",
        default=[],
        help="an extra job-script directive, as the batch system spells it (repeatable)",
    )
    add(
        "--prologue",
        action="append",
        default=[],
        help="a shell line run before the server starts, e.g. 'source "
        "/shared/venv/bin/activate' (repeatable)",
    )
    add("--interface", help="network interface the pilots reach the scheduler on")
    add("--min-pilots", type=int, default=0, help="pilots kept when idle")
    add("--max-pilots", type=int, default=4, help="most pilots at once")
    add(
        "--pilot-idle-timeout",
        type=float,
        default=120.0,
        help="seconds an idle pilot is kept before it is released",
    )
    add(
        "--model-cache",
        help="node-local directory where loaders keep model weights on a "
        "pilot ($SNAKEMAKE_CONTEXT_MODEL_CACHE; created; --prologue lines may stage into it)",
    )
    add(
        "--loads-per-source",
        type=int,
        default=2,
        help="at most this many pilots load one context from its shared source at "
        "once (0: no limit; loads from the node-local cache take no turn)",
    )
    add("--pilot-log-dir", help="where pilots write their batch logs")
    add(
        "--retire-margin",
        type=float,
        default=300.0,
        help="seconds before its walltime at which a pilot retires (its jobs go back "
        "to the queue; the pool replaces it while work remains)",
    )
    add(
        "--lifetime-stagger",
        type=float,
        default=60.0,
        help="up to this many seconds earlier, at random, so that pilots started "
        "together do not retire together",
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
        gpu_types=tuple(args.gpu_type),
        cores=args.pilot_cores,
        memory=args.pilot_memory,
        extra_directives=tuple(args.directive),
        prologue=tuple(args.prologue),
        interface=args.interface,
        memory_budget=str(args.memory_budget),
        log_directory=args.pilot_log_dir,
        retire_margin=args.retire_margin,
        model_cache=args.model_cache,
        loads_per_source=args.loads_per_source,
        lifetime_stagger=args.lifetime_stagger,
    )
    return serve_arguments(options, args.min_pilots, args.max_pilots, args.pilot_idle_timeout)


def pilot_settings_args(settings: Any, log_directory: str | None = None) -> list[str]:
    """The ``serve`` arguments for a run's ``--context-backend`` settings."""
    if not settings.backend:
        return []
    options = PilotOptions(
        backend=settings.backend,
        queue=settings.pilot_queue,
        account=settings.pilot_account,
        qos=settings.pilot_qos,
        walltime=settings.pilot_walltime,
        gpus=settings.pilot_gpus,
        gpu_types=_words(settings.pilot_gpu_types),
        cores=settings.pilot_cores,
        memory=settings.pilot_memory,
        extra_directives=_words(settings.pilot_directives),
        prologue=_words(settings.pilot_prologue),
        interface=settings.interface,
        memory_budget=str(settings.memory_budget),
        log_directory=log_directory,
        retire_margin=settings.pilot_retire_margin,
        model_cache=settings.pilot_model_cache,
        loads_per_source=settings.pilot_loads_per_source,
    )
    return serve_arguments(
        options, settings.min_pilots, settings.max_pilots, settings.pilot_idle_timeout
    )


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
    """The cluster process's arguments for a pool; every bad option is one error here,
    before anything starts."""
    if min_pilots < 0 or max_pilots < max(1, min_pilots):
        raise ClusterError(
            f"--min-pilots {min_pilots} and --max-pilots {max_pilots} "
            "(--context-min-pilots, --context-max-pilots): need 0 <= min <= max, max >= 1."
        )
    for kind in options.kinds():
        jobqueue_arguments(kind)
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
