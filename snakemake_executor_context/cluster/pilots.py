"""Pilot jobs on a batch system: what dask-jobqueue is asked to submit.

A pilot is one batch job running one context server (a Dask worker with the server's
preload, :mod:`..server.pilot`). :func:`jobqueue_arguments` turns the project's
:class:`PilotOptions` into a dask-jobqueue cluster class and its keyword arguments, a
pure function so that every backend's job script is tested without that batch system;
:func:`start_pilot_cluster` builds the cluster in the cluster process.

Batch-system facts the translation relies on:

- SLURM asks for GPUs with ``--gres=gpu[:type]:N`` and hands the job
  ``CUDA_VISIBLE_DEVICES``; ``scancel`` sends SIGTERM, then SIGKILL after ``KillWait``.
- HTCondor has no walltime: a running pilot is removed by ``periodic_remove`` once it has
  run that long; GPUs are ``request_gpus``, a GPU type a ``require_gpus`` expression.
- PBS Pro asks for GPUs in a chunk (``select=1:ncpus=C:ngpus=N``), SGE through a
  consumable (``-l gpu=N``; the rest of Grid Engine's side is :mod:`.sge`), LSF with
  ``-gpu "num=N[:gmodel=TYPE]"``.
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
    GANG_TIMEOUT_SECONDS,
    MODEL_CACHE_VARIABLE,
    PILOT_VARIABLE,
    SOURCE_MBPS_VARIABLE,
)
from ..errors import ClusterError
from ..walltime import WalltimeError, WalltimeReading, read_walltime
from .plan import SERVER_DASK_CONFIG
from .sge import GPU_COMPLEX, sge_directives, sge_h_rt

__all__ = [
    "BACKENDS",
    "PilotOptions",
    "jobqueue_arguments",
    "start_pilot_cluster",
    "walltime_of",
]

#: The batch systems pilots can be submitted to, and their dask-jobqueue classes.
BACKENDS: dict[str, str] = {
    "slurm": "SLURMCluster",
    "htcondor": "HTCondorCluster",
    "pbs": "PBSCluster",
    "sge": "SGECluster",
    "lsf": "LSFCluster",
}

#: The module every pilot's worker preloads: it turns the worker into a context server.
PILOT_PRELOAD = "snakemake_executor_context.server.pilot"
#: The module every pilot's nanny preloads: it ends what a dead server left.
PILOT_NANNY_PRELOAD = "snakemake_executor_context.server.orphans"
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
    #: As the backend writes it (see :mod:`...walltime`); a pilot retires before it.
    walltime: str = "01:00:00"
    gpus: int = 1
    #: Pilots that form one server spanning that many nodes (1: each its own).
    nodes: int = 1
    #: The batch system's GPU types (SLURM GRES type, LSF gmodel), one kind of pilot
    #: each; also the model a pilot advertises where NVML sees no GPU.
    gpu_types: tuple[str, ...] = ()
    cores: int = 1
    memory: str = "16GB"
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
    retire_margin: float = 300.0
    lifetime_stagger: float = 60.0
    #: The Python that runs the pilot's server (default: the one running this).
    python: str | None = None
    memory_budget: str = "0.8"
    #: Where pilots write their batch logs (None: the batch system's default).
    log_directory: str | None = None
    #: Node-local directory the prologue stages model weights into, if any.
    model_cache: str | None = None
    #: At most this many pilots load the same context from the shared source at once.
    loads_per_source: int = 2
    #: Jobs a pilot's server runs at once (its Dask threads, not its cores), the
    #: thread pools' size of each (0: the rule's threads) and the batching defaults.
    slots: int = 1
    threads_per_slot: int = 0
    batch_max: int = 0
    batch_wait: float = 0.0
    #: Template sharing between pilots (see :class:`.triples.Shape`).
    peer_transfers: int = 2
    peer_mbps: float = 0.0
    own_caches: str = ""
    model_cache_size: str | None = None
    #: Seconds a gang's collectives may take (a context spanning a pilot's GPUs).
    gang_timeout: float = GANG_TIMEOUT_SECONDS
    extra: dict[str, str] = field(default_factory=dict)

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
        """When a pilot retires: walltime minus margin and stagger, at least 20 s."""
        seconds = walltime_of(self).seconds
        return max(20.0, seconds - self.retire_margin - self.lifetime_stagger)

    def server_settings(self) -> dict[str, Any]:
        """What the pilot's preload reads from :data:`~..defaults.PILOT_VARIABLE`."""
        return {
            "memory_budget": self.memory_budget,
            "gpus": self.gpus,
            "gpu_type": self.gpu_type,
            "walltime_seconds": walltime_of(self).seconds,
            "lifetime_seconds": self.lifetime_seconds(),
            "lifetime_stagger": self.lifetime_stagger,
            "model_cache": self.model_cache,
            "loads_per_source": self.loads_per_source,
            "threads_per_slot": self.threads_per_slot,
            "batch_max": self.batch_max,
            "batch_wait": self.batch_wait,
            "peer_transfers": self.peer_transfers,
            "peer_mbps": self.peer_mbps,
            "own_caches": self.own_caches,
            "model_cache_bytes": self._model_cache_bytes(),
            "gang_timeout": self.gang_timeout,
            "gang_nodes": self.nodes,
            "gang_kind": self.gpu_type or "",
        }

    def _model_cache_bytes(self) -> int:
        from dask.utils import parse_bytes

        return int(parse_bytes(self.model_cache_size)) if self.model_cache_size else 0

    def to_json(self) -> str:
        """These options as JSON (how ``serve`` receives them)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PilotOptions:
        """Options from :meth:`to_json`."""
        data = json.loads(text)
        for key in ("extra_directives", "prologue", "gpu_types"):
            data[key] = tuple(data.get(key) or ())
        return cls(**data)


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


def _gpu_directives(options: PilotOptions) -> tuple[list[str], dict[str, Any]]:
    """Directives (SLURM, LSF) or keyword arguments (PBS, SGE) that ask for GPUs."""
    n, kind = options.gpus, options.gpu_type
    if n <= 0:
        return [], {}
    if options.backend == "slurm":
        return [f"--gres=gpu:{kind}:{n}" if kind else f"--gres=gpu:{n}"], {}
    if options.backend == "lsf":
        spec = f"num={n}" + (f":gmodel={kind}" if kind else "")
        return [f'-gpu "{spec}"'], {}
    if options.backend == "pbs":
        chunk = f"select=1:ncpus={options.cores}:ngpus={n}:mem={_pbs_memory(options.memory)}"
        if kind:
            chunk += f":gpu_model={kind}"
        return [], {"resource_spec": chunk}
    if options.backend == "sge":
        return [], {"resource_spec": f"{GPU_COMPLEX}={n}"}
    return [], {}


def _pbs_memory(memory: str) -> str:
    from dask.utils import parse_bytes

    return f"{max(1, parse_bytes(memory) // 2**20)}mb"


def jobqueue_arguments(
    options: PilotOptions, security: Any = None, python: str = ""
) -> tuple[str, dict[str, Any]]:
    """The dask-jobqueue cluster class name and keyword arguments for these options."""
    if options.backend not in BACKENDS:
        raise ClusterError(
            f"--backend (--context-backend) {options.backend!r} is not a batch system this plugin "
            f"knows: choose one of {', '.join(sorted(BACKENDS))}."
        )
    walltime = walltime_of(options)
    directives, gpu_kwargs = _gpu_directives(options)
    interpreter = f"{options.python or python or sys.executable} -P"
    prologue = [
        # First: when the batch system started the job (it charges from then; the
        # ledger's allocated_before is the time from here to the server's registration).
        f"export {BATCH_STARTED_VARIABLE}=`date +%s.%N`",
        # On the node: the private root and Dask's scratch space in it, or the job ends
        # (backquotes: HTCondor's submit file would take $(...) for one of its macros).
        f"snakemake_context_paths=`{interpreter} -m {PATHS_MODULE} --shell` || exit 1",
        'eval "$snakemake_context_paths"',
        f"export {PILOT_VARIABLE}={shlex.quote(json.dumps(options.server_settings()))}",
    ]
    prologue += [f"export {name}={shlex.quote(value)}" for name, value in _dask_environ()]
    if os.environ.get(SOURCE_MBPS_VARIABLE):
        # The site's cap on reads from a staged source travels with the pilot (a batch
        # system need not export the submitter's environment: Grid Engine does not).
        rate = shlex.quote(os.environ[SOURCE_MBPS_VARIABLE])
        prologue.append(f"export {SOURCE_MBPS_VARIABLE}={rate}")
    if options.model_cache:
        # Loaders keep converted weights there (SmolLM2's does): node-local disk that
        # the user's prologue lines, run next, may stage weights into.
        # Double quotes: $USER, $TMPDIR and the like expand on the node.
        cache = '"' + options.model_cache.replace('"', "") + '"'
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
            "--lifetime",
            f"{int(options.lifetime_seconds())}s",
            "--lifetime-stagger",
            f"{int(options.lifetime_stagger)}s",
            "--no-dashboard",
            # After dask-jobqueue's own --nthreads (its cores): the last one counts.
            "--nthreads",
            str(max(1, options.slots)),
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
    backend = options.backend
    if backend == "slurm":
        directives += [f"--qos={options.qos}"] if options.qos else []
        kwargs.update(queue=options.queue, account=options.account, walltime=options.walltime)
    elif backend == "htcondor":
        condor: dict[str, Any] = {
            "periodic_remove": f"(JobStatus == 2) && "
            f"(time() - EnteredCurrentStatus > {walltime.seconds})"
        }
        if options.gpus > 0:
            condor["request_gpus"] = str(options.gpus)
            if options.gpu_type:
                condor["require_gpus"] = f'DeviceName == "{options.gpu_type}"'
        if options.account:
            condor["accounting_group"] = options.account
        kwargs.update(disk=options.disk, job_extra_directives=condor)
    elif backend == "pbs":
        kwargs.update(
            queue=options.queue,
            account=options.account,
            walltime=walltime.hms,
            **gpu_kwargs,
        )
    elif backend == "sge":
        directives += sge_directives(options.cores, options.memory, options.extra_directives)
        kwargs.update(
            queue=options.queue,
            project=options.account,
            walltime=sge_h_rt(walltime.seconds),
            **gpu_kwargs,
        )
    elif backend == "lsf":
        kwargs.update(
            queue=options.queue,
            project=options.account,
            walltime=walltime.hhmm,
            ncpus=options.cores,
            use_stdin=True,
        )
    if backend != "htcondor":
        kwargs["job_extra_directives"] = directives + list(options.extra_directives)
    elif options.extra_directives:
        extra = dict(kwargs["job_extra_directives"])
        for line in options.extra_directives:
            key, _, value = line.partition("=")
            extra[key.strip()] = value.strip()
        kwargs["job_extra_directives"] = extra
    return BACKENDS[backend], kwargs


def start_pilot_cluster(
    options: PilotOptions,
    scheduler_options: dict[str, Any],
    security: Any = None,
) -> Any:
    """A dask-jobqueue cluster (with no pilots yet) whose scheduler runs here; with
    several GPU types, each new pilot is of the kind :func:`choose_kind` picks."""
    import types

    import dask_jobqueue

    kinds = options.kinds()
    name, kwargs = jobqueue_arguments(kinds[0], security, python=sys.executable)
    cls = getattr(dask_jobqueue, name)
    cluster = cls(scheduler_options=scheduler_options, **kwargs)
    specs = []
    for kind in kinds:
        _, kind_kwargs = jobqueue_arguments(kind, security, python=sys.executable)
        job_only = {k: v for k, v in kind_kwargs.items() if k not in ("security", "interface")}
        specs.append({"cls": cluster.job_cls, "options": {**cluster._job_kwargs, **job_only}})
    cluster.pilot_kinds = {}

    def new_worker_spec(self: Any) -> dict[str, Any]:
        from .pool import kind_wanted

        index = kind_wanted(self, kinds)
        label = kinds[index].gpu_type or options.backend
        number = self._i
        while f"pilot-{label}-{number}" in self.worker_spec:
            number += 1
        self._i = number + 1
        pilot = f"pilot-{label}-{number}"
        self.pilot_kinds[pilot] = index
        return {pilot: specs[index]}

    cluster.new_worker_spec = types.MethodType(new_worker_spec, cluster)
    return cluster
