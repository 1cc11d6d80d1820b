"""Turning a Snakemake job into what a server runs: a context job spec (in-process)
or a plain job spec (Snakemake's own job command), plus names for keys and messages."""

from __future__ import annotations

import os
import pickle
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .contexts import ContextDeclaration

if TYPE_CHECKING:
    from .jobspec import ContextJobSpec, PlainJobSpec

__all__ = ["SpecBuilder", "job_wildcards", "priority", "rule_name", "task_key", "title"]

#: Where the executor keeps its files in the workflow directory (logs, runs, cluster).
CONTEXT_DIR = Path(".snakemake") / "context"


class SpecBuilder:
    """Builds job specs for one run (caches each rule's script source)."""

    def __init__(
        self,
        workflow: Any,
        workdir: str,
        run_id: str,
        job_command: Callable[[Any], str],
        envvars: Callable[[], dict[str, str]],
    ) -> None:
        self.workflow = workflow
        self.workdir = workdir
        self.run_id = run_id
        self.job_command = job_command
        self.envvars = envvars
        self._scripts: dict[str, tuple[Any, ...]] = {}

    def log_path(self, job: Any, key: str) -> str:
        name = job.groupid if job.is_group() else job.rule.name
        wildcards = (
            "" if job.is_group() else ",".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
        )
        label = re.sub(r"[^A-Za-z0-9_.,=+-]+", "_", wildcards)[:80] or "job"
        return str(CONTEXT_DIR / "logs" / _safe(name) / f"{label}.{key.rsplit('-', 1)[-1]}.log")

    def plain(self, job: Any, key: str) -> PlainJobSpec:
        from .jobspec import PlainJobSpec

        return PlainJobSpec(
            key=key,
            title=title(job),
            command=self.job_command(job),
            workdir=str(self.workflow.workdir_init),
            log_path=self.log_path(job, key),
            outputs=[str(f) for f in job.output],
            run_id=self.run_id,
        )

    def context(self, job: Any, key: str, declaration: ContextDeclaration) -> ContextJobSpec:
        from snakemake.common import get_snakemake_searchpaths
        from snakemake.io import is_flagged
        from snakemake.iocontainers import Snakemake
        from snakemake.sourcecache import LocalSourceFile

        from .jobspec import ContextJobSpec, OutputSpec

        source_file, source, _, is_local, cache_path = self._script_source(job)
        if isinstance(source_file, LocalSourceFile):
            script_path = os.path.realpath(source_file.get_path_or_uri(secret_free=True))
        else:
            script_path = source_file.get_path_or_uri(secret_free=True)
        scriptdir = source_file.get_basedir().get_path_or_uri(secret_free=True)
        search_paths = get_snakemake_searchpaths()
        if cache_path:
            search_paths.append(os.path.dirname(cache_path))
        if is_local:
            search_paths.append(scriptdir)
        snakemake_object = Snakemake(
            job.input,
            job.output,
            job.params,
            job.wildcards,
            job.threads,
            job.resources,
            job.log,
            self.workflow.config,
            job.rule.name,
            None,
            scriptdir,
        )
        benchmark = str(job.benchmark) if job.benchmark is not None else None
        return ContextJobSpec(
            key=key,
            rule=job.rule.name,
            jobid=job.jobid,
            title=title(job),
            declaration=declaration,
            workdir=self.workdir,
            script_path=script_path,
            script_source=source,
            search_paths=search_paths,
            snakemake_pickle=pickle.dumps(snakemake_object, protocol=4),
            inputs=[str(f) for f in job.input],
            outputs=[
                OutputSpec(
                    str(f), is_directory=bool(f.is_directory), keep=bool(is_flagged(f, "update"))
                )
                for f in job.output
            ],
            logs=[str(f) for f in job.log],
            benchmark=benchmark,
            benchmark_repeats=job.benchmark_repeats or 1,
            benchmark_extended=bool(
                getattr(self.workflow.output_settings, "benchmark_extended", False)
            ),
            threads=int(job.threads),
            envvars=dict(self.envvars()),
            latency_wait=float(self.workflow.execution_settings.latency_wait),
            log_path=self.log_path(job, key),
            shell_exec=job.resources.get("shell_exec"),
            run_id=self.run_id,
        )

    def _script_source(self, job: Any) -> tuple[Any, ...]:
        """snakemake.script.get_source for the job's script, cached per rule."""
        from snakemake.script import get_source

        rule = job.rule
        cacheable = "{" not in str(rule.script)
        if cacheable and rule.name in self._scripts:
            return self._scripts[rule.name]
        found = get_source(
            rule.script, self.workflow.sourcecache, rule.basedir, job.wildcards, job.params
        )
        if cacheable:
            self._scripts[rule.name] = found
        return found


def task_key(job: Any) -> str:
    """A unique Dask key: rule (or group), job id, attempt, and a random suffix."""
    name = job.groupid if job.is_group() else job.rule.name
    return f"{_safe(str(name))}-{job.jobid}-a{job.attempt}-{uuid.uuid4().hex[:8]}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def title(job: Any) -> str:
    """'Rule 'score' (shard=3)' or 'Group 'g'', for messages."""
    if job.is_group():
        return f"Group '{job.groupid}'"
    wildcards = ", ".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
    return f"Rule '{job.rule.name}'" + (f" ({wildcards})" if wildcards else "")


def rule_name(job: Any) -> str:
    """The rule's name ('group <id>' for a group job)."""
    if job is None:
        return ""
    return f"group {job.groupid}" if job.is_group() else str(job.rule.name)


def job_wildcards(job: Any) -> dict[str, str]:
    """The job's wildcards as strings ({} for a group)."""
    if job is None or job.is_group():
        return {}
    return {str(k): str(v) for k, v in job.wildcards_dict.items()}


def priority(job: Any) -> int:
    """Snakemake's job priority, clamped for Dask."""
    priority = getattr(job, "priority", 0) or 0
    return int(max(-(10**9), min(10**9, priority)))
