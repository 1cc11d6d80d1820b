"""What travels between the executor and a server: job specs and job results, and
how a job's declared outputs are removed (by the server before a job runs, by either
side when a job is cancelled).

Plain data only (dataclasses of strings, numbers and bytes), so that the same
objects pickle between processes and hosts, and tests can build them by hand.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .contexts import ContextDeclaration
from .fleet.outcome import Outcome

__all__ = [
    "RULE_PARTS",
    "ContextJobSpec",
    "GroupJobSpec",
    "JobResult",
    "OutputSpec",
    "PlainJobSpec",
    "RulePart",
    "remove_outputs",
    "remove_path",
]


@dataclass(frozen=True)
class OutputSpec:
    """One declared output file of a job, with the flags that change its handling."""

    path: str
    is_directory: bool = False
    #: Flagged `update()`: Snakemake does not remove it before the job runs.
    keep: bool = False


#: Where the scheduler's metadata holds a run's rule parts for its servers:
#: ``[*RULE_PARTS, run_id, digest]``.
RULE_PARTS = ("snakemake-context", "rule-parts")


@dataclass(frozen=True)
class RulePart:
    """What the ``snakemake`` objects of one rule's jobs share (the workflow's config,
    the rule's params that are not per-job), pickled once per rule. Its digest names it
    always; its bytes travel once to the scheduler, from which a server that lacks them
    fetches them once (:mod:`.server.inprocess`), and only there ride with a spec."""

    #: sha256 of :attr:`data`: a server never runs a job with another rule part.
    digest: str
    #: The pickled part; None once the scheduler holds it.
    data: bytes | None = None


@dataclass
class ContextJobSpec:
    """A context job, run in-process by a server (see :mod:`.server.inprocess`)."""

    key: str
    rule: str
    jobid: int
    #: Human name of the job (rule and wildcards), for messages.
    title: str
    declaration: ContextDeclaration
    #: The workflow's working directory; the job runs with it as cwd.
    workdir: str
    #: The script's path as the preamble sets ``__file__`` (real path or URL).
    script_path: str
    script_source: str
    #: The ``sys.path`` entries the preamble appends, for this job only.
    search_paths: list[str]
    #: The job's own part of its ``snakemake`` object (pickled with protocol 4, as the
    #: preamble does): what its rule's jobs share is references into ``rule_part``.
    snakemake_pickle: bytes
    rule_part: RulePart
    inputs: list[str]
    outputs: list[OutputSpec]
    logs: list[str]
    benchmark: str | None
    benchmark_repeats: int
    benchmark_extended: bool
    threads: int
    #: Environment variables of the rule (``envvars:`` and ``--envvars``).
    envvars: dict[str, str]
    latency_wait: float
    #: Per-job log of stdout, stderr and the traceback, relative to ``workdir``.
    log_path: str
    shell_exec: str | None = None
    #: The run that submitted it (recorded in the catalog).
    run_id: str = ""
    #: False: the server drops the context at the job's end (context-agnostic runs).
    reuse: bool = True
    #: Whether the script's copy under .snakemake/scripts/ goes after the job
    #: (False with --skip-script-cleanup).
    cleanup_scripts: bool = True
    #: The rule's ``runtime`` resource (minutes): the job is stopped after it.
    runtime_minutes: float | None = None


@dataclass
class PlainJobSpec:
    """A job without a context: Snakemake's own job command, run as a subprocess."""

    key: str
    title: str
    command: str
    workdir: str
    log_path: str
    outputs: list[str] = field(default_factory=list)
    #: The run that submitted it (recorded in the catalog).
    run_id: str = ""
    #: The rule's name, for messages about its limits.
    rule: str = ""
    #: The rule's ``runtime`` resource (minutes): the job is stopped after it.
    runtime_minutes: float | None = None


@dataclass
class GroupJobSpec:
    """A Snakemake group with a context member, run as one dispatch on one server:
    each member by its own route (a context member in-process, a plain member as
    its own job command), layer after layer of the group's topological order, the
    members of a layer at once as the server's slots allow."""

    key: str
    title: str
    workdir: str
    #: The group's own log (which member ran, how each ended), relative to ``workdir``.
    log_path: str
    #: The members, by layer (a layer's members do not depend on each other).
    layers: list[list[ContextJobSpec | PlainJobSpec]]
    #: Per layer: the ``temp()`` files only the group needs, removed after it.
    temp_ends: list[list[str]] = field(default_factory=list)
    run_id: str = ""

    @property
    def members(self) -> list[ContextJobSpec | PlainJobSpec]:
        """Every member, in the order they run."""
        return [member for layer in self.layers for member in layer]

    @property
    def outputs(self) -> list[OutputSpec]:
        """Every member's outputs."""
        return [
            out if isinstance(out, OutputSpec) else OutputSpec(out)
            for member in self.members
            for out in member.outputs
        ]


@dataclass
class JobResult:
    """A job's result, as a server reports it back to the executor: its
    :class:`~.fleet.outcome.Outcome` (the one record of what it did there), and what
    only its executor reads."""

    outcome: Outcome
    #: On failure: what went wrong, naming rule, context and fix.
    message: str | None = None
    #: The job's per-job log (absolute path), passed to Snakemake as an aux log.
    log_path: str | None = None
    #: What the server says beside: "warnings" and "notes" for the run's log,
    #: "leaks", "batches" (batched calls the job led, by size).
    extra: dict[str, Any] = field(default_factory=dict)
    #: A group's: the result of each member that ran, in the order they started, then
    #: one for each member not run (cancelled, never started).
    members: list[JobResult] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The attempt's key."""
        return self.outcome.key

    @property
    def ok(self) -> bool:
        """Whether the job succeeded."""
        return self.outcome.ok

    def end(self, message: str | None = None, **changes: Any) -> None:
        """Change how it ended (``ok``, ``cancelled``, times...), and its message."""
        self.outcome = self.outcome.but(**changes)
        if message is not None:
            self.message = message


def remove_path(path: str, *, is_directory: bool = False) -> None:
    """Remove one output or log file; a ``directory()`` output with its contents. A
    plain output that is a directory is removed only if empty (Snakemake does the
    same), and ``/dev/null`` never."""
    if os.path.isdir(path) and not os.path.islink(path):
        if is_directory:
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.removedirs(path)
            except OSError:
                pass
    elif os.path.lexists(path) and path != os.devnull:
        try:
            os.remove(path)
        except OSError:
            pass


def remove_outputs(outputs: Iterable[OutputSpec]) -> None:
    """Remove a job's declared outputs (see :func:`remove_path`)."""
    for out in outputs:
        remove_path(out.path, is_directory=out.is_directory)
