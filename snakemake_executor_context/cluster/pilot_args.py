"""The pilot options of ``snakemake-context up --backend ...``: the command line
that becomes :class:`~.pilots.PilotOptions` and the cluster process's arguments."""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError
from .pilots import BACKENDS, PilotOptions, jobqueue_arguments

__all__ = ["add_pilot_arguments", "pilot_command_args"]


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
    """The ``serve`` arguments for the pilot options of a parsed command line."""
    if not getattr(args, "backend", None):
        return []
    if args.min_pilots < 0 or args.max_pilots < max(1, args.min_pilots):
        raise ClusterError(
            f"--min-pilots {args.min_pilots} and --max-pilots {args.max_pilots}: need "
            "0 <= min <= max and max >= 1."
        )
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
        lifetime_stagger=args.lifetime_stagger,
    )
    for kind in options.kinds():
        jobqueue_arguments(kind)  # every bad option is reported before anything starts
    return [
        "--pilots",
        options.to_json(),
        "--min-pilots",
        str(args.min_pilots),
        "--max-pilots",
        str(args.max_pilots),
        "--pilot-idle-timeout",
        str(args.pilot_idle_timeout),
    ]
