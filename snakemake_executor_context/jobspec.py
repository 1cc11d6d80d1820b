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

__all__ = [
    "ContextJobSpec",
    "JobResult",
    "OutputSpec",
    "PlainJobSpec",
    "ServerIdentity",
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


@dataclass
class ContextJobSpec:
    """A context job, run in-process by a server (see :mod:`.inprocess`)."""

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
    #: The ``snakemake`` object, pickled with protocol 4 as the preamble does.
    snakemake_pickle: bytes
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


@dataclass(frozen=True)
class ServerIdentity:
    """Which server ran a job."""

    name: str
    host: str
    pid: int
    address: str = ""

    def describe(self) -> str:
        """'server-0 on host (pid 123)'."""
        return f"{self.name} on {self.host} (pid {self.pid})"


@dataclass
class JobResult:
    """The outcome of a job, as a server reports it back to the executor."""

    key: str
    ok: bool
    server: ServerIdentity
    started: float
    finished: float
    #: On failure: what went wrong, naming rule, context and fix.
    message: str | None = None
    #: The job's per-job log (absolute path), passed to Snakemake as an aux log.
    log_path: str | None = None
    #: Seconds this job spent loading contexts (0.0 when every context was warm).
    load_seconds: float = 0.0
    #: Identities this job loaded (cold) and found loaded (warm).
    loaded: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    #: Identities the server evicted to make room during this job.
    evicted: list[str] = field(default_factory=list)
    #: Conversions its load did, and how long that load took after converting.
    conversions: int = 0
    reload_seconds: float | None = None
    #: Work done, as the script reported through report_items().
    items: int = 0
    cancelled: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


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
