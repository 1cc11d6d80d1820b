"""A workload from a real Snakefile: the jobs and dependencies Snakemake's own DAG
machinery builds (its API, as a dry run does; nothing is parsed here, nothing runs).

Every job of the DAG is taken (as with ``--forceall``: what the whole workflow
costs) unless ``needed_only``; a rule that names a declared context (the
``context`` resource) is a context job, a local rule (``localrule: True`` or
``localrules:``) runs in Snakemake's process, every other job is plain. Items per
job are not in a Snakefile: the catalog's, or the command line's, or 1.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..contexts import declarations_from_config
from ..errors import ContextExecutorError
from ..fleet.resources import requirements_from
from ..snakemake_internals import (
    dag_dependencies,
    dag_needrun_jobs,
    dag_workflow,
    job_group,
    job_is_norun,
    runs_in_snakemake,
    wildcards_dict,
    workflow_dag,
)
from .model import ContextModel
from .workload import SimJob, Workload

__all__ = ["from_snakefile"]


@contextlib.contextmanager
def _kept_cwd() -> Iterator[None]:
    """Snakemake's workflow API changes into the workflow directory: come back."""
    here = os.getcwd()
    try:
        yield
    finally:
        os.chdir(here)


def from_snakefile(
    snakefile: Path | str,
    *,
    workdir: Path | str | None = None,
    config: Mapping[str, Any] | None = None,
    configfiles: Sequence[Path | str] = (),
    targets: Sequence[str] = (),
    needed_only: bool = False,
) -> Workload:
    """The workload of a Snakefile (see the module's docstring)."""
    path = Path(snakefile).absolute()
    if not path.exists():
        raise ContextExecutorError(f"No Snakefile at {path}. Fix: name one with -s.")
    where = Path(workdir).absolute() if workdir else None
    quiet = io.StringIO()
    try:
        with _kept_cwd(), contextlib.redirect_stdout(quiet):
            dag, workflow_config = workflow_dag(
                path,
                where,
                config or {},
                [Path(f).absolute() for f in configfiles],
                targets,
                needed_only,
            )
            jobs = [job for job in dag_needrun_jobs(dag) if not job_is_norun(job)]
            declared = declarations_from_config(workflow_config)
            made = _jobs(dag, jobs, declared)
    except ContextExecutorError:
        raise
    except Exception as error:  # Snakemake's own: a syntax error, a missing input
        raise ContextExecutorError(
            f"Snakemake could not build the DAG of {path}: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        ) from None
    contexts = {
        decl.name: ContextModel(name=decl.name, identity=decl.identity)
        for decl in declared.values()
        if any(job.context == decl.name for job in made)
    }
    return Workload(made, contexts, source=str(path))


def _jobs(dag: Any, jobs: list[Any], declared: Mapping[str, Any]) -> list[SimJob]:
    ids = {job: str(job.jobid) for job in jobs}
    made: list[SimJob] = []
    for job in sorted(jobs, key=lambda j: j.jobid):
        # A ResourceList iterates over its values: ask it for its names.
        names = list(job.resources.keys())
        resources = {name: job.resources.get(name) for name in names}
        context = resources.get("context")
        local = runs_in_snakemake(dag_workflow(dag), job.rule)
        if context and not local and job_group(job) is None:
            if str(context) not in declared:
                raise ContextExecutorError(
                    f"Rule '{job.rule.name}' names context {context!r}, which the Snakefile "
                    f"does not declare (declared: {sorted(declared) or 'none'}). Fix: "
                    "declare_context(config, ...) it."
                )
            kind = "context"
        else:
            kind, context = ("local" if local else "plain"), None
        deps = tuple(sorted(ids[dep] for dep in dag_dependencies(dag, job) if dep in ids))
        made.append(
            SimJob(
                jobid=ids[job],
                rule=job.rule.name,
                kind=kind,
                context=str(context) if context else None,
                deps=deps,
                requirements=requirements_from(resources),
                # The rule's: a job's own priority needs the scheduler's, which a dry run lacks.
                priority=int(getattr(job.rule, "priority", 0) or 0),
                wildcards=tuple(sorted((k, str(v)) for k, v in wildcards_dict(job).items())),
            )
        )
    return _in_order(made)


def _in_order(jobs: list[SimJob]) -> list[SimJob]:
    """Jobs ordered so that each comes after the jobs it depends on."""
    by_id = {job.jobid: job for job in jobs}
    done: set[str] = set()
    out: list[SimJob] = []

    def visit(job: SimJob) -> None:
        stack = [(job, iter(job.deps))]
        while stack:
            current, deps = stack[-1]
            for dep in deps:
                if dep not in done and dep in by_id:
                    stack.append((by_id[dep], iter(by_id[dep].deps)))
                    break
            else:
                stack.pop()
                if current.jobid not in done:
                    done.add(current.jobid)
                    out.append(current)

    for job in jobs:
        visit(job)
    return out
