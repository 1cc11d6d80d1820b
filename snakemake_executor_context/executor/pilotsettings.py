"""The executor's settings of a pool of pilots for one run (``--context-backend``
and the ``--context-pilot-*`` flags): a base of
:class:`~.settings.ExecutorSettings`. What each allows is declared once, with `up`'s
pilot flags (:data:`~..cluster.pilot_args.PILOT_SETTINGS`).
"""

# No `from __future__ import annotations`: Snakemake reads the field types at run time
# to build the argument parser, and only understands typing.Optional.
from dataclasses import dataclass, replace
from typing import Optional

from ..allowed import Allowed
from ..allowed import settings_field as _checked
from ..cluster.pilot_args import executor_pilot_setting as _pilot

__all__ = ["PilotSettings"]

#: Pilots are started for this run only: not with a cluster it attaches to.
_ATTACH = ("scheduler_address", "scheduler_file")


def _backend() -> Allowed:
    return replace(_pilot("backend"), conflicts=_ATTACH)


@dataclass
class PilotSettings:
    """A pool of pilots on a batch system, submitted for this run."""

    backend: Optional[str] = _checked(
        None,
        _backend(),
        {
            "help": "Run the servers as pilot jobs of this batch system, submitted for "
            "this run and sized by its demand (slurm, htcondor, pbs, sge, lsf; through "
            "dask-jobqueue). The scheduler runs in Snakemake's machine; pilots must "
            "reach it (--context-interface) and share the workflow directory. Default: "
            "servers on this machine. A pool kept across runs: `snakemake-context up "
            "--backend ...`.",
        },
    )
    pilot_queue: Optional[str] = _checked(
        None,
        _pilot("queue"),
        {"help": "Partition (SLURM) or queue of the pilots."},
    )
    pilot_account: Optional[str] = _checked(
        None,
        _pilot("account"),
        {"help": "Account (project) the pilots are charged to."},
    )
    pilot_qos: Optional[str] = _checked(
        None,
        _pilot("qos"),
        {"help": "SLURM quality of service of the pilots."},
    )
    pilot_walltime: str = _checked(
        "01:00:00",
        _pilot("walltime"),
        {
            "help": "Walltime of one pilot, read as the --context-backend reads it (SLURM: "
            "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, so 04:00 is 4 minutes; PBS: "
            "[[HH:]MM:]SS; SGE: H:M:S or seconds; LSF: [HH:]MM or HH:MM:SS; HTCondor: "
            "HH:MM:SS or D-HH:MM:SS); the run prints that reading, and refuses a field "
            "beyond its range. A pilot retires --context-pilot-retire-margin seconds "
            "before it; its running jobs go back to the queue and the pool submits a "
            "replacement while work remains.",
        },
    )
    pilot_retire_margin: float = _checked(
        300.0,
        _pilot("retire_margin"),
        {"help": "Seconds before its walltime at which a pilot retires."},
    )
    pilot_gpus: int = _checked(
        1,
        _pilot("pilot_gpus"),
        {"help": "GPUs per pilot (one server each pilot)."},
    )
    pilot_nodes: int = _checked(
        1,
        _pilot("pilot_nodes"),
        {
            "help": "Pilots that form one server spanning that many nodes (one batch "
            "job each, assembled once they have started): its jobs run on the first, "
            "and a context declared with ranks=k puts one rank on each GPU of them all "
            "(tensor parallel across nodes). Needs a fixed pool: --context-min-pilots "
            "equal to --context-max-pilots, a multiple of it.",
        },
    )
    pilot_gpu_types: Optional[list[str]] = _checked(
        None,
        _pilot("gpu_types"),
        {
            "help": "GPU types of the pilots (SLURM GRES type, LSF gmodel), one kind of "
            "pilot each: new pilots go to the kind the ready jobs' gpu_model needs. Also "
            "the model a pilot advertises where NVML sees no GPU.",
            "nargs": "+",
            "type": str,
        },
    )
    pilot_cores: int = _checked(
        1,
        _pilot("pilot_cores"),
        {"help": "CPU cores per pilot."},
    )
    pilot_memory: str = _checked(
        "16GB",
        _pilot("pilot_memory"),
        {"help": "Memory per pilot."},
    )
    pilot_directives: Optional[list[str]] = _checked(
        None,
        _pilot("directives"),
        {
            "help": "Extra job-script directives, as the batch system spells them (e.g. "
            "--constraint=a100 for SLURM).",
            "nargs": "+",
            "type": str,
        },
    )
    pilot_prologue: Optional[list[str]] = _checked(
        None,
        _pilot("prologue"),
        {
            "help": "Shell lines a pilot runs before its server starts, e.g. 'source "
            "/shared/venv/bin/activate', or copying weights to node-local disk.",
            "nargs": "+",
            "type": str,
        },
    )
    interface: Optional[str] = _checked(
        None,
        _pilot("interface"),
        {
            "help": "Network interface the scheduler listens on and pilots reach it "
            "through (compute nodes often reach only one interface of a login node, "
            "e.g. ib0), with --context-backend. Default: the default route.",
        },
    )
    min_pilots: int = _checked(
        0,
        _pilot("min_pilots"),
        {"help": "Pilots the pool keeps even when idle."},
    )
    max_pilots: int = _checked(
        4,
        _pilot("max_pilots"),
        {"help": "Most pilots at once."},
    )
    pilot_idle_timeout: float = _checked(
        120.0,
        _pilot("pilot_idle_timeout"),
        {"help": "Seconds an idle pilot is kept before it is released."},
    )
    pilot_model_cache: Optional[str] = _checked(
        None,
        _pilot("model_cache"),
        {
            "help": "Node-local directory where loaders keep model weights on a pilot "
            "(exported as SNAKEMAKE_CONTEXT_MODEL_CACHE and created; "
            "--context-pilot-prologue lines may stage weights into it, e.g. 'rsync -a "
            "/shared/models/ $SNAKEMAKE_CONTEXT_MODEL_CACHE/').",
        },
    )
    pilot_loads_per_source: int = _checked(
        2,
        _pilot("loads_per_source"),
        {
            "help": "At most this many pilots load one context from its shared source "
            "at once (a semaphore on the scheduler; 0: no limit). Loads from the "
            "node-local model cache take no turn.",
        },
    )
