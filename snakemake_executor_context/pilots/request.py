"""Pilot jobs on a batch system: what dask-jobqueue is asked to submit.

A pilot is one batch job running one context server (a Dask worker with the server's
preload, :mod:`..server.pilot`). :func:`jobqueue_arguments` turns the project's
:class:`PilotOptions` into a dask-jobqueue cluster class and its keyword arguments, a
pure function so that every backend's job script is tested without that batch system;
what differs between batch systems (GPUs, walltime, queue and account, directives) each
one's module of :mod:`..pilots.batch` says. :mod:`.jobqueue` builds the cluster in the
cluster process.

Facts the translation relies on:

- dask-jobqueue's ``--lifetime`` retires a worker but never resubmits its job (its issue
  #691): the adaptive pool here replaces retired pilots while work remains.
- A pilot's Dask worker and nanny would take ``$TMPDIR/dask-scratch-space`` on the node
  as their local directory (Dask reuses one that exists, whoever made it, and puts it
  first on ``sys.path``): the job script first makes and checks the private root on
  the node (:mod:`..paths`, ``python -m ... --shell``; the job ends there with one line
  if it is unfit) and names its scratch space with ``--local-directory``. Python runs
  with ``-P``: the job's working directory is not put on ``sys.path`` either.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ..defaults import (
    BATCH_STARTED_VARIABLE,
    MODEL_CACHE_VARIABLE,
    PILOT_VARIABLE,
    SOURCE_MBPS_VARIABLE,
)
from ..errors import ClusterError
from ..server.config import SERVER_DASK_CONFIG, PilotServerSettings
from ..settings.shape import Shape
from ..settings.table import setting_default
from .batch.registry import batch_system
from .batch.system import PilotJob
from .batch.walltime import WalltimeError, WalltimeReading, read_walltime

__all__ = ["PilotOptions", "jobqueue_arguments", "walltime_of"]

#: The module every pilot's worker preloads: it turns the worker into a context server.
PILOT_PRELOAD = "snakemake_executor_context.server.pilot"
#: The module every pilot's nanny preloads: it ends what a dead server left.
PILOT_NANNY_PRELOAD = "snakemake_executor_context.strays.nannysweep"
#: The worker every pilot runs, and the module its nanny preloads too: the guard
#: against connection floods in both processes.
PILOT_WORKER_CLASS = "snakemake_executor_context.cluster.floodguard.GuardedWorker"
PILOT_NANNY_GUARD = "snakemake_executor_context.cluster.floodguard"
#: The module whose ``--shell`` makes the private root on a pilot's node.
PATHS_MODULE = "snakemake_executor_context.paths"


@dataclass(frozen=True)
class PilotOptions:
    """What one pilot job asks of the batch system, and how its server runs."""

    backend: str
    #: Partition (SLURM) or queue (the others).
    queue: str | None = None
    account: str | None = None
    #: SLURM quality of service.
    qos: str | None = None
    #: As the backend writes it (see :mod:`.batch.walltime`); a pilot retires before it.
    walltime: str = setting_default("pilot_walltime")
    gpus: int = setting_default("pilot_gpus")
    #: Pilots that form one server spanning that many nodes (1: each its own).
    nodes: int = setting_default("pilot_nodes")
    #: The batch system's GPU types (SLURM GRES type, LSF gmodel), one kind of pilot
    #: each; also the model a pilot advertises where NVML sees no GPU.
    gpu_types: tuple[str, ...] = ()
    cores: int = setting_default("pilot_cores")
    memory: str = setting_default("pilot_memory")
    #: Scratch disk per pilot (HTCondor requires one).
    disk: str = "10GB"
    #: Extra job-script directives, as the batch system spells them.
    extra_directives: tuple[str, ...] = ()
    #: Shell lines run before the server starts (activate the environment, stage models).
    prologue: tuple[str, ...] = ()
    #: The network interface pilots and scheduler talk on (None: the default route).
    interface: str | None = None
    #: Seconds before the walltime at which a pilot retires; its stagger spreads
    #: retirements so that pilots started together do not all leave together.
    retire_margin: float = setting_default("pilot_retire_margin")
    lifetime_stagger: float = setting_default("pilot_lifetime_stagger")
    #: The Python that runs the pilot's server (default: the one running this).
    python: str | None = None
    memory_budget: str = setting_default("contexts_memory")
    #: Where pilots write their batch logs (None: the batch system's default).
    log_directory: str | None = None
    #: Node-local directory the prologue stages model weights into, if any.
    #: At most this many pilots load the same context from the shared source at once.
    loads_per_source: int = setting_default("pilot_loads_per_source")
    #: How its server runs: its slots (its Dask threads, not its cores), threads per
    #: slot, the model caches, template sharing and gang timeout.
    shape: Shape = field(default_factory=Shape)
    extra: dict[str, str] = field(default_factory=dict)
    #: The label of the pilots' survival group (``server_group``; '': their queue
    #: and kind are).
    group: str = ""

    @property
    def gpu_type(self) -> str | None:
        """The GPU type of a pilot of this kind (the first when there are several)."""
        return self.gpu_types[0] if self.gpu_types else None

    def kinds(self) -> list[PilotOptions]:
        """One set of options per kind of pilot (per GPU type)."""
        from dataclasses import replace

        return [replace(self, gpu_types=(kind,)) for kind in self.gpu_types] or [self]

    def kind_summaries(self) -> list[dict[str, Any]]:
        """Each kind's GPUs and memory, as the executor checks rules against them."""
        from dask.utils import parse_bytes

        return [
            {
                "gpu_type": k.gpu_type,
                # A server of several pilots offers all of their GPUs.
                "gpus": k.gpus * k.nodes,
                "nodes": k.nodes,
                "memory": k.memory,
                "memory_bytes": int(parse_bytes(k.memory)),
            }
            for k in self.kinds()
        ]

    def lifetime_seconds(self) -> float:
        """When a pilot retires (:func:`~..fleet.poolsizing.pilot_lifetime`)."""
        from ..fleet.poolsizing import pilot_lifetime

        return pilot_lifetime(walltime_of(self).seconds, self.retire_margin, self.lifetime_stagger)

    def server_settings(self) -> PilotServerSettings:
        """What the pilot's preload reads from :data:`~..defaults.PILOT_VARIABLE`."""
        return PilotServerSettings(
            shape=self.shape,
            memory_budget=self.memory_budget,
            loads_per_source=self.loads_per_source,
            gpus=self.gpus,
            gpu_type=self.gpu_type,
            lifetime_seconds=self.lifetime_seconds(),
            lifetime_stagger=self.lifetime_stagger,
            gang_nodes=self.nodes,
            gang_kind=self.gpu_type or "",
            group=self.group,
            partition=self.queue or "",
            # The kind's label, as PilotKinds names it.
            pool=self.gpu_type or "pilot",
        )

    def to_json(self) -> str:
        """These options as JSON (how ``serve`` receives them)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PilotOptions:
        """Options from :meth:`to_json`."""
        data = json.loads(text)
        for key in ("extra_directives", "prologue", "gpu_types"):
            data[key] = tuple(data.get(key) or ())
        return cls(**{**data, "shape": Shape.from_wire(data.get("shape") or {})})


def walltime_of(options: PilotOptions) -> WalltimeReading:
    """The pilots' walltime as their batch system reads it (ClusterError if it cannot:
    the settings' check refuses such a walltime before anything starts)."""
    try:
        return read_walltime(options.backend, options.walltime)
    except WalltimeError as error:
        raise ClusterError(f"The pilots' walltime {options.walltime!r}: {error}.") from None


def _dask_environ() -> list[tuple[str, str]]:
    """The servers' Dask settings as the environment variables Dask reads at start
    (a pilot's worker reads its config before any preload runs)."""
    found = []
    for key, value in SERVER_DASK_CONFIG.items():
        name = "DASK_" + key.upper().replace(".", "__").replace("-", "_")
        found.append((name, repr(value)))
    return found


def jobqueue_arguments(
    options: PilotOptions, security: Any = None, python: str = ""
) -> tuple[str, dict[str, Any]]:
    """The dask-jobqueue cluster class name and keyword arguments for these options."""
    system = batch_system(options.backend)
    job = _pilot_job(options, walltime_of(options))
    interpreter = f"{options.python or python or sys.executable} -P"
    prologue = [
        # First: when the batch system started the job (it charges from then; the
        # ledger's allocated_before is the time from here to the server's registration).
        f"export {BATCH_STARTED_VARIABLE}=`date +%s.%N`",
        # On the node: the private root and Dask's scratch space in it, or the job ends
        # (backquotes: HTCondor's submit file would take $(...) for one of its macros).
        f"snakemake_context_paths=`{interpreter} -m {PATHS_MODULE} --shell` || exit 1",
        'eval "$snakemake_context_paths"',
        f"export {PILOT_VARIABLE}={shlex.quote(options.server_settings().to_wire())}",
    ]
    prologue += [f"export {name}={shlex.quote(value)}" for name, value in _dask_environ()]
    if os.environ.get(SOURCE_MBPS_VARIABLE):
        # The site's cap on reads from a staged source travels with the pilot (a batch
        # system need not export the submitter's environment: Grid Engine does not).
        rate = shlex.quote(os.environ[SOURCE_MBPS_VARIABLE])
        prologue.append(f"export {SOURCE_MBPS_VARIABLE}={rate}")
    if options.shape.model_cache:
        # Loaders keep converted weights there (SmolLM2's does): node-local disk that
        # the user's prologue lines, run next, may stage weights into.
        # Double quotes: $USER, $TMPDIR and the like expand on the node.
        cache = f'"{options.shape.model_cache}"'  # the settings allow no other expansion
        prologue += [f"export {MODEL_CACHE_VARIABLE}={cache}", f"mkdir -p -m 700 {cache}"]
    prologue += list(options.prologue)
    kwargs: dict[str, Any] = {
        "cores": options.cores,
        "processes": 1,
        "memory": options.memory,
        "nanny": True,
        "job_name": "snakemake-context",
        "job_script_prologue": prologue,
        "worker_extra_args": [
            "--preload",
            PILOT_PRELOAD,
            # Its nanny ends what the server leaves if it dies (a subreaper).
            "--preload-nanny",
            PILOT_NANNY_PRELOAD,
            "--preload-nanny",
            PILOT_NANNY_GUARD,
            "--worker-class",
            PILOT_WORKER_CLASS,
            "--lifetime",
            f"{int(options.lifetime_seconds())}s",
            "--lifetime-stagger",
            f"{int(options.lifetime_stagger)}s",
            "--no-dashboard",
            # After dask-jobqueue's own --nthreads (its cores): the last one counts.
            "--nthreads",
            str(max(1, options.shape.slots)),
        ],
        "python": interpreter,
        # Set by the prologue's first lines (the private root on the node).
        "local_directory": '"$DASK_TEMPORARY_DIRECTORY"',
        "security": security,
        "log_directory": options.log_directory,
        "interface": options.interface,
        # A pilot whose scheduler is gone exits instead of waiting for a new one.
        "death_timeout": 60,
    }
    kwargs.update(system.job_arguments(job))
    return system.jobqueue_class, kwargs


def _pilot_job(options: PilotOptions, walltime: WalltimeReading) -> PilotJob:
    """What these options ask of the batch system, for its module to spell."""
    return PilotJob(
        queue=options.queue,
        account=options.account,
        qos=options.qos,
        walltime=options.walltime,
        walltime_seconds=walltime.seconds,
        gpus=options.gpus,
        gpu_type=options.gpu_type,
        cores=options.cores,
        memory=options.memory,
        disk=options.disk,
        extra_directives=options.extra_directives,
    )
