"""Plain jobs on a server, started cheaply: a per-server process that has imported
Snakemake and discovered its plugins once, and forks a child per job that runs
Snakemake's own job command line (``snakemake.cli.main``) from there.

A fresh ``python -m snakemake`` spends most of its time importing (about 1.5 of
1.7 s for an ``echo`` job here); the fork skips that, and everything after it is
Snakemake's own code, with the job's arguments, environment and working directory. A
command this cannot run the same way (a ``--precommand``, another Python, another
``PYTHONPATH``) runs as a subprocess, as before.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from typing import Any

from ..snakemake_internals import preload_job_command, run_snakemake_main
from ..strays.processes import OWN, become_subreaper, process_tree, stop_processes

__all__ = ["Zygote", "parse_command"]


def parse_command(
    command: str, python: str = sys.executable
) -> tuple[dict[str, str], list[str]] | None:
    """The exported variables and Snakemake arguments of a job command of the form
    ``[export K=V ... &&] <python> -m snakemake ARGS``; None for any other form."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    exports: dict[str, str] = {}
    if tokens[:1] == ["export"]:
        end = tokens.index("&&") if "&&" in tokens else -1
        for token in tokens[1:end]:
            name, sep, value = token.partition("=")
            if not sep:
                return None
            exports[name] = value
        tokens = tokens[end + 1 :] if end > 0 else []
    if len(tokens) < 3 or tokens[1:3] != ["-m", "snakemake"]:
        return None
    if os.path.realpath(tokens[0]) != os.path.realpath(python):
        return None
    argv = tokens[3:]
    if any(token in ("&&", "||", ";", "|") for token in argv):
        return None
    return exports, argv


class ForkedJob:
    """A job forked by the zygote: what :class:`~.running.RunningJob` needs of a
    process (its pid, to stop its tree; ``wait``)."""

    def __init__(self) -> None:
        self.pid = 0
        self.started = threading.Event()
        self.ended = threading.Event()
        self.returncode = -1

    def wait(self) -> int:
        """Block until the job's process ends; its exit status."""
        self.ended.wait()
        return self.returncode


class Zygote:
    """The server's zygote process, started at its first plain job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._jobs: dict[int, ForkedJob] = {}
        self._next = 0
        self._pythonpath = os.environ.get("PYTHONPATH")

    def usable(self, env: dict[str, str]) -> bool:
        """Whether a job with this environment sees the same modules as the zygote."""
        return env.get("PYTHONPATH") == self._pythonpath

    def warm(self) -> None:
        """Start the zygote process (it imports Snakemake in the background)."""
        with self._lock:
            self._running()

    def start(self, argv: list[str], cwd: str, env: dict[str, str], log_path: str) -> ForkedJob:
        """Fork a child that runs ``snakemake ARGV`` in ``cwd``, output to the log."""
        job = ForkedJob()
        with self._lock:
            process = self._running()
            self._next += 1
            self._jobs[self._next] = job
            request = {"id": self._next, "argv": argv, "cwd": cwd, "env": env, "log": log_path}
            assert process.stdin is not None
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
        job.started.wait()
        return job

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            for job in self._jobs.values():  # a zygote that died took its jobs
                job.started.set()
                job.ended.set()
            self._jobs.clear()
            with OWN.starting():
                self._process = subprocess.Popen(
                    # -P: the server's current directory (wherever its cluster was
                    # started, or the directory a job changed to) is not on sys.path.
                    [sys.executable, "-P", "-m", __name__],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                # The server's own: no job's leftover, nor anything below it (its
                # jobs' processes carry their marks: their ends end them).
                OWN.add(self._process.pid, "zygote")
            threading.Thread(
                target=self._read, args=(self._process,), name="zygote", daemon=True
            ).start()
        return self._process

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            message = json.loads(line)
            with self._lock:
                job = self._jobs.get(message["id"])
                if job is not None and "exit" in message:
                    del self._jobs[message["id"]]
            if job is None:
                continue
            if "pid" in message:
                job.pid = message["pid"]
                job.started.set()
            else:
                job.returncode = message["exit"]
                job.ended.set()
        with self._lock:
            for job in self._jobs.values():
                job.started.set()
                job.ended.set()


# --------------------------------------------------------------------------------------
# The zygote process itself.


def _child(request: dict[str, Any], wakeup: tuple[int, int]) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        # A process group of its own, which the server records and a restarted server
        # kills whole (strays/processgroups.py); killed if the zygote dies (single-threaded:
        # the death signal follows the zygote itself).
        os.setpgid(0, 0)
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, KILL
        for fd in wakeup:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["snakemake", *request["argv"]]
        from snakemake_executor_context.server.pipegroups import end_failed_pipe_groups

        end_failed_pipe_groups()

        try:
            run_snakemake_main(request["argv"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    """Read job requests (JSON lines) on stdin; answer each with the child's pid, then
    its exit status. Exits, stopping its children, when stdin closes."""
    import select

    # What a job detaches (setsid, double forks) is reparented here, not to init: it
    # stays below the server, where the job's end finds it by its mark.
    become_subreaper()
    preload_job_command()
    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wakeup[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, int] = {}
    pending = b""

    def send(message: dict[str, int]) -> None:
        sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
        sys.stdout.buffer.flush()

    while True:
        ready, _, _ = select.select([0, wakeup[0]], [], [])
        if wakeup[0] in ready:
            os.read(wakeup[0], 4096)
        # Any child: this process's children are its jobs and what it adopted as a
        # subreaper, and nothing else here waits for them (unlike in the server,
        # whose jobs' threads wait for their own subprocesses).
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in children:
                send({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})
        if 0 in ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request, wakeup)
                children[pid] = request["id"]
                send({"id": request["id"], "pid": pid})
    # Its server is gone or closing: SIGKILL the jobs, everything they started and
    # what it adopted (kept processes too: nothing outlives its server).
    stop_processes(process_tree(os.getpid())[:-1], grace=0)


if __name__ == "__main__":
    _serve()
