"""What an in-process job may change in the server process, and how it is undone.

A job sees what Snakemake's script preamble gives it in a fresh interpreter; nothing
it changes in the process (cwd, environment, ``sys.path``, ``sys.modules['__main__']``,
``sys.argv``, stdout/stderr, thread pools, tempfile's directory, the ``shell()``
defaults) outlives it. What is *not* isolated: globals of imported modules (like the
loaded context itself), threads the job leaves running, open files.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..jobspec import ContextJobSpec

__all__ = [
    "THREAD_VARIABLES",
    "TMPDIR_VARIABLES",
    "process_state",
    "redirected_output",
    "thread_limits",
    "torch_threads",
]

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


@contextmanager
def redirected_output(fd: int) -> Iterator[None]:
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
def process_state(spec: ContextJobSpec) -> Iterator[None]:
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
def thread_limits(
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
