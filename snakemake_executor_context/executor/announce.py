"""What a run says at its start: the fleet it runs on, the pilots' walltime, and why
a group's context rules do not use loaded contexts (once per group)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..snakemake_internals import workflow_rules
from .jobbuild import on_servers
from .rulecheck import constant_resource
from .settings import ExecutorSettings

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = ["GroupWarnings", "announce_fleet", "announce_walltime", "group_warning"]


def announce_walltime(settings: ExecutorSettings, say: Callable[[str], None]) -> None:
    """With a pool of pilots, one line on their walltime as the batch system reads it."""
    if settings.backend:
        from ..pilots.arguments import walltime_line
        from ..settings.table import executor_flag

        flag, margin = executor_flag("pilot_walltime"), settings.pilot_retire_margin
        say(walltime_line(settings.backend, settings.pilot_walltime, margin, flag))


def announce_fleet(
    servers: int,
    workflow: Any,
    connection: ClusterConnection,
    say: Callable[[str], None],
    took: float,
) -> None:
    """One line on the fleet (``servers`` known now, started or attached to in ``took``
    seconds), and one on CPU servers standing in for GPUs (if a rule of the workflow
    asks for a GPU)."""
    how = "started" if connection.local is not None else "attached"
    say(
        f"Context executor: {servers} server(s) on the {connection.description}, "
        f"{how} in {took:.1f} s."
    )
    wants_gpu = any(constant_resource(rule, "gpu") for rule in workflow_rules(workflow))
    info = connection.local.files.read_info() if connection.local else None
    stand_ins = [s for s in info.servers if s.gpu is None] if info else []
    if stand_ins and wants_gpu:
        names = ", ".join(s.name for s in stand_ins)
        each = max(s.devices for s in stand_ins)
        say(
            f"No GPU found on this machine: the CPU servers {names} stand "
            f"in for gpu={each}, so GPU rules run on the CPU."
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
    if not members or on_servers(job):
        return None
    return (
        f"Group '{job.groupid}' runs as one subprocess (a member writes a pipe() or "
        f"service() output, whose jobs run at once in one process): its context rule(s) "
        f"{', '.join(members)} load their context in that subprocess, not on a "
        "context server. Fix: take them out of the group to reuse loaded contexts."
    )
