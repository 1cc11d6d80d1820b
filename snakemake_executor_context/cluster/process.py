"""A local cluster in a process (and session) of its own, seen from the process that
starts or stops it (the executor of a run, ``snakemake-context up``/``down``).

A terminal's Ctrl-C reaches only the Snakemake process, which then stops the jobs and
the cluster in order; Dask's nannies never touch Snakemake's own environment; one
kill of the process group removes everything the cluster started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import paths
from ..errors import ClusterError, UnsafePathError
from ..settings.table import up_flag
from ..strays.processes import pid_alive
from .credentials import open_private_append
from .infofiles import ClusterFiles, identity, kill_group, tail
from .plan import start_wait

__all__ = ["SERVE_MODULE", "LocalClusterProcess"]

#: The module whose ``serve`` command runs a local cluster.
SERVE_MODULE = "snakemake_executor_context.cluster.serve"


def _read_info_or_stop(files: ClusterFiles, process: subprocess.Popen[bytes]) -> object:
    """The cluster's record, or None; a pid file someone else put there while the
    cluster started stops the cluster (its one line is the error)."""
    try:
        return files.read_info()
    except UnsafePathError:
        kill_group(process.pid)
        raise


class LocalClusterProcess:
    """A local cluster in a process (and session) of its own."""

    def __init__(
        self, files: ClusterFiles, process: subprocess.Popen[bytes] | None, pid: int
    ) -> None:
        self.files = files
        self.process = process
        self.pid = pid
        #: What identifies the process, to signal it (and its group) only while the
        #: pid still names it.
        self.identity = identity(pid)

    @classmethod
    def start(
        cls,
        scheduler_file: Path,
        *,
        servers: int | None,
        memory_budget: str,
        timeout: float,
        idle_timeout: float = 0.0,
        parent_pid: int = 0,
        host: str = "127.0.0.1",
        catalog: str | None = None,
        extra_args: Sequence[str] = (),
        own_directory: bool = False,
        tls: bool = True,
        timeout_setting: str = "--context-tuning connect_timeout",
        meanwhile: Callable[[], object] | None = None,
    ) -> LocalClusterProcess:
        """Start the cluster process and wait until its servers are up (``timeout``
        seconds, the setting called ``timeout_setting``, or longer where many servers
        need it: :func:`.plan.start_wait`). Its files go to a directory
        made 0700 if missing (or, ``own_directory``, tightened to 0700); ``tls=False``
        only for benchmarks and tests (a plaintext cluster). ``meanwhile`` runs once
        the process is started, before the wait: this process's own start-up work,
        done while the cluster's runs on another core."""
        files = ClusterFiles(scheduler_file.resolve())
        files.prepare(own_directory=own_directory)
        # The cluster process checks these again; checked here, a planted path is one
        # line of this command instead of a traceback in the cluster's log.
        paths.scratch_dir()
        paths.private_temporary_directory()
        files.remove()
        command = [
            sys.executable,
            # No current directory on sys.path: it may be one others write to.
            "-P",
            "-m",
            SERVE_MODULE,
            "serve",
            "--scheduler-file",
            str(files.scheduler_file),
            up_flag("contexts_memory"),
            str(memory_budget),
            "--idle-timeout",
            str(idle_timeout),
            "--parent-pid",
            str(parent_pid),
            "--host",
            host,
        ]
        if servers is not None:
            command += [up_flag("servers"), str(servers)]
        if catalog:
            command += ["--catalog", catalog]
        if not tls:
            command += ["--no-tls"]
        command += list(extra_args)
        log = open_private_append(files.log_file)
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(log)
        timeout = start_wait(servers, timeout)
        deadline = time.monotonic() + timeout
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                kill_group(process.pid)
                raise
        while _read_info_or_stop(files, process) is None:
            if process.poll() is not None:
                raise ClusterError(
                    f"The local context cluster exited with status {process.returncode} "
                    f"while starting. Its log {files.log_file} ends:\n{tail(files.log_file)}"
                )
            if time.monotonic() > deadline:
                kill_group(process.pid)
                raise ClusterError(
                    f"The local context cluster did not start within {timeout:g} s "
                    f"({timeout_setting}). Its log {files.log_file} ends:\n"
                    f"{tail(files.log_file)}"
                )
            time.sleep(0.05)
        return cls(files, process, process.pid)

    @classmethod
    def find(cls, scheduler_file: Path) -> LocalClusterProcess | None:
        """The cluster process behind a scheduler file, if it runs: the very process
        its pid file names (start time and command line match), never another one that
        got the same pid."""
        files = ClusterFiles(scheduler_file.resolve())
        pid = files.running_pid()
        return cls(files, None, pid) if pid is not None else None

    @classmethod
    def find_to_stop(cls, scheduler_file: Path) -> LocalClusterProcess | None:
        """:meth:`find`, for ``down``: a pid file that is not this user's stops it in
        one line saying why nothing was signalled."""
        try:
            return cls.find(scheduler_file)
        except UnsafePathError as error:
            raise ClusterError(
                f"Signalled nothing for {scheduler_file}: a pid file is trusted only when "
                "it is yours (anyone who can write beside the scheduler file could name "
                f"any process of yours in it). {error}"
            ) from None

    @staticmethod
    def remove_stale(scheduler_file: Path) -> bool:
        """Remove the files of a cluster whose process is gone (or whose pid now names
        another process); whether there were any. Call only once :meth:`find` found
        nothing."""
        files = ClusterFiles(scheduler_file.resolve())
        stale = files.pid_file.exists() or files.scheduler_file.exists()
        if stale:
            files.remove()
        return stale

    def _same(self) -> bool:
        """Whether ``self.pid`` (and its process group) still names the cluster. A
        child of this process keeps its pid while its group lives, even once reaped."""
        if self.process is not None:
            return True
        return bool(self.identity) and identity(self.pid) == self.identity

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the cluster down: SIGTERM (it closes its servers), then kill what is
        left of its session (at once if it does not end in ``timeout``): a server's
        zygote or a worker the cluster process left behind (killed, it closes none)."""
        ours = self._same()
        if ours and pid_alive(self.pid):
            os.kill(self.pid, signal.SIGTERM)
        if not self._wait(timeout) and self._same():
            kill_group(self.pid)
            self._wait(5)
        if ours:
            kill_group(self.pid)
        self.files.remove()

    def kill(self) -> None:
        """Kill the cluster's whole process group at once (Ctrl-C of its run)."""
        if self._same():
            kill_group(self.pid)
        self._wait(10)
        self.files.remove()

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None:
                if self.process.poll() is not None:
                    return True
            elif not pid_alive(self.pid) or identity(self.pid) != self.identity:
                return True
            time.sleep(0.05)
        return False
