"""Run a context job's Python script inside the server process.

This is the in-process contract: the script sees what Snakemake's script preamble
gives it in a fresh interpreter (``PythonScript.generate_preamble``), after the server
did what the per-job subprocess does (wait for inputs, remove stale outputs, create
output directories, set tmpdir, envvars and thread counts), and nothing the job
changes in the process (cwd, environment, ``sys.path``, ``sys.modules['__main__']``,
``sys.argv``, stdout/stderr, thread pools) outlives it.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ContextExecutorError, ContextLoadError, JobCancelled
from .jobspec import ContextJobSpec, JobResult, OutputSpec, ServerIdentity

__all__ = ["RunningJob", "run_context_job"]

#: What Snakemake's shell() sets for a script subprocess (snakemake/shell.py).
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
TMPDIR_VARIABLES = ("TMPDIR", "TMP", "TEMPDIR", "TEMP")

_compiled: dict[tuple[str, int], types.CodeType] = {}


@dataclass
class RunningJob:
    """A job a server is running now; the handle cancellation goes through."""

    key: str
    thread_id: int
    cancel_requested: bool = False
    #: True while the job runs code a cancellation may interrupt (loader, script).
    interruptible: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    #: The subprocess of a plain job.
    process: Any = None

    def request_cancel(self) -> None:
        """Stop the job: kill a plain job's process tree, or raise JobCancelled in
        an in-process job's thread at its next Python instruction."""
        import ctypes

        with self.lock:
            if self.cancel_requested:
                return
            self.cancel_requested = True
            if self.process is not None:
                self.kill_process()
            elif self.interruptible:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(JobCancelled)
                )

    def kill_process(self, grace: float = 3.0) -> None:
        """SIGTERM the plain job's process tree, SIGKILL what is left after ``grace``."""
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            tree = [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(tree, timeout=grace)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass

    @contextmanager
    def interruptible_phase(self) -> Iterator[None]:
        """Code inside may be interrupted by a cancellation."""
        with self.lock:
            if self.cancel_requested:
                raise JobCancelled()
            self.interruptible = True
        try:
            yield
        finally:
            with self.lock:
                self.interruptible = False


AcquireFn = Callable[[Any], Any]


def run_context_job(
    spec: ContextJobSpec,
    server: ServerIdentity,
    acquire: AcquireFn,
    job: RunningJob,
    set_torch_threads: Callable[[int], Callable[[], None] | None] | None = None,
) -> JobResult:
    """Run one context job in this process and report its outcome.

    ``acquire(declaration)`` returns the loaded context (loading it if needed); the
    server passes one that records loads and pins the context for this job.
    """
    started = time.time()
    workdir = Path(spec.workdir)
    log_path = workdir / spec.log_path
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result = JobResult(
        key=spec.key,
        ok=False,
        server=server,
        started=started,
        finished=started,
        log_path=str(log_path),
    )
    with open(log_path, "wb", buffering=0) as log_file, ExitStack() as stack:
        stack.enter_context(_redirected_output(log_file.fileno()))
        stack.enter_context(_process_state(spec))
        try:
            _prepare(spec)
            with job.interruptible_phase():
                acquire(spec.declaration)
            with _thread_limits(spec.threads, set_torch_threads):
                records = _run_script(spec, job)
            _check_outputs(spec)
            if spec.benchmark:
                _write_benchmark(spec, records)
            result.ok = True
        except JobCancelled:
            result.cancelled = True
            result.message = f"{spec.title}: cancelled on {server.describe()}."
            os.chdir(spec.workdir)
            _remove_outputs(spec.outputs)
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
            result.message = f"{spec.title}: {error} (log: {log_path})"
        except BaseException as error:
            _print_script_traceback(error, spec.script_path)
            result.message = (
                f"{spec.title} (context '{spec.declaration.name}') failed on "
                f"{server.describe()}: {type(error).__name__}: {error}. The traceback "
                f"ends the job's log {log_path}."
            )
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    result.finished = time.time()
    return result


class _ScriptExit(Exception):
    def __init__(self, code: Any) -> None:
        super().__init__(code)
        self.code = code


# --------------------------------------------------------------------------------------
# Before the script: what Snakemake's job.prepare() does in the per-job subprocess.


def _prepare(spec: ContextJobSpec) -> None:
    _wait_for_inputs(spec)
    _remove_outputs([out for out in spec.outputs if not out.keep])
    for path in spec.logs:
        _remove_path(path, is_directory=False)
    parents = [out.path for out in spec.outputs] + list(spec.logs)
    if spec.benchmark:
        parents.append(spec.benchmark)
    for path in parents:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)


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


def _remove_outputs(outputs: list[OutputSpec]) -> None:
    for out in outputs:
        _remove_path(out.path, out.is_directory)


def _remove_path(path: str, is_directory: bool) -> None:
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
        except FileNotFoundError:
            pass


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
# Process state: saved before the job, restored after it.


@contextmanager
def _redirected_output(fd: int) -> Iterator[None]:
    """Send fd 1 and 2 (and Python's sys.stdout/sys.stderr) to the job's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = (os.dup(1), os.dup(2))
    saved_streams = (sys.stdout, sys.stderr)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    stdout = io.TextIOWrapper(open(os.dup(fd), "wb", buffering=0), write_through=True)
    stderr = io.TextIOWrapper(open(os.dup(fd), "wb", buffering=0), write_through=True)
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdout, sys.stderr = saved_streams
        stdout.close()
        stderr.close()
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])


@contextmanager
def _process_state(spec: ContextJobSpec) -> Iterator[None]:
    """cwd, environment, sys.path, sys.argv, __main__ and tempfile: set, then restored."""
    from snakemake.shell import shell

    saved_cwd = os.getcwd()
    saved_environ = dict(os.environ)
    saved_path = list(sys.path)
    saved_argv = list(sys.argv)
    saved_main = sys.modules.get("__main__")
    saved_tempdir = tempfile.tempdir
    saved_shell_args = dict(shell._process_args)
    tmpdir = tempfile.gettempdir()
    try:
        os.chdir(spec.workdir)
        os.environ.update(spec.envvars)
        for name in THREAD_VARIABLES:
            os.environ[name] = str(spec.threads)
        for name in TMPDIR_VARIABLES:
            os.environ[name] = tmpdir
        os.makedirs(tmpdir, exist_ok=True)
        tempfile.tempdir = tmpdir
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
        sys.argv[:] = saved_argv
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        tempfile.tempdir = saved_tempdir
        shell._process_args.clear()
        shell._process_args.update(saved_shell_args)


@contextmanager
def _thread_limits(
    threads: int, set_torch_threads: Callable[[int], Callable[[], None] | None] | None
) -> Iterator[None]:
    """Thread pools (BLAS/OpenMP through threadpoolctl, torch) sized to the rule's threads."""
    from threadpoolctl import threadpool_limits

    restore_torch = set_torch_threads(threads) if set_torch_threads else None
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        if restore_torch is not None:
            restore_torch()


def torch_threads(threads: int) -> Callable[[], None] | None:
    """Set torch's intra-op threads if torch is loaded; return how to undo it."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    return lambda: torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------
# The script itself.


def _run_script(spec: ContextJobSpec, job: RunningJob) -> list[Any]:
    code = _compile(spec)
    repeats = spec.benchmark_repeats if spec.benchmark else 1
    sys.path.extend(spec.search_paths)
    sys.argv[:] = [spec.script_path]
    records = []
    for iteration in range(repeats):
        snakemake = _unpickle_snakemake(spec)
        snakemake.bench_iteration = iteration if spec.benchmark else None
        namespace = _script_namespace(spec, snakemake)
        if spec.benchmark:
            from snakemake.benchmark import BenchmarkRecord, benchmarked

            record = BenchmarkRecord()
            with benchmarked(os.getpid(), record):
                _exec(code, namespace, job)
            records.append((record, snakemake))
        else:
            _exec(code, namespace, job)
    return records


def _exec(code: types.CodeType, namespace: dict[str, Any], job: RunningJob) -> None:
    module = types.ModuleType("__main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = module
    try:
        with job.interruptible_phase():
            exec(code, module.__dict__)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise _ScriptExit(exit_.code) from None


def _compile(spec: ContextJobSpec) -> types.CodeType:
    key = (spec.script_path, hash(spec.script_source))
    code = _compiled.get(key)
    if code is None:
        code = compile(spec.script_source, spec.script_path, "exec", dont_inherit=True)
        if len(_compiled) > 256:
            _compiled.clear()
        _compiled[key] = code
    return code


def _unpickle_snakemake(spec: ContextJobSpec) -> Any:
    from snakemake.common.tbdstring import TBDString

    snakemake = pickle.loads(spec.snakemake_pickle)
    resources = snakemake.resources
    tmpdir = resources.get("tmpdir") if hasattr(resources, "get") else None
    if isinstance(tmpdir, TBDString) or tmpdir == "<TBD>":
        _set_named(resources, "tmpdir", tempfile.gettempdir())
    return snakemake


def _set_named(namedlist: Any, name: str, value: Any) -> None:
    start, end = namedlist._names[name]
    if end is None or end == start + 1:
        namedlist[start] = value
    setattr(namedlist, name, value)


def _script_namespace(spec: ContextJobSpec, snakemake: Any) -> dict[str, Any]:
    """The globals the preamble leaves behind in a fresh interpreter."""
    import builtins

    from snakemake.iocontainers import Snakemake
    from snakemake.logging import logger

    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "__file__": spec.script_path,
        "__real_file__": spec.script_path,
        "sys": sys,
        "pickle": pickle,
        "snakemake": snakemake,
        "logger": logger,
        "Snakemake": Snakemake,
    }
    if spec.shell_exec is not None:
        from snakemake.shell import shell

        shell.executable(spec.shell_exec)
    return namespace


def _write_benchmark(spec: ContextJobSpec, records: list[Any]) -> None:
    from snakemake.benchmark import write_benchmark_records

    assert spec.benchmark is not None
    bench_records = []
    for record, snakemake in records:
        record.jobid = spec.jobid
        record.rule_name = spec.rule
        record.wildcards = snakemake.wildcards
        record.params = snakemake.params
        record.resources = snakemake.resources
        record.input = list(snakemake.input)
        record.threads = snakemake.threads
        bench_records.append(record)
    path = os.path.join(spec.workdir, spec.benchmark)
    write_benchmark_records(bench_records, path, spec.benchmark_extended)


def _print_script_traceback(error: BaseException, script_path: str) -> None:
    """The traceback from the script's first frame on (the server's frames are noise)."""
    tb = error.__traceback__
    frames = tb
    while frames is not None and frames.tb_frame.f_code.co_filename != script_path:
        frames = frames.tb_next
    if isinstance(error, ContextLoadError) or frames is None:
        frames = tb
    sys.stderr.write("".join(traceback.format_exception(type(error), error, frames)))
