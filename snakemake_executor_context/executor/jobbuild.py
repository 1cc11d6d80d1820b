"""Turning a Snakemake job into what dispatch and a server need: its ticket (key,
names, requirements, priority) and its spec, a context job spec (run in-process) or
a plain job spec (Snakemake's own job command)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import snakemake_internals as internals
from ..contexts import ContextDeclaration, undeclared
from ..defaults import CONTEXT_DIR
from ..dispatch.vocabulary import JobTicket
from ..errors import ContextExecutorError
from ..fleet.keys import job_key, safe_name
from ..fleet.resources import Requirements, job_resources, requirements_from, widest
from ..jobspec import OutputSpec, RulePart
from ..terminal import shown

if TYPE_CHECKING:
    from ..jobspec import ContextJobSpec, PlainJobSpec

__all__ = [
    "SpecBuilder",
    "job_wildcards",
    "label",
    "on_servers",
    "output_paths",
    "output_specs",
    "priority",
    "rule_name",
    "runtime_minutes",
    "ticket",
    "title",
]


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
        self._rule_parts: dict[str, tuple[internals.RuleShared, RulePart]] = {}

    def build(
        self, job: Any, declarations: Mapping[str, ContextDeclaration]
    ) -> tuple[JobTicket, Any, ContextExecutorError | None]:
        """A job's ticket and spec, or (an invalid job) its ticket and why it is one."""
        if on_servers(job):
            return self.group(job, declarations)
        context = None if job.is_group() else job.resources.get("context")
        try:
            if context:
                declaration = declarations.get(str(context))
                if declaration is None:
                    raise undeclared(job.rule.name, context, declarations)
                made = ticket(job, kind="context", declaration=declaration)
                spec: Any = self.context(job, made.key, declaration)
            else:
                made = ticket(job, kind="plain")
                spec = self.plain(job, made.key)
            return dataclasses.replace(made, log_path=spec.log_path), spec, None
        except ContextExecutorError as error:
            return ticket(job, kind="invalid"), None, error

    def group(
        self, job: Any, declarations: Mapping[str, ContextDeclaration]
    ) -> tuple[JobTicket, Any, ContextExecutorError | None]:
        """A group with a context member: one dispatch, each member built as a job
        of its own (its ticket, key, log and spec), the group's requirements those
        of its widest member (:func:`..fleet.resources.widest`)."""
        from ..jobspec import GroupJobSpec

        layers: list[list[Any]] = []
        members: list[JobTicket] = []
        for layer in job.toposorted:
            specs = []
            for member in sorted(layer, key=lambda m: m.jobid):
                made, spec, error = self.build(member, declarations)
                if error is not None:
                    return ticket(job, kind="invalid"), None, error
                spec.title = f"{spec.title} in group '{shown(job.groupid)}'"  # its messages'
                members.append(made)
                specs.append(spec)
            layers.append(specs)
        models = {t.requirements.gpu_model for t in members if t.requirements.gpu_model}
        if len(models) > 1:
            error = ContextExecutorError(
                f"{title(job)} asks for GPU models {', '.join(sorted(models))} in one "
                "group: its members run on one server. Fix: give its rules one "
                "gpu_model, or put them in groups of their own."
            )
            return ticket(job, kind="invalid"), None, error
        identities = Counter(t.identity for t in members if t.identity)
        lead = next(t for t in members if t.identity == identities.most_common(1)[0][0])
        made = ticket(job, kind="group", requirements=widest(t.requirements for t in members))
        made = dataclasses.replace(
            made,
            identity=lead.identity,
            context=lead.context,
            shareable=all(t.shareable for t in members),
            members=tuple(members),
        )
        spec = GroupJobSpec(
            key=made.key,
            title=made.title,
            workdir=self.workdir,
            log_path=self.log_path(job, made.key),
            layers=layers,
            temp_ends=internals.group_temp_ends(job),
            run_id=self.run_id,
        )
        return dataclasses.replace(made, log_path=spec.log_path), spec, None

    def log_path(self, job: Any, key: str) -> str:
        """The job's log under the workflow's context directory (group ids may be
        integers: ``group: 0``)."""
        name = job.groupid if job.is_group() else job.rule.name
        wildcards = (
            ""
            if job.is_group()
            else ",".join(f"{k}={v}" for k, v in internals.wildcards_dict(job).items())
        )
        text = re.sub(r"[^A-Za-z0-9_.,=+-]+", "_", wildcards)[:80] or "job"
        suffix = key.rsplit("-", 1)[-1]
        return str(CONTEXT_DIR / "logs" / safe_name(name) / f"{text}.{suffix}.log")

    def plain(self, job: Any, key: str) -> PlainJobSpec:
        """A job without a context: Snakemake's own job command."""
        from ..jobspec import PlainJobSpec

        return PlainJobSpec(
            key=key,
            title=title(job),
            command=self.job_command(job),
            workdir=str(self.workflow.workdir_init),
            log_path=self.log_path(job, key),
            outputs=[str(f) for f in job.output],
            run_id=self.run_id,
            rule=rule_name(job),
            runtime_minutes=runtime_minutes(job),
        )

    def context(self, job: Any, key: str, declaration: ContextDeclaration) -> ContextJobSpec:
        """A context job: its script, run in a server's process."""
        from ..jobspec import ContextJobSpec

        source_file, source, _, is_local, cache_path = self._script_source(job)
        located = internals.script_location(source_file, is_local, cache_path)
        script_path, scriptdir, search_paths = located
        config = internals.workflow_config(self.workflow)
        snakemake_object = internals.script_object(job, config, scriptdir)
        shared, rule_part = self._rule_part(job.rule, config)
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
            snakemake_pickle=internals.pickle_script_object(snakemake_object, shared),
            rule_part=rule_part,
            inputs=[str(f) for f in job.input],
            outputs=output_specs(job),
            logs=[str(f) for f in job.log],
            benchmark=benchmark,
            benchmark_repeats=internals.benchmark_repeats(job) or 1,
            benchmark_extended=internals.benchmark_extended(self.workflow),
            threads=int(job.threads),
            envvars=dict(self.envvars()),
            latency_wait=internals.latency_wait(self.workflow),
            log_path=self.log_path(job, key),
            shell_exec=job.resources.get("shell_exec"),
            run_id=self.run_id,
            reuse=not getattr(self.workflow.executor_settings, "agnostic", False),
            cleanup_scripts=internals.cleanup_scripts(self.workflow),
            runtime_minutes=runtime_minutes(job),
        )

    def _rule_part(self, rule: Any, config: Any) -> tuple[internals.RuleShared, RulePart]:
        """What the rule's jobs' ``snakemake`` objects share, pickled once per rule
        (the config and the rule's params are fixed once its jobs run)."""
        found = self._rule_parts.get(rule.name)
        if found is None:
            shared = internals.rule_shared(rule, config)
            digest = hashlib.sha256(shared.pickled).hexdigest()
            found = self._rule_parts[rule.name] = (shared, RulePart(digest, shared.pickled))
        return found

    def _script_source(self, job: Any) -> tuple[Any, ...]:
        """snakemake.script.get_source for the job's script, cached per rule."""
        rule = job.rule
        cacheable = "{" not in internals.rule_script(rule)
        if cacheable and rule.name in self._scripts:
            return self._scripts[rule.name]
        found = internals.script_source(job, self.workflow)
        if cacheable:
            self._scripts[rule.name] = found
        return found


def on_servers(job: Any) -> bool:
    """Whether a group job runs as one dispatch on a server (it has a context member
    and no member writes a pipe or a service, whose members must run at once in a
    process of their own), rather than as Snakemake's own group subprocess."""
    if not job.is_group():
        return False
    members = list(job.jobs)
    return any(m.resources.get("context") for m in members) and not any(
        internals.is_flagged(f, "pipe") or internals.is_flagged(f, "service")
        for m in members
        for f in m.output
    )


def ticket(
    job: Any,
    *,
    kind: str,
    declaration: ContextDeclaration | None = None,
    requirements: Requirements | None = None,
) -> JobTicket:
    """What dispatch knows of a job: a fresh job key, names, requirements, priority."""
    name = job.groupid if job.is_group() else job.rule.name
    if requirements is None:
        requirements = requirements_from(job.resources)
    return JobTicket(
        key=job_key(name, job.jobid, int(job.attempt or 1), uuid.uuid4().hex[:8]),
        label=label(job),
        title=title(job),
        rule=rule_name(job),
        jobid=str(job.jobid),
        snakemake_attempt=int(job.attempt or 1),
        wildcards=job_wildcards(job),
        kind=kind,
        requirements=requirements,
        wanted=job_resources(requirements),
        identity=declaration.identity if declaration else None,
        context=declaration.name if declaration else None,
        shareable=declaration.shareable if declaration else True,
        priority=priority(job),
        submitted=time.time(),
        outputs=output_paths(job),
        jobs=len(job.jobs) if job.is_group() else 1,
    )


def output_specs(job: Any) -> list[OutputSpec]:
    """The job's declared outputs, with what changes their removal."""
    return [
        OutputSpec(
            str(f),
            is_directory=internals.is_directory(f),
            keep=internals.is_flagged(f, "update"),
        )
        for f in job.output
    ]


def output_paths(job: Any) -> tuple[str, ...]:
    """Every output file of the job (a group's: each of its jobs', the files one
    passes to the next too), as Snakemake names them (relative to the workflow
    directory unless absolute), normalized."""
    members = job.jobs if job.is_group() else (job,)
    return tuple(sorted({os.path.normpath(str(f)) for member in members for f in member.output}))


def label(job: Any) -> str:
    """ "rule 'score'" or "group 'g'", for messages (names shown escaped)."""
    return f"group '{shown(job.groupid)}'" if job.is_group() else f"rule '{shown(job.rule.name)}'"


def title(job: Any) -> str:
    """'Rule 'score' (shard=3)' or 'Group 'g'', for messages: a wildcard value holding
    an ESC sequence or a newline is shown escaped (:func:`..terminal.shown`)."""
    if job.is_group():
        return f"Group '{shown(job.groupid)}'"
    pairs = internals.wildcards_dict(job).items()
    wildcards = ", ".join(f"{shown(k)}={shown(v)}" for k, v in pairs)
    return f"Rule '{shown(job.rule.name)}'" + (f" ({wildcards})" if wildcards else "")


def rule_name(job: Any) -> str:
    """The rule's name ('group <id>' for a group job)."""
    if job is None:
        return ""
    return f"group {job.groupid}" if job.is_group() else str(job.rule.name)


def job_wildcards(job: Any) -> dict[str, str]:
    """The job's wildcards as strings ({} for a group)."""
    if job is None or job.is_group():
        return {}
    return {str(k): str(v) for k, v in internals.wildcards_dict(job).items()}


def priority(job: Any) -> int:
    """Snakemake's job priority, clamped for Dask."""
    priority = internals.job_priority(job)
    return int(max(-(10**9), min(10**9, priority)))


def runtime_minutes(job: Any) -> float | None:
    """The job's ``runtime`` resource in minutes (Snakemake's unit), or None."""
    value = job.resources.get("runtime") if hasattr(job.resources, "get") else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
