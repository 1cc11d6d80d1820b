"""What the executor does once, when a run starts: connect to (or start) the cluster,
send Dask's client logs to a file, say what the fleet is, and warn about groups."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cluster.triples import Shape
from ..contexts import ContextDeclaration, declarations_from_config
from ..defaults import CONTEXT_DIR
from ..errors import ContextExecutorError
from .dispatch import Dispatch
from .pooldemand import DEMAND_KEY, pool_demand
from .rulecheck import check_context_rules, check_pool_fits, check_shared_fs, constant_resource
from .settings import ExecutorSettings

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection
    from .localjobs import LocalJobs, NoLocalJobs

__all__ = [
    "NO_TLS_VARIABLE",
    "GroupWarnings",
    "announce_fleet",
    "checked_declarations",
    "connect",
    "dispatch_options",
    "group_warning",
    "local_plain_jobs",
    "log_dask_to_file",
    "make_dispatch",
    "planned_jobs",
    "publish_demand",
    "wait_for_server",
]


#: Benchmarks and tests only: ``SNAKEMAKE_CONTEXT_BENCH_NO_TLS=1`` starts the embedded
#: cluster without TLS (to measure what TLS costs, in one run). Never for real use.
NO_TLS_VARIABLE = "SNAKEMAKE_CONTEXT_BENCH_NO_TLS"


def checked_declarations(workflow: Any) -> dict[str, ContextDeclaration]:
    """The run's declared contexts, once the checks at start pass (the shared
    filesystem, every rule that names a context)."""
    check_shared_fs(workflow.storage_settings.shared_fs_usage)
    declarations = declarations_from_config(workflow.config)
    methods = {m.item_to_choice() for m in workflow.deployment_settings.deployment_method}
    check_context_rules(workflow.rules, declarations, methods)
    return declarations


def check_settings(settings: ExecutorSettings) -> None:
    """Refuse a bad setting at start, in one line naming it, its value and what is
    allowed (before any cluster starts or any connection is tried)."""
    from ..cluster.attach import parse_address
    from ..cluster.plan import check_memory_budget, check_servers
    from ..errors import ClusterError

    check_servers(settings.servers, "--context-servers")
    shape_of(settings).check()
    check_memory_budget(settings.memory_budget, "--context-memory-budget")
    if settings.scheduler_address is not None:
        parse_address(settings.scheduler_address, "--context-scheduler-address")
    if not settings.connect_timeout > 0:
        raise ClusterError(
            f"--context-connect-timeout {settings.connect_timeout} is not allowed: "
            "a number of seconds above 0."
        )


def shape_of(settings: ExecutorSettings) -> Shape:
    """The servers' shape and batching defaults the settings ask for."""
    return Shape(settings.slots, settings.threads_per_slot, settings.batch_max, settings.batch_wait)


def connect(
    settings: ExecutorSettings, workdir: str, run_id: str, say: Callable[[str], None]
) -> ClusterConnection:
    """Attach to the cluster the settings name, or start the run's embedded one (a
    warning, if any, goes to ``say``)."""
    from ..errors import ContextExecutorError

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
    from ..cluster.pilot_args import pilot_settings_args

    cluster_dir = Path(workdir) / CONTEXT_DIR / "cluster"
    pool = pilot_settings_args(settings, str(cluster_dir / f"{run_id}-pilots"))
    if pool and (settings.scheduler_address or settings.scheduler_file):
        raise ContextExecutorError(
            "--context-backend starts a pool of pilots for this run; it cannot be combined "
            "with --context-scheduler-file/--context-scheduler-address. Fix: drop one (a "
            "pool kept across runs: snakemake-context up --backend ...)."
        )
    check_settings(settings)
    if settings.scheduler_address or settings.scheduler_file:
        return ClusterConnection.attach(
            address=settings.scheduler_address,
            scheduler_file=Path(settings.scheduler_file) if settings.scheduler_file else None,
            timeout=settings.connect_timeout,
            credentials=Path(settings.credentials) if settings.credentials else None,
            allow_plaintext=bool(settings.allow_plaintext),
        )
    from .serverlimits import export_server_limits

    export_server_limits(settings)
    tls = os.environ.get(NO_TLS_VARIABLE, "") != "1"
    if not tls:
        say(f"{NO_TLS_VARIABLE}=1: the embedded cluster runs WITHOUT TLS (benchmarks only).")
    return ClusterConnection.start_embedded(
        cluster_dir / f"{run_id}.json",
        servers=settings.servers,
        memory_budget=settings.memory_budget,
        timeout=max(settings.connect_timeout, 60.0),
        extra_args=[*shape_of(settings).serve_args(), *pool],
        tls=tls,
    )


def dispatch_options(
    settings: ExecutorSettings, workflow: Any, connection: ClusterConnection, warn: Any
) -> dict[str, Any]:
    """The dispatch machine's loss settings: the budgets, the servers planned (the
    embedded cluster's), how long a job lost with an unconfirmed server waits."""
    from ..fleet.losses import Budgets
    from ..server.server import ServerConfig

    remote = getattr(workflow, "remote_execution_settings", None)
    budgets = Budgets.resolve(
        settings.preemption_budget,
        settings.crash_budget,
        getattr(remote, "preemptible_retries", None),
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
        "planned": len((info or {}).get("servers", [])),
        "lease_wait": ServerConfig.lease + LEASE_GRACE,
    }


#: Seconds beyond a server's lease before its lost jobs run elsewhere.
LEASE_GRACE = 5.0


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


def make_dispatch(executor: Any) -> Dispatch:
    """The executor's dispatch state machine. A pool of pilots is not a fixed fleet: a
    job that fits a kind of pilot waits for one, however long the batch queue takes."""
    settings, connection = executor.settings, executor.connection
    workflow = executor.workflow
    options = dispatch_options(settings, workflow, connection, executor.logger.warning)
    options["embedded"] = connection.embedded and not connection.pool_kinds()
    options["wait_for_server"] = wait_for_server(settings, connection, workflow.rules)
    return Dispatch(executor.run_id, **options)


def publish_demand(connection: ClusterConnection, dispatch: Dispatch) -> None:
    """Tell the cluster's pool of pilots, if any, what the run still asks of it."""
    connection.client.set_metadata(DEMAND_KEY, pool_demand(dispatch))


def wait_for_server(settings: ExecutorSettings, connection: ClusterConnection, rules: Any) -> float:
    """How long a job may wait for a server that can run it: with a pool of pilots,
    as long as the batch queue takes (once every rule fits a kind of pilot)."""
    kinds = connection.pool_kinds()
    if not kinds:
        return settings.wait_for_server
    check_pool_fits(rules, kinds)
    return math.inf


def local_plain_jobs(executor: Any) -> LocalJobs | NoLocalJobs:
    """Mark the plain rules local when plain jobs run in Snakemake's process (see
    :mod:`.localjobs`), and have the servers start their zygotes now if plain jobs
    will still reach them; the local jobs' watchdog."""
    from .localjobs import LocalJobs, NoLocalJobs, local_plain_rules, mark_local, run_locally

    workflow = executor.workflow
    local: LocalJobs | NoLocalJobs = NoLocalJobs()
    # A pool's pilots are the servers: plain jobs go there, not to the login node.
    embedded = executor.connection.embedded and not executor.connection.pool_kinds()
    if run_locally(executor.settings.plain_jobs, embedded):
        names = local_plain_rules(workflow)
        if names:
            mark_local(workflow, names)
            say = executor.logger.info
            say(f"Context executor: plain rules run locally: {', '.join(sorted(names))}.")
            local = LocalJobs(workflow)
    if _plain_jobs_for_servers(workflow):
        from ..server.plain import warm_zygote

        try:  # quick: each server only starts a process that imports in the background
            executor.connection.client.run(warm_zygote, on_error="return")
        except Exception as error:
            executor.logger.debug(f"Cannot warm the servers' zygotes: {error}")
    return local


def _plain_jobs_for_servers(workflow: Any) -> bool:
    """Whether some job of the DAG runs on a server as Snakemake's job command (a
    group, or a rule without a context that is not local)."""
    try:
        return any(
            not job.is_local
            and (job.group is not None or not constant_resource(job.rule, "context"))
            for job in workflow.dag.needrun_jobs()
        )
    except Exception as error:
        logging.getLogger(__name__).debug("no plan from the DAG: %r", error)
        return False


def log_dask_to_file(workdir: str, run_id: str) -> None:
    """Dask's client logs go to a file: Snakemake's output stays Snakemake's."""
    path = Path(workdir) / CONTEXT_DIR / "logs" / f"client-{run_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("distributed", "tornado", "asyncio"):
        log = logging.getLogger(name)
        log.handlers = [handler]
        log.propagate = False


def planned_jobs(
    workflow: Any, declarations: Mapping[str, ContextDeclaration]
) -> dict[str, str | None] | None:
    """The jobs this run will hand the executor, by Snakemake job id, with the context
    identity each needs (None: none, or not known before it runs: a context given by
    a function, or a context rule inside a group). None if the DAG cannot tell: it is
    not part of Snakemake's plugin interface."""
    # Local rules run in Snakemake's own process and targets like `all` run nothing:
    # neither reaches the executor, so a run's progress counts the others.
    try:
        jobs = [j for j in workflow.dag.needrun_jobs() if not (j.is_local or j.is_norun)]
        contexts: dict[str, str | None] = {}
        planned: dict[str, str | None] = {}
        for job in jobs:
            rule = job.rule.name
            if rule not in contexts:
                name = constant_resource(job.rule, "context")
                found = declarations.get(str(name)) if name else None
                contexts[rule] = found.identity if found else None
            planned[str(job.jobid)] = None if job.group is not None else contexts[rule]
        return planned
    except Exception as error:
        logging.getLogger(__name__).debug("no plan from the DAG: %r", error)
        return None


def announce_fleet(executor: Any) -> None:
    """One line on the fleet, and one on CPU servers standing in for GPUs."""
    say, connection = executor.logger.info, executor.connection
    servers, rules = len(executor.dispatch.fleet.servers), executor.workflow.rules
    say(f"Context executor: {servers} server(s) on the {connection.description}.")
    wants_gpu = any(constant_resource(rule, "gpu") for rule in rules)
    info = connection.local.files.read_info() if connection.local else None
    stand_ins = [s["name"] for s in (info or {}).get("servers", []) if s.get("gpu") is None]
    if stand_ins and wants_gpu:
        say(
            f"No GPU found on this machine: the CPU servers {', '.join(stand_ins)} stand "
            "in for gpu=1, so GPU rules run on the CPU."
        )


class GroupWarnings:
    """Says once per group why its context rules do not use loaded contexts."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()

    def __call__(self, job: Any) -> str | None:
        """The warning for ``job``, if it is a group not warned about yet."""
        if not job.is_group() or job.groupid in self._seen:
            return None
        self._seen.add(job.groupid)
        return group_warning(job)


def group_warning(job: Any) -> str | None:
    """Why a group's context rules do not use the servers' loaded contexts (or None)."""
    members = sorted({j.rule.name for j in job.jobs if j.resources.get("context")})
    if not members:
        return None
    return (
        f"Group '{job.groupid}' runs as one subprocess: its context rule(s) "
        f"{', '.join(members)} load their context in that subprocess, not on a "
        "context server. Fix: take them out of the group to reuse loaded contexts."
    )
