"""Each per-job check of a server still catches its change where the job that changed
nothing costs it little: a descriptor closed and reopened on another file, the
environment changed in ``os.environ`` or under it in C, a module swapped for another,
the temporary directory's variables, a umask changed between jobs, one thread reniced.
The server's own code, no cluster."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from snakemake_executor_context.server.isolation import fresh_modules, process_state
from snakemake_executor_context.server.processwide import ProcessWide

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

DESCRIPTORS = textwrap.dedent("""
    import json, os, sys
    from snakemake_executor_context.server.output import job_output

    log_path, held, other, new = sys.argv[1:5]
    server_file = os.open(held, os.O_RDONLY)  # the server's own, open before each job
    found = []
    with open(log_path, "wb") as log:
        for change in ("nothing", "nothing", "reopen", "nothing", "open"):
            with job_output("the job", log.fileno()) as leaks:
                if change == "reopen":  # as many open as before, one on another file
                    replacement = os.open(other, os.O_RDONLY)
                    os.dup2(replacement, server_file)
                    os.close(replacement)
                elif change == "open":
                    os.open(new, os.O_WRONLY | os.O_CREAT)
            found.append([fd.split(" -> ")[1] for fd in leaks.fds])
    print(json.dumps(found))
    os._exit(0)
""")


@linux_only
def test_a_descriptor_closed_and_reopened_on_another_file_is_the_jobs_leak(tmp_path):
    held, other, new = (tmp_path / name for name in ("held", "other", "new"))
    held.write_text("the server's")
    other.write_text("the job's")
    done = subprocess.run(
        [sys.executable, "-c", DESCRIPTORS, str(tmp_path / "log"), str(held), str(other), str(new)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[], [], [str(other)], [], [str(new)]]


def _job(workdir: Path, **envvars: str) -> SimpleNamespace:
    """What :func:`process_state` reads of a job's spec."""
    return SimpleNamespace(workdir=str(workdir), envvars=envvars, threads=1)


def _c_getenv(name: str) -> str | None:
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return value.decode() if value is not None else None


@linux_only
def test_what_a_job_changes_in_the_environment_is_put_back_in_python_and_in_c(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SERVER_KEEPS", "server")
    monkeypatch.setenv("JOB_CHANGES", "server")
    monkeypatch.setenv("JOB_REMOVES", "server")
    monkeypatch.setenv("C_CHANGES", "server")
    before = dict(os.environ)
    libc = ctypes.CDLL(None)
    with process_state(_job(tmp_path, RULE_SETS="rule")):
        assert os.environ["RULE_SETS"] == "rule" and os.environ["OMP_NUM_THREADS"] == "1"
        os.environ["JOB_ADDS"] = "job"
        os.environ["JOB_CHANGES"] = "job"
        del os.environ["JOB_REMOVES"]
        libc.setenv(b"C_CHANGES", b"job", 1)  # a C library's, unseen by os.environ
    assert dict(os.environ) == before
    assert _c_getenv("C_CHANGES") == "server" and _c_getenv("JOB_REMOVES") == "server"
    assert _c_getenv("JOB_ADDS") is None and _c_getenv("RULE_SETS") is None
    seen = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    assert "C_CHANGES=server\n" in seen and "JOB_ADDS" not in seen


def test_the_temporary_directory_follows_the_servers_variables_and_its_removal(
    tmp_path, monkeypatch
):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # as in a server that never asked
    seen = []
    for directory in (first, first, second):
        monkeypatch.setenv("TMPDIR", str(directory))
        with process_state(_job(tmp_path)):
            seen.append((tempfile.gettempdir(), os.environ["TMP"]))
    assert seen == [(str(first), str(first))] * 2 + [(str(second), str(second))]
    second.rmdir()  # gone: found again, as tempfile finds it
    with process_state(_job(tmp_path)):
        found = tempfile.gettempdir()
    assert found != str(second)
    second.mkdir()  # there again: the first place tempfile looks, so the one it takes
    with process_state(_job(tmp_path)):
        assert tempfile.gettempdir() == str(second)
    assert tempfile.tempdir is None


def test_a_module_swapped_for_a_workflow_module_is_still_forgotten(tmp_path, monkeypatch):
    (tmp_path / "workflow_helper.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import colorsys  # noqa: F401  (in sys.modules before the job)

    try:
        with fresh_modules([str(tmp_path)], frozenset) as forgotten:
            count = len(sys.modules)
            del sys.modules["colorsys"]
            import workflow_helper  # noqa: F401

            assert len(sys.modules) == count  # as many modules, not the same ones
        assert forgotten == ["workflow_helper"] and "workflow_helper" not in sys.modules
    finally:
        sys.modules.pop("workflow_helper", None)


@linux_only
def test_a_umask_changed_between_jobs_is_the_one_the_next_job_is_measured_against():
    from snakemake_executor_context.paths.outputs import current_umask

    original = current_umask()
    try:
        ProcessWide.now().restore()
        os.umask(0o027)  # a thread a job left running, between two jobs
        saved = ProcessWide.now()
        assert saved.umask == 0o027 and current_umask() == 0o027
        os.umask(0o077)  # the next job
        saved.restore()
        assert current_umask() == 0o027
    finally:
        os.umask(original)


@linux_only
def test_a_job_that_renices_one_other_thread_is_caught():
    saved = ProcessWide.now()
    reniced, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def bystander() -> None:
        tid.append(threading.get_native_id())
        reniced.wait()
        done.wait()

    thread = threading.Thread(target=bystander)
    thread.start()
    try:
        while not tid:
            pass
        os.setpriority(os.PRIO_PROCESS, tid[0], saved.niceness + 3)
        reniced.set()
        lost = saved.restore()
        now = os.getpriority(os.PRIO_PROCESS, tid[0])
        assert now == saved.niceness or ("niceness was raised" in lost[0]), (now, lost)
    finally:
        done.set()
        thread.join()
