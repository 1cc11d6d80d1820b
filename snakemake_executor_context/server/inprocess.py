"""Run a context job's Python script inside the server process.

This is the in-process contract: the script sees what Snakemake's script preamble
gives it in a fresh interpreter (``PythonScript.generate_preamble``), after the server
did what the per-job subprocess does (wait for inputs, remove stale outputs, create
output directories, set tmpdir, envvars and thread counts), and nothing the job
changes in the process outlives it (:mod:`.isolation`).

The ``snakemake`` object comes in two parts: the job's own, in its spec, and its
rule's (the config, the params every job shares), which the spec names by digest:
the server keeps the parts it saw, and fetches one it lacks from the scheduler once.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import traceback
import types
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

from ..errors import ContextExecutorError, ContextLoadError, JobCancelled
from ..fleet.outcome import Outcome, ServerIdentity
from ..jobspec import RULE_PARTS, ContextJobSpec, JobResult, remove_outputs, remove_path
from ..snakemake_internals import (
    benchmarked_here,
    load_script_object,
    script_globals,
    set_shell_executable,
    write_benchmark,
)
from ..terminal import error_text
from .output import Leaks, job_output
from .policy import server_fault
from .processwide import main_thread_only, make_dirs, open_own_file
from .running import RunningJob
from .scriptchild import ScriptChildren, stand_in_main
from .slots.sharing import SharedGroup, job_main

__all__ = ["run_context_job"]

_compiled: dict[tuple[str, int], types.CodeType] = {}


AcquireFn = Callable[[Any], Any]


def run_context_job(
    spec: ContextJobSpec,
    server: ServerIdentity,
    acquire: AcquireFn,
    job: RunningJob,
    set_torch_threads: Callable[[int], Callable[[], None] | None] | None = None,
    owned_modules: Callable[[], Collection[str]] = frozenset,
    group: SharedGroup | None = None,
) -> JobResult:
    """Run one context job in this process and report its outcome.

    ``acquire(declaration)`` returns the loaded context (loading it if needed); the
    server passes one that records loads and pins the context for this job.
    ``owned_modules()`` names the modules loaded contexts keep. What the job left
    behind (threads, open files) is in ``result.extra["leaks"]`` and
    ``result.extra["warnings"]``, and at the end of its log. ``group`` holds the
    process state of the jobs running beside it (:mod:`.slots.sharing`); without one, the
    job has the process to itself.
    """
    started = time.time()
    workdir = Path(spec.workdir)
    log_path = workdir / spec.log_path
    outcome = Outcome(spec.key, server, started=started, finished=started)
    result = JobResult(outcome, log_path=str(log_path))
    shared = group if group is not None else SharedGroup()
    with open(open_own_file(str(log_path)), "wb", buffering=0) as log_file:
        with ExitStack() as stack:
            leaks = stack.enter_context(job_output(spec.title, log_file.fileno()))
            stack.enter_context(shared.job(spec, set_torch_threads, owned_modules))
            _run_guarded(spec, server, acquire, job, result, log_path, shared)
        _report_leaks(leaks, spec, server, result, log_file)
    result.end(finished=time.time())
    return result


def _report_leaks(
    leaks: Leaks, spec: ContextJobSpec, server: ServerIdentity, result: JobResult, log: Any
) -> None:
    if not leaks:
        return
    message = leaks.describe(spec.title, server.describe())
    log.write(f"\n[snakemake-context] warning: {message}\n".encode())
    result.extra["leaks"] = {"threads": leaks.threads, "fds": leaks.fds}
    result.extra.setdefault("warnings", []).append(message)


def _run_guarded(
    spec: ContextJobSpec,
    server: ServerIdentity,
    acquire: AcquireFn,
    job: RunningJob,
    result: JobResult,
    log_path: Path,
    shared: SharedGroup,
) -> None:
    """The job's steps; every failure becomes the result's message."""
    try:
        rule_part = _rule_part(spec)
        _prepare(spec)
        with job.interruptible_phase():
            acquire(spec.declaration)
        shared.add_search_paths(spec)
        records = _run_script(spec, rule_part, job)
        _check_outputs(spec)
        if spec.benchmark:
            _write_benchmark(spec, records)
        result.end(ok=True)
    except JobCancelled:
        result.end(f"{spec.title}: cancelled on {server.describe()}.", cancelled=True)
        os.chdir(spec.workdir)
        remove_outputs(spec.outputs)
        print(f"\n[snakemake-context] {result.message}", file=sys.stderr)
    except _ScriptExit as exit_:
        result.message = (
            f"{spec.title}: the script called sys.exit({exit_.code!r}) on "
            f"{server.describe()}. See the job's log {log_path}."
        )
    except ContextExecutorError as error:
        if error.__cause__ is not None:
            traceback.print_exception(error.__cause__, file=sys.stderr)
        print(f"[snakemake-context] {error}", file=sys.stderr)
        result.end(
            f"{spec.title}: {error_text(error, typed=False)} (log: {log_path})",
            fault=server_fault(error),
        )
    except BaseException as error:
        _print_script_traceback(error, spec.script_path)
        why = main_thread_only(error)
        result.end(
            f"{spec.title} (context '{spec.declaration.name}') failed on "
            f"{server.describe()}: {error_text(error)}. {why + '. ' if why else ''}The "
            f"traceback ends the job's log {log_path}.",
            fault=server_fault(error),
        )
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class _ScriptExit(Exception):
    def __init__(self, code: Any) -> None:
        super().__init__(code)
        self.code = code


# --------------------------------------------------------------------------------------
# Before the script: what Snakemake's job.prepare() does in the per-job subprocess.


def _prepare(spec: ContextJobSpec) -> None:
    _wait_for_inputs(spec)
    remove_outputs(out for out in spec.outputs if not out.keep)
    for path in spec.logs:
        remove_path(path)
    parents = [out.path for out in spec.outputs] + list(spec.logs)
    if spec.benchmark:
        parents.append(spec.benchmark)
    for path in parents:
        make_dirs(os.path.dirname(path))


def _wait_for_inputs(spec: ContextJobSpec) -> None:
    deadline = time.monotonic() + spec.latency_wait
    missing = [path for path in spec.inputs if not os.path.exists(path)]
    while missing and time.monotonic() < deadline:
        time.sleep(0.25)
        missing = [path for path in missing if not os.path.exists(path)]
    if missing:
        raise ContextExecutorError(
            f"inputs missing on the server after waiting {spec.latency_wait:g} s "
            f"(--latency-wait): {', '.join(missing)}. Fix: make the workflow directory "
            "a filesystem the servers share, or raise --latency-wait."
        )


def _check_outputs(spec: ContextJobSpec) -> None:
    # Against the workdir: the script may have changed the cwd.
    missing = [
        out.path for out in spec.outputs if not os.path.exists(os.path.join(spec.workdir, out.path))
    ]
    if missing:
        raise ContextExecutorError(
            f"the script finished, but declared output {', '.join(repr(p) for p in missing)} "
            "is missing. Fix: write it from the script, or remove it from the rule's output."
        )


# --------------------------------------------------------------------------------------
# The script itself.


def _run_script(spec: ContextJobSpec, rule_part: bytes, job: RunningJob) -> list[Any]:
    code = _compile(spec)
    repeats = spec.benchmark_repeats if spec.benchmark else 1
    records = []
    pickled = (spec.snakemake_pickle, rule_part)
    with _script_copy(spec) as real_file:
        for iteration in range(repeats):
            snakemake = load_script_object(*pickled)
            snakemake.bench_iteration = iteration if spec.benchmark else None
            namespace = _script_namespace(spec, snakemake, real_file)
            children = ScriptChildren(spec.script_path, spec.script_source, real_file, pickled)
            try:
                if spec.benchmark:
                    with benchmarked_here() as record:
                        _exec(code, namespace, job, children)
                    records.append((record, snakemake))
                else:
                    _exec(code, namespace, job, children)
            finally:
                children.close()
    return records


#: How many rule parts a server keeps, and their bytes in all (the last one is kept
#: whatever its size).
RULE_PARTS_KEPT = 64
RULE_PARTS_BYTES = 256 * 2**20
#: Seconds a rule part may take to arrive from the scheduler.
RULE_PART_FETCH_SECONDS = 120.0


class _RuleParts:
    """The rule parts this server has, by digest: the most recently used, up to
    :data:`RULE_PARTS_KEPT` of them and :data:`RULE_PARTS_BYTES` in all."""

    def __init__(self) -> None:
        self._parts: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        """The part of that digest, if this server has it."""
        with self._lock:
            data = self._parts.get(digest)
            if data is not None:
                self._parts.move_to_end(digest)
            return data

    def keep(self, digest: str, data: bytes) -> None:
        """Keep a part, dropping the least recently used beyond the bounds."""
        with self._lock:
            self._parts[digest] = data
            self._parts.move_to_end(digest)
            total = sum(len(kept) for kept in self._parts.values())
            while len(self._parts) > 1 and (
                len(self._parts) > RULE_PARTS_KEPT or total > RULE_PARTS_BYTES
            ):
                total -= len(self._parts.popitem(last=False)[1])


_rule_parts = _RuleParts()


def _rule_part(spec: ContextJobSpec) -> bytes:
    """The bytes of the job's rule part: from its spec, else from this server's
    parts, else fetched from the scheduler (a server new to the rule, restarted, or
    one that dropped it), checked against its digest."""
    part = spec.rule_part
    data = part.data if part.data is not None else _rule_parts.get(part.digest)
    if data is None:
        data = _fetch_rule_part(spec.run_id, part.digest)
        if hashlib.sha256(data).hexdigest() != part.digest:
            raise ContextExecutorError(
                f"the scheduler's rule part {part.digest[:12]} of run {spec.run_id} is "
                "not the one the job names. Fix: report this as a bug of the plugin."
            )
    _rule_parts.keep(part.digest, data)
    return data


def _fetch_rule_part(run_id: str, digest: str) -> bytes:
    from distributed.utils import sync

    worker = _this_worker()
    where = [*RULE_PARTS, run_id, digest]
    data = sync(
        worker.loop,
        worker.scheduler.get_metadata,
        keys=where,
        default=None,
        callback_timeout=RULE_PART_FETCH_SECONDS,
    )
    if not isinstance(data, bytes):
        raise ContextExecutorError(
            f"the scheduler holds no rule part {digest[:12]} for run {run_id} (it "
            "restarted since the run handed it over?). Fix: run the workflow again."
        )
    return data


def _this_worker() -> Any:
    """This process's Dask worker. A job with limits runs in a thread of its own,
    where get_worker() (a context variable of the task's thread) finds none."""
    from distributed.worker import Worker, get_worker

    try:
        return get_worker()
    except ValueError:
        worker = next(iter(Worker._instances), None)
    if worker is None:
        raise ContextExecutorError(
            "its rule part is not in its spec, and this process is no Dask worker that "
            "could fetch it from the scheduler. Fix: report this as a bug of the plugin."
        )
    return worker


@contextmanager
def _script_copy(spec: ContextJobSpec) -> Iterator[str]:
    """The script's copy under .snakemake/scripts/, as Snakemake writes one for each
    script job (the script's ``__real_file__``); kept with --skip-script-cleanup."""
    directory = os.path.join(spec.workdir, ".snakemake", "scripts")
    os.makedirs(directory, exist_ok=True)
    suffix = "." + os.path.basename(spec.script_path)
    descriptor, path = tempfile.mkstemp(suffix=suffix, dir=directory)
    source = spec.script_source
    with os.fdopen(descriptor, "wb") as copy:
        copy.write(source if isinstance(source, bytes) else source.encode())
    try:
        yield path
    finally:
        if spec.cleanup_scripts:
            with suppress(FileNotFoundError):
                os.remove(path)
        else:
            print(f"Not cleaning up {path}", file=sys.stderr)


def _exec(
    code: types.CodeType, namespace: dict[str, Any], job: RunningJob, children: ScriptChildren
) -> None:
    module = stand_in_main(children)
    module.__dict__.update(namespace)
    try:
        with job_main(module), job.interruptible_phase():
            exec(code, module.__dict__)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise _ScriptExit(exit_.code) from None
    failure = children.failure()
    if failure is not None:
        raise ContextExecutorError(
            f"a child process the script started could not start: {failure}. Under the "
            "spawn and forkserver start methods each child runs the script again as "
            "__mp_main__ before its target. Fix: put the script's work under "
            "if __name__ == '__main__':, or use the default start method (fork)."
        )


def _compile(spec: ContextJobSpec) -> types.CodeType:
    key = (spec.script_path, hash(spec.script_source))
    code = _compiled.get(key)
    if code is None:
        code = compile(spec.script_source, spec.script_path, "exec", dont_inherit=True)
        if len(_compiled) > 256:
            _compiled.clear()
        _compiled[key] = code
    return code


def _script_namespace(spec: ContextJobSpec, snakemake: Any, real_file: str) -> dict[str, Any]:
    """The globals the preamble leaves behind in a fresh interpreter."""
    import builtins

    namespace = {
        "__name__": "__main__",
        "__builtins__": builtins,
        **script_globals(spec.script_path, real_file, snakemake),
    }
    if spec.shell_exec is not None:
        set_shell_executable(spec.shell_exec)
    return namespace


def _write_benchmark(spec: ContextJobSpec, records: list[Any]) -> None:
    assert spec.benchmark is not None
    path = os.path.join(spec.workdir, spec.benchmark)
    write_benchmark(records, path, spec.benchmark_extended, spec.jobid, spec.rule)


def _print_script_traceback(error: BaseException, script_path: str) -> None:
    """The traceback from the script's first frame on (the server's frames are noise)."""
    tb = error.__traceback__
    frames = tb
    while frames is not None and frames.tb_frame.f_code.co_filename != script_path:
        frames = frames.tb_next
    if isinstance(error, ContextLoadError) or frames is None:
        frames = tb
    sys.stderr.write("".join(traceback.format_exception(type(error), error, frames)))
