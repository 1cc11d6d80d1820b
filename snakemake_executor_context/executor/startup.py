"""What the executor does once, when a run starts: connect to (or start) the cluster,
send Dask's client logs to a file, say what the fleet is, and warn about groups."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contexts import ContextDeclaration, declarations_from_config
from ..defaults import CONTEXT_DIR
from .rulecheck import check_context_rules, check_shared_fs, constant_resource
from .settings import ExecutorSettings

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = [
    "NO_TLS_VARIABLE",
    "GroupWarnings",
    "announce_fleet",
    "checked_declarations",
    "connect",
    "group_warning",
    "log_dask_to_file",
    "planned_jobs",
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
    check_memory_budget(settings.memory_budget, "--context-memory-budget")
    if settings.scheduler_address is not None:
        parse_address(settings.scheduler_address, "--context-scheduler-address")
    if not settings.connect_timeout > 0:
        raise ClusterError(
            f"--context-connect-timeout {settings.connect_timeout} is not allowed: "
            "a number of seconds above 0."
        )


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
        Path(workdir) / CONTEXT_DIR / "cluster" / f"{run_id}.json",
        servers=settings.servers,
        memory_budget=settings.memory_budget,
        timeout=max(settings.connect_timeout, 60.0),
        tls=tls,
    )


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


def announce_fleet(
    say: Callable[[str], None], connection: ClusterConnection, servers: int, rules: Iterable[Any]
) -> None:
    """One line on the fleet, and one on CPU servers standing in for GPUs."""
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
