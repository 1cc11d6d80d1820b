"""What the executor does once, when a run starts: connect to (or start) the cluster,
send Dask's client logs to a file, say what the fleet is, warn about groups, and time
each of these steps (:class:`StartSteps`)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import paths
from ..contexts import ContextDeclaration, declarations_from_config
from ..defaults import (
    CONTEXT_DIR,
    LEASE_GRACE_SECONDS,
    MEMORY_CAP_VARIABLE,
    RECYCLE_VARIABLE,
    SERVER_LEASE_SECONDS,
)
from ..dispatch.machine import Dispatch
from ..dispatch.vocabulary import SchedulerLost, Stimulus, StopQueued
from ..errors import ContextExecutorError
from ..fleet.pilotkinds import PilotKinds
from ..settings.shape import Shape
from ..settings.table import plaintext_benchmark, up_flag
from ..snakemake_internals import (
    check_snakemake,
    graceful_shutdown_requested,
    job_group,
    job_is_norun,
    mark_local,
    needrun_jobs,
    preemptible_retries,
    rule_resource,
    wildcard_resource,
    workflow_config,
    workflow_rules,
)
from .recording import run_catalog
from .rulecheck import (
    check_context_rules,
    check_fleet_fits,
    check_pool_fits,
    check_resources,
    check_shared_fs,
    constant_resource,
)
from .settings import ExecutorSettings

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection
    from .localjobs import LocalJobs, NoLocalJobs

__all__ = [
    "StartSteps",
    "checked_declarations",
    "connect",
    "dispatch_options",
    "export_local_dir",
    "export_server_limits",
    "local_plain_jobs",
    "log_dask_to_file",
    "make_dispatch",
    "planned_jobs",
    "process_started",
    "rules_to_run",
    "run_stimuli",
    "wait_for_server",
]


def process_started() -> float:
    """When this (Snakemake's) process started, by the system's clock (now, if the
    system does not say)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def checked_declarations(workflow: Any) -> dict[str, ContextDeclaration]:
    """The run's declared contexts, once the checks at start pass (the Snakemake
    internals the plugin reads, the shared filesystem, every rule that names a context,
    every rule's constant ``gpu`` and ``runtime``)."""
    try:
        check_snakemake()
    except ContextExecutorError as error:  # one line: the plugin's frames say nothing
        raise error.with_traceback(None) from None
    check_shared_fs(workflow.storage_settings.shared_fs_usage)
    declarations = declarations_from_config(workflow_config(workflow))
    methods = {m.item_to_choice() for m in workflow.deployment_settings.deployment_method}
    check_context_rules(workflow_rules(workflow), declarations, methods)
    check_resources(workflow_rules(workflow))
    return declarations


def shape_of(settings: ExecutorSettings) -> Shape:
    """The servers' shape the settings ask for."""
    return Shape.from_args(settings)


def connect(
    settings: ExecutorSettings, workdir: str, run_id: str, say: Callable[[str], None]
) -> ClusterConnection:
    """Attach to the cluster the settings name, or start the run's embedded one (a
    warning, if any, goes to ``say``)."""

    try:
        connection = _connect(settings, workdir, run_id, say)
    except ContextExecutorError as error:
        # A bad setting is the user's, not the plugin's: Snakemake shows the frames an
        # error went through, and the ones inside the plugin say nothing to them.
        raise error.with_traceback(None) from None
    if connection.warning:
        say(connection.warning)
    return connection


def _connect(
    settings: ExecutorSettings, workdir: str, run_id: str, say: Callable[[str], None]
) -> ClusterConnection:
    from ..cluster.connection import ClusterConnection
    from ..pilots.arguments import pilot_settings_args

    cluster_dir = Path(workdir) / CONTEXT_DIR / "cluster"
    pool = pilot_settings_args(settings, str(cluster_dir / f"{run_id}-pilots"))
    export_local_dir(settings)
    if settings.scheduler_address or settings.scheduler_file:
        return ClusterConnection.attach(
            address=settings.scheduler_address,
            scheduler_file=Path(settings.scheduler_file) if settings.scheduler_file else None,
            timeout=settings.connect_timeout,
            credentials=Path(settings.credentials) if settings.credentials else None,
            allow_plaintext=bool(settings.allow_plaintext),
        )
    export_server_limits(settings)
    tls = not plaintext_benchmark()
    if not tls:
        say("A benchmark's switch: this run's embedded cluster runs WITHOUT TLS or credentials.")
    catalog = run_catalog(settings.catalog, workdir, say)
    return ClusterConnection.start_embedded(
        cluster_dir / f"{run_id}.json",
        servers=settings.servers,
        memory_budget=settings.contexts_memory,
        timeout=max(settings.connect_timeout, 60.0),
        catalog=catalog,
        extra_args=[
            *shape_of(settings).serve_args(),
            *[up_flag("server_group"), settings.server_group or ""],
            *(
                [up_flag("interface"), settings.interface]
                if settings.interface and not pool
                else []
            ),
            *pool,
            *["--run-id", run_id],
        ],
        tls=tls,
        meanwhile=_import_for_the_run,
    )


def _import_for_the_run() -> None:
    """Import what this process needs once the cluster is up (Dask's client), while
    the cluster process starts on another core: 0.1-0.2 s that came after the
    cluster's start, before the first job."""
    import distributed  # noqa: F401


def export_local_dir(settings: ExecutorSettings) -> None:
    """--context-local-dir: where this process and the embedded cluster's make the
    private root (see :mod:`..paths`), through the variable they all read."""
    from ..paths import LOCAL_DIR_VARIABLE

    if settings.local_dir:
        os.environ[LOCAL_DIR_VARIABLE] = str(Path(settings.local_dir).expanduser().absolute())


def export_server_limits(settings: ExecutorSettings) -> None:
    """--context-server-memory and --context-tuning recycle_after_leaks (checked with the other
    settings): set for the embedded cluster's servers, through the variables a user
    exports for `snakemake-context up`."""
    if settings.server_memory is not None:
        os.environ[MEMORY_CAP_VARIABLE] = settings.server_memory
    os.environ[RECYCLE_VARIABLE] = str(int(settings.recycle_after_leaks))


def dispatch_options(
    settings: ExecutorSettings, workflow: Any, connection: ClusterConnection, warn: Any
) -> dict[str, Any]:
    """The dispatch machine's loss settings: the budgets, the servers planned (the
    embedded cluster's), how long a job lost with an unconfirmed server waits; and
    whether placement weighs the servers' survival."""
    from ..fleet.losses import Budgets

    budgets = Budgets.resolve(
        settings.preemption_budget, settings.crash_budget, preemptible_retries(workflow)
    )
    info = connection.local.files.read_info() if connection.local else None
    if connection.local is None:
        # Pinned attempts are resubmitted under new keys (one death each); with
        # placement 'dask' Dask reruns the same key, and counts every death.
        total = budgets.preemptions + budgets.crashes + 1
        check_allowed_failures(connection, 1 if settings.placement == "affinity" else total, warn)
    return {
        "embedded": connection.embedded,
        "wait_for_server": settings.wait_for_server,
        "placement": settings.placement,
        "budgets": budgets,
        "planned": len(info.servers) if info else 0,
        "lease_wait": SERVER_LEASE_SECONDS + LEASE_GRACE_SECONDS,
        "survival_placement": bool(settings.survival_placement),
    }


def check_allowed_failures(connection: ClusterConnection, needed: int, warn: Any) -> None:
    """Warn when the attached scheduler's allowed-failures could fail a task before
    the job's budgets do (Dask counts every unexpected death of a task's server)."""
    try:
        allowed = connection.client.run_on_scheduler(_allowed_failures)
    except Exception as error:
        logging.getLogger(__name__).debug("allowed-failures unknown: %r", error)
        return
    if isinstance(allowed, int) and allowed < needed:
        warn(
            f"The attached scheduler's distributed.scheduler.allowed-failures is {allowed}, "
            f"below the {needed} this run's loss budgets need: Dask may fail a job whose "
            "server is lost before the budgets do. Fix: start the scheduler with "
            f"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES={needed} or more (a cluster "
            "started by `snakemake-context up` sets it)."
        )


def _allowed_failures(dask_scheduler: Any) -> int:
    return int(dask_scheduler.allowed_failures)


def make_dispatch(
    run_id: str,
    settings: ExecutorSettings,
    workflow: Any,
    connection: ClusterConnection,
    warn: Callable[[str], None],
) -> Dispatch:
    """The run's dispatch state machine. A pool of pilots is not a fixed fleet: a
    job that fits a kind of pilot waits for one, however long the batch queue takes."""
    options = dispatch_options(settings, workflow, connection, warn)
    kinds = connection.pool_kinds()
    options["embedded"] = connection.embedded and not kinds
    options["wait_for_server"] = wait_for_server(settings, connection, rules_to_run(workflow))
    options["pool"] = PilotKinds.from_summaries(kinds) if kinds else None
    dispatch = Dispatch(run_id, **options)
    # An attached cluster's servers were started with their own setting.
    dispatch.fleet.peer_transfers = settings.peer_transfers > 0 or not connection.embedded
    return dispatch


def run_stimuli(
    dispatch: Dispatch, connection: ClusterConnection, workflow: Any, now: float
) -> list[Stimulus]:
    """What the run must hear before anything else at a status check: the cluster's
    scheduler is gone (every job fails at once, in one line, instead of Dask's
    cancellations and the client's tracebacks), or Snakemake stops after its running
    jobs (SIGTERM: the queued jobs, which no server started, end now)."""
    found: list[Stimulus] = []
    if dispatch.scheduler_lost is None:
        why = connection.scheduler_gone()
        if why is not None:
            connection.abandon_client()
            found.append(SchedulerLost(why, now))
    if dispatch.stopping is None and graceful_shutdown_requested(workflow):
        why = "Snakemake was asked to stop (SIGTERM) and only waits for running jobs"
        found.append(StopQueued(why, now))
    return found


def rules_to_run(workflow: Any) -> list[Any]:
    """The rules of the jobs this run will run (every rule of the workflow when the
    DAG cannot tell): a rule the targets do not need is never checked against servers."""
    try:
        found = {job.rule.name: job.rule for job in needrun_jobs(workflow)}
    except Exception as error:
        logging.getLogger(__name__).debug("no plan from the DAG: %r", error)
        return list(workflow_rules(workflow))
    return list(found.values())


def wait_for_server(settings: ExecutorSettings, connection: ClusterConnection, rules: Any) -> float:
    """How long a job may wait for a server that can run it: with a pool of pilots,
    as long as the batch queue takes (once every rule fits a kind of pilot)."""
    kinds = connection.pool_kinds()
    try:
        if not kinds:
            info = connection.local.files.read_info() if connection.local else None
            if connection.embedded and info and info.servers:
                # The embedded cluster's servers are all there is: a rule none can run
                # fails now, not as each of its jobs' error after a wait.
                check_fleet_fits(rules, info.servers)
            return settings.wait_for_server
        check_pool_fits(rules, kinds)
    except ContextExecutorError as error:  # one line: the plugin's frames say nothing
        raise error.with_traceback(None) from None
    return math.inf


def local_plain_jobs(
    settings: ExecutorSettings,
    workflow: Any,
    connection: ClusterConnection,
    say: Callable[[str], None],
) -> LocalJobs | NoLocalJobs:
    """Mark the plain rules local when plain jobs run in Snakemake's process (see
    :mod:`.localjobs`), and have the servers start their zygotes now if plain jobs
    will still reach them; the local jobs' watchdog."""
    from .localjobs import LocalJobs, NoLocalJobs, local_plain_rules, run_locally

    local: LocalJobs | NoLocalJobs = NoLocalJobs()
    # A pool's pilots are the servers: plain jobs go there, not to the login node.
    embedded = connection.embedded and not connection.pool_kinds()
    if run_locally(settings.plain_jobs, embedded):
        names = local_plain_rules(workflow)
        if names:
            mark_local(workflow, names)
            say(f"Context executor: plain rules run locally: {', '.join(sorted(names))}.")
            local = LocalJobs(workflow)
    if _plain_jobs_for_servers(workflow):
        from ..server.plain import warm_zygote

        try:  # quick: each server only starts a process that imports in the background
            connection.client.run(warm_zygote, on_error="return")
        except Exception as error:
            logging.getLogger(__name__).debug("Cannot warm the servers' zygotes: %r", error)
    return local


def _plain_jobs_for_servers(workflow: Any) -> bool:
    """Whether some job of the DAG runs on a server as Snakemake's job command (a
    group, or a rule without a context that is not local)."""
    try:
        return any(
            not job.is_local
            and (job_group(job) is not None or not constant_resource(job.rule, "context"))
            for job in needrun_jobs(workflow)
        )
    except Exception as error:
        logging.getLogger(__name__).debug("no plan from the DAG: %r", error)
        return False


def log_dask_to_file(workdir: str, run_id: str) -> None:
    """Dask's client logs go to a file: Snakemake's output stays Snakemake's."""
    import distributed  # noqa: F401  (its import installs its own handlers: replace them)

    logs = paths.output_directory(Path(workdir) / CONTEXT_DIR / "logs")
    # Appended without following a symlink, and only to a file of this user's.
    stream = os.fdopen(paths.open_append(logs / f"client-{run_id}.log"), "a")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    # Dask gives some of its loggers handlers of their own (distributed.client's):
    # every logger of these families writes to the file, and only there.
    families = ("distributed", "tornado", "asyncio")
    names = [n for n in logging.Logger.manager.loggerDict if n.split(".")[0] in families]
    for name in {*families, *names}:
        log = logging.getLogger(name)
        log.handlers = [handler] if name in families else []
        log.propagate = name not in families


def planned_jobs(
    workflow: Any, declarations: Mapping[str, ContextDeclaration]
) -> dict[str, str | None] | None:
    """The jobs this run will hand the executor, by Snakemake job id, with the context
    identity each needs (None: none, or not known before it runs: a context given by
    a function of more than the job's wildcards, or a context rule inside a group).
    None if the DAG cannot tell: it is not part of Snakemake's plugin interface."""
    # Local rules run in Snakemake's own process and targets like `all` run nothing:
    # neither reaches the executor, so a run's progress counts the others.
    try:
        jobs = [j for j in needrun_jobs(workflow) if not (j.is_local or job_is_norun(j))]
        contexts: dict[str, str | None] = {}
        planned: dict[str, str | None] = {}
        for job in jobs:
            rule = job.rule.name
            if rule not in contexts:
                name = constant_resource(job.rule, "context")
                found = declarations.get(str(name)) if name else None
                contexts[rule] = found.identity if found else None
            identity = contexts[rule]
            if identity is None and rule_resource(job.rule, "context") is not None:
                # A function of the wildcards (context=lambda wc: ...): this job's own.
                found = declarations.get(str(wildcard_resource(job, "context")))
                identity = found.identity if found else None
            planned[str(job.jobid)] = None if job_group(job) is not None else identity
        return planned
    except Exception as error:
        logging.getLogger(__name__).debug("no plan from the DAG: %r", error)
        return None


class StartSteps:
    """How long each step of a run's start took, for ``--verbose``: Snakemake's own
    (its process's start to the executor's), the executor's checks, the embedded
    cluster's steps as its process recorded them (imports, certificates, scheduler and
    servers), the client's connection, the catalog and the plan. Each step's end, in
    order; :meth:`line` gives their durations."""

    def __init__(self, began: float, first: str = "snakemake") -> None:
        self._last = began
        self._steps: list[tuple[str, float]] = []
        self.mark(first)

    def mark(self, name: str, at: float | None = None) -> None:
        """The step ``name`` ended now (or ``at``): it took the time since the last."""
        at = time.time() if at is None else at
        self._steps.append((name, max(0.0, at - self._last)))
        self._last = max(self._last, at)

    def marks(self, ends: Mapping[str, float]) -> None:
        """Steps another process recorded (name -> when it ended), in time order."""
        for name, at in sorted(ends.items(), key=lambda item: item[1]):
            self.mark(name, at)

    def line(self) -> str:
        """'start-up (s): snakemake 1.20, checks 0.01, ...': one line for the log."""
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self._steps)
        total = sum(seconds for _, seconds in self._steps)
        return f"start-up (s): {parts}; {total:.2f} in all"
