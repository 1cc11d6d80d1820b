"""What a job changes for the whole server process ends with it on a persistent
cluster, as it would with the job's own process: a second workflow's job on the same
server sees what it saw before the first workflow's job changed it. A niceness that
cannot be lowered back retires the server; ``signal.signal`` in a context job fails it
in one line naming the fix."""

from __future__ import annotations

import ctypes
import json
import resource
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import context_run, persistent_cluster, snakemake, toy_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_server(tmp_path_factory) -> Iterator[Path]:
    """`snakemake-context up` with one server: every job lands in the same process."""
    with persistent_cluster(tmp_path_factory.mktemp("cluster"), "--servers", "1") as path:
        yield path


STATE_SNAKEFILE = textwrap.dedent("""
    rule state:
        output: "state/{name}.json"
        resources: context="toy"
        script: "state.py"
""")
PRELUDE = """
import gc
import json
import logging
import os
import sys
import threading
import time
import warnings

root = logging.getLogger()
"""
# What a job sees of each piece of process-wide state (the niceness is its thread's:
# Linux keeps one per thread).
OBSERVE = """

def name(function):
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', function)}"


def warning_raises():
    try:
        warnings.warn("a probe", UserWarning)
    except UserWarning:
        return True
    return False


root.warning("a record of %s", snakemake.output[0])
state = {
    "time zone": time.strftime("%z", time.localtime(0)),
    "collector": [gc.isenabled(), gc.get_threshold()],
    "switch interval": sys.getswitchinterval(),
    "warnings filters": warning_raises(),
    "showwarning": name(warnings.showwarning),
    "root logger": [[type(handler).__name__ for handler in root.handlers], root.level],
    "sys.excepthook": name(sys.excepthook),
    "threading.excepthook": name(threading.excepthook),
    "sys.unraisablehook": name(sys.unraisablehook),
    "niceness": os.nice(0),
    "pid": os.getpid(),
}
with open(snakemake.output[0], "w") as f:
    json.dump(state, f)
"""
#: What the first workflow's job changes, by the state it changes.
CHANGES = {
    "time zone": 'os.environ["TZ"] = "JST-9"\ntime.tzset()',
    "collector": "gc.disable()\ngc.set_threshold(1, 1, 1)",
    "switch interval": "sys.setswitchinterval(0.5)",
    "warnings filters": 'warnings.simplefilter("error")',
    "showwarning": "def job_showwarning(*args, **kwargs):\n    pass\n\n"
    "warnings.showwarning = job_showwarning",
    "root logger": 'root.addHandler(logging.FileHandler("job.log"))\nroot.setLevel(logging.DEBUG)',
    "sys.excepthook": "def job_hook(*args):\n    pass\n\nsys.excepthook = job_hook",
    "threading.excepthook": "def job_hook(args):\n    pass\n\nthreading.excepthook = job_hook",
    "sys.unraisablehook": "def job_hook(unraisable):\n    pass\n\nsys.unraisablehook = job_hook",
    "niceness": "os.nice(5)",
}


def _state_workflow(make_workflow, name: str, change: str = "") -> Path:
    """A workflow whose job makes ``change``, then writes what it sees."""
    script = f"{PRELUDE}{change}\n{OBSERVE}"
    return make_workflow(toy_files(STATE_SNAKEFILE, {"state.py": script}), name=name)


def _state(workdir: Path, name: str, *attach: str) -> dict:
    context_run(workdir, *attach, f"state/{name}.json").check()
    return json.loads((workdir / "state" / f"{name}.json").read_text())


@pytest.mark.parametrize("piece", list(CHANGES))
def test_what_a_job_changes_for_its_process_ends_with_it(make_workflow, one_server, piece):
    attach = ("--context-scheduler-file", str(one_server))
    other = _state_workflow(make_workflow, "other")
    before = _state(other, "before", *attach)
    changer = _state_workflow(make_workflow, "changer", CHANGES[piece])
    changed = _state(changer, "changed", *attach)
    assert changed[piece] != before[piece], changed
    after = _state(other, "after", *attach)
    del before["pid"], after["pid"]  # a niceness that cannot be put back restarts it
    assert after == before
    if piece == "root logger":  # the job's handler is closed, and gets no later record
        log = (changer / "job.log").read_text()
        assert "state/changed.json" in log and "state/after.json" not in log, log


def _no_lowering_of_niceness() -> None:
    """Before exec: `up` may not lower a niceness, as an unprivileged user's process
    (RLIMIT_NICE 0, and root's CAP_SYS_NICE out of the bounding set)."""
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    pr_capbset_drop, cap_sys_nice = 24, 23
    ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, cap_sys_nice, 0, 0, 0)


def test_a_niceness_that_cannot_be_lowered_back_retires_the_server(make_workflow, tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    with persistent_cluster(cluster, "--servers", "1", preexec_fn=_no_lowering_of_niceness) as path:
        attach = ("--context-scheduler-file", str(path))
        other = _state_workflow(make_workflow, "other")
        before = _state(other, "before", *attach)
        changer = _state_workflow(make_workflow, "changer", CHANGES["niceness"])
        run = context_run(changer, *attach, "state/changed.json").check()
        changed = json.loads((changer / "state" / "changed.json").read_text())
        after = _state(other, "after", *attach)
    assert changed["niceness"] == before["niceness"] + 5
    assert changed["pid"] == before["pid"]
    lines = [line for line in run.output.splitlines() if "restarts" in line]
    assert len(lines) == 1 and "niceness" in lines[0], run.output
    assert after["niceness"] == before["niceness"] and after["pid"] != before["pid"]


SIGNAL_SNAKEFILE = textwrap.dedent("""
    rule handler:
        output: "handled.txt"
        resources: context="toy"
        script: "handler.py"
""")
HANDLER = """
import signal

signal.signal(signal.SIGUSR1, lambda number, frame: None)
open(snakemake.output[0], "w").write("handled")
"""


def test_signal_signal_in_a_context_job_fails_it_in_one_line(make_workflow, one_server):
    files = toy_files(SIGNAL_SNAKEFILE, {"handler.py": HANDLER})
    local = make_workflow(files, name="local")
    snakemake(local, "--cores", "1").check()
    assert (local / "handled.txt").read_text() == "handled"
    context = make_workflow(files, name="context")
    run = context_run(context, "--context-scheduler-file", str(one_server))
    assert run.returncode != 0, run.output
    line = next(line for line in run.output.splitlines() if "signal.signal" in line)
    assert "Rule 'handler'" in line and "Fix:" in line and "a thread of" in line, line
    assert not (context / "handled.txt").exists()
