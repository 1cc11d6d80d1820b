"""Ctrl-C and SIGTERM: Snakemake exits promptly and cleanly, leaves nothing behind,
and a plain rerun finishes the workflow.

Each test sets the disposition its signal relies on: the snakemake it starts gets
SIGINT's default action back (a test run may itself start with SIGINT ignored, as a
background job of a non-interactive shell does, and an ignored SIGINT is inherited),
and whatever the test started is killed at the end, even when it fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import text

from tests.conftest import BIN, HEADER, TESTS, busy_loops, snakemake, toy_files

pytestmark = pytest.mark.slow


def _default_sigint() -> None:
    """In the child, before exec: SIGINT does what it does in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def snakemake_in_its_group(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """Snakemake leading its own process group (like a terminal's foreground job),
    with SIGINT's default disposition; on the way out, it and everything it started
    (the embedded cluster runs in a session of its own) are killed if still there."""
    process = subprocess.Popen(
        [str(BIN / "snakemake"), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    seen: dict[int, psutil.Process] = {}
    process.seen = seen  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(process.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for child in seen.values():
            with contextlib.suppress(psutil.Error):
                child.kill()
        if process.poll() is None:
            process.kill()
        process.communicate()


def descendants(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """What the run started so far (remembered for the clean-up)."""
    found = psutil.Process(process.pid).children(recursive=True)
    for child in found:
        process.seen.setdefault(child.pid, child)  # type: ignore[attr-defined]
    return found


SLOW_SCRIPT = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write("partial")
    f.flush()
    time.sleep(120)
"""


def test_sigint_to_the_process_group(toy_workflow):
    workdir = toy_workflow(
        """
            rule all:
                input: "ctx/0.txt", "ctx/1.txt", "plain.txt"

            rule slow:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"

            rule plain:
                output: "plain.txt"
                shell: "echo partial > {output}; sleep 120"
        """,
        {
            "scripts/slow.py": SLOW_SCRIPT,
        },
    )
    # Like a terminal: snakemake leads its own process group, which gets the SIGINT.
    args = ["--executor", "context", "--jobs", "3", "--context-servers", "3"]
    with snakemake_in_its_group(args, workdir) as process:
        outputs = [workdir / "ctx/0.txt", workdir / "ctx/1.txt", workdir / "plain.txt"]
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in outputs):
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "jobs did not start"
            time.sleep(0.2)
        time.sleep(0.5)
        started_by_run = descendants(process)
        assert len(started_by_run) >= 5  # cluster, 3 servers, the plain job's processes

        interrupted = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=60)
        took = time.monotonic() - interrupted

    print(f"snakemake exited {took:.1f} s after SIGINT")
    assert took < 30, output
    assert "Traceback" not in output, output
    _, alive = psutil.wait_procs(started_by_run, timeout=5)
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]
    assert not any(path.exists() for path in outputs), output
    assert "Terminating processes on user request" in output


LOOPING_SCRIPT = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write("partial")
    f.flush()
    for _ in range(1200):  # Python code between short native calls, like a scoring loop
        time.sleep(0.1)
"""


def test_sigint_with_an_attached_cluster_stops_jobs_and_keeps_servers(toy_workflow, scheduler_file):
    workdir = toy_workflow(
        """
            rule all:
                input: "ctx/0.txt", "ctx/1.txt"

            rule slow:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"
        """,
        {
            "scripts/slow.py": LOOPING_SCRIPT,
        },
    )
    servers_before = {p.pid for p in _servers(scheduler_file)}
    args = ["--executor", "context", "--jobs", "2", "--context-scheduler-file", str(scheduler_file)]
    with snakemake_in_its_group(args, workdir) as process:
        outputs = [workdir / "ctx/0.txt", workdir / "ctx/1.txt"]
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in outputs):
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "jobs did not start"
            time.sleep(0.2)
        interrupted = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=60)
        took = time.monotonic() - interrupted
    assert took < 30, output
    assert "Traceback" not in output, output
    assert not any(path.exists() for path in outputs)
    # The jobs stopped inside the servers, which stay up with their contexts.
    assert {p.pid for p in _servers(scheduler_file)} == servers_before
    logs = list((workdir / ".snakemake/context/logs/slow").glob("*.log"))
    assert len(logs) == 2 and all("cancelled on" in p.read_text() for p in logs)


HUNG_LOADER = """
import time
from pathlib import Path

def load():
    Path("loading").write_text("now")
    time.sleep(600)  # in C: a cancellation cannot reach it
    return {}
"""


def _hung_load_workflow(make_workflow) -> Path:
    """One context job whose loader hangs (it touches ``loading`` first)."""
    return make_workflow(
        {
            "Snakefile": HEADER.replace("value=5", "")
            + textwrap.dedent("""
            rule all:
                input: "ctx/0.txt"

            rule hung:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"
        """),
            "loader.py": HUNG_LOADER,
            "scripts/slow.py": LOOPING_SCRIPT,
        }
    )


def test_ctrl_c_meeting_a_hung_load_restarts_the_server_as_a_restart(make_workflow, scheduler_file):
    """The plugin restarts a server whose job does not stop when cancelled; the
    cluster's catalog records that restart, not a crash ('SIGKILL of unknown origin')
    and no loss."""
    import sqlite3

    workdir = _hung_load_workflow(make_workflow)
    args = ["--executor", "context", "--jobs", "1", "--context-scheduler-file", str(scheduler_file)]
    with snakemake_in_its_group(args, workdir) as process:
        deadline = time.monotonic() + 120
        while not (workdir / "loading").exists():
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the load did not start"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    assert "Traceback" not in output, output
    catalog = scheduler_file.with_suffix(".db")
    deadline = time.monotonic() + 60
    while True:  # the cluster's writer records the restart and the run's end a moment later
        with sqlite3.connect(catalog) as db:
            notes = db.execute("select text from events where kind = 'server-restarted'").fetchall()
            losses = db.execute("select reason from server_losses").fetchall()
            ended = db.execute(
                "select kind from events where kind in ('run-finished', 'run-interrupted')"
            ).fetchall()
            attempts = db.execute("select outcome, finished - started from attempts").fetchall()
        if (notes and ended) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert notes and "restarted by the plugin" in notes[0][0], notes
    assert not losses, losses
    # The job ends there, cancelled, once: it was placed again on the restarted server
    # (its load ran on after the run), and the run was recorded as finished.
    assert ended == [("run-interrupted",)], ended
    assert len(attempts) == 1 and attempts[0][0] == "cancelled" and attempts[0][1] > 0, attempts


def test_a_run_interrupted_while_its_loader_hangs_is_recorded_interrupted(make_workflow):
    """Ctrl-C while the embedded cluster's only server hangs in a load: the catalog
    said the run finished and left the attempt running; now the run is interrupted
    and its one attempt cancelled, from its start to after the interrupt."""
    from snakemake_executor_context.catalog.reading.history import runs
    from snakemake_executor_context.catalog.store import open_reader

    workdir = _hung_load_workflow(make_workflow)
    args = ["--executor", "context", "--jobs", "1", "--context-servers", "1"]
    with snakemake_in_its_group(args, workdir) as process:
        deadline = time.monotonic() + 120
        while not (workdir / "loading").exists():
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the load did not start"
            time.sleep(0.1)
        interrupted = time.time()
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode != 0 and "Traceback" not in output, output
    reader = open_reader(str(workdir / ".snakemake" / "context" / "catalog.db"))
    try:
        with reader.session() as session:
            (run,) = runs(session)
            rows = session.execute(
                text("select a.outcome, a.started, a.finished, j.outcome from attempts a "
                     "join jobs j on a.job_id = j.id")
            ).all()  # fmt: skip
    finally:
        reader.close()
    assert (run.state, run.ok, run.jobs_failed) == ("interrupted", False, 0), run
    ((attempt, started, finished, job),) = rows
    assert (attempt, job) == ("cancelled", "cancelled"), rows
    load_began = (workdir / "loading").stat().st_mtime
    assert started <= load_began and finished >= interrupted, (started, load_began, finished)


def _servers(scheduler_file) -> list[psutil.Process]:
    import json

    pid = json.loads(scheduler_file.with_suffix(".pid").read_text())["pid"]
    return [p for p in psutil.Process(pid).children(recursive=True)]


#: Interrupted runs in the Ctrl-C-under-load test: 3 in the default suite (about 30 s
#: here); the issue's 10 with SNAKEMAKE_CONTEXT_CTRL_C_RUNS=10.
CTRL_C_RUNS = int(os.environ.get("SNAKEMAKE_CONTEXT_CTRL_C_RUNS", "3"))
BUSY_LOOP = "while True: pass"


def test_ctrl_c_under_load(toy_workflow):
    """CPU-bound busy loops run throughout (:func:`.conftest.busy_loops`); each run
    gets SIGINT mid-run (its context jobs and a plain job running) and exits within
    10 s, leaving no process and no partial output."""
    workdir = toy_workflow(
        """
            rule all:
                input: "ctx/0.txt", "ctx/1.txt", "plain.txt"

            rule slow:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"

            rule plain:
                output: "plain.txt"
                shell: "echo partial > {output}; sleep 120"
        """,
        {
            "scripts/slow.py": LOOPING_SCRIPT,
        },
    )
    outputs = [workdir / "ctx/0.txt", workdir / "ctx/1.txt", workdir / "plain.txt"]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy_loops())]
    took: list[float] = []
    try:
        for attempt in range(CTRL_C_RUNS):
            args = ["--executor", "context", "--jobs", "3", "--context-servers", "3"]
            with snakemake_in_its_group(args, workdir) as process:
                deadline = time.monotonic() + 120
                while not all(path.exists() for path in outputs):
                    assert process.poll() is None, process.communicate()[0]
                    assert time.monotonic() < deadline, f"run {attempt}: jobs did not start"
                    time.sleep(0.1)
                started_by_run = descendants(process)
                interrupted = time.monotonic()
                os.killpg(process.pid, signal.SIGINT)
                output, _ = process.communicate(timeout=60)
                took.append(time.monotonic() - interrupted)
                assert took[-1] < 10, (attempt, took, output)
                assert "Traceback" not in output, output
                _, alive = psutil.wait_procs(started_by_run, timeout=5)
                assert not alive, (attempt, alive)
                assert not any(path.exists() for path in outputs), (attempt, output)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    seconds = ", ".join(f"{t:.1f}" for t in took)
    print(f"{CTRL_C_RUNS} runs under load: exited {seconds} s after SIGINT")


#: The test scheduler plugin (tests/plugins): Snakemake's greedy selector, slow, with a
#: file that exists while it selects.
PLUGINS = TESTS / "plugins"
#: Enough ready jobs that each selection has hundreds to choose from (the slowpick
#: scheduler makes each one take 0.3 s, whatever the count).
MANY_JOBS = 600
MANY_NOOPS = textwrap.dedent(f"""
    rule all:
        input: expand("out/{{i}}.txt", i=range({MANY_JOBS}))

    rule one:
        output: "out/{{i}}.txt"
        resources: context="toy"
        script: "one.py"
""")
ONE_LINE = """
with open(snakemake.output[0], "w") as f:
    f.write("1")
"""


@pytest.mark.parametrize("when", ["selecting", "between selections"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_at_hundreds_of_ready_jobs_stops_the_run_and_a_plain_rerun_finishes(
    make_workflow, how, when
):
    """600 ready context jobs on the embedded cluster, the signal sent once 100
    outputs exist: inside one of Snakemake's job selections, or between two (the
    slowpick scheduler says which). Snakemake exits within 15 s, nothing the run
    started is left, the catalog records the run interrupted and an outcome for every
    attempt, and a plain rerun (no --rerun-incomplete) writes every output.

    Before the fix, one try of each case inside a selection failed: SIGTERM hung for
    ever (Snakemake's handler waits on the scheduler's lock, which the main thread
    holds while it selects: 5 of 6 tries at random moments, every try inside a
    selection), and after SIGINT the rerun stopped on IncompleteFilesException
    (outputs of jobs finished on their servers, never finished by Snakemake: 3 of 3)."""
    workdir = make_workflow(toy_files(MANY_NOOPS, {"one.py": ONE_LINE}))
    args = ["--executor", "context", "--jobs", "8", "--context-servers", "2"]
    _stop_then_rerun(workdir, args, how, when, workdir / ".snakemake/context/catalog.db")


def test_sigterm_inside_a_selection_stops_a_run_attached_to_a_cluster(
    make_workflow, scheduler_file
):
    """The same SIGTERM, inside a selection, with the run attached to a persistent
    cluster (`snakemake-context up`), whose catalog records the run: it stops, the
    cluster stays, and a plain rerun on it writes every output."""
    workdir = make_workflow(toy_files(MANY_NOOPS, {"one.py": ONE_LINE}))
    args = ["--executor", "context", "--jobs", "8"]
    args += ["--context-scheduler-file", str(scheduler_file)]
    catalog = scheduler_file.with_suffix(".db")  # the cluster's own (ClusterFiles)
    _stop_then_rerun(workdir, args, signal.SIGTERM, "selecting", catalog)


def _stop_then_rerun(
    workdir: Path,
    args: list[str],
    how: signal.Signals,
    when: str,
    catalog: Path,
) -> None:
    """Run ``args`` with the slowpick scheduler, send ``how`` once 100 outputs exist
    at a moment ``when`` ('selecting' or not), check the stop, then a plain rerun."""
    selecting = workdir / "selecting"
    path = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "SLOWPICK_MARK": str(selecting)}
    out = workdir / "out"
    with snakemake_in_its_group([*args, "--scheduler", "slowpick"], workdir, env) as process:
        deadline = time.monotonic() + 120
        while not out.is_dir() or sum(1 for _ in out.iterdir()) < 100:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "100 outputs did not come"
            time.sleep(0.05)
        while selecting.exists() != (when == "selecting"):
            assert time.monotonic() < deadline, f"no moment {when}"
            time.sleep(0.002)
        started_by_run = descendants(process)
        signalled = time.monotonic()
        process.send_signal(how)
        output, _ = process.communicate(timeout=60)
        took = time.monotonic() - signalled

    print(f"{how.name} {when}: exited {took:.1f} s after it")
    assert took < 15, output[-3000:]
    assert process.returncode != 0, output[-3000:]  # stopped before the end
    _, alive = psutil.wait_procs(started_by_run, timeout=5)
    assert not alive, alive
    with contextlib.closing(sqlite3.connect(catalog)) as db:
        noted = db.execute("select count(*) from events where kind = 'run-interrupted'")
        assert noted.fetchall() == [(1,)], output[-3000:]
        unended = db.execute("select key from attempts where outcome is null").fetchall()
        assert not unended, unended
    # The same command, a plain rerun (the greedy selector: the default ILP one spends
    # most of a minute selecting among the hundreds left, and the rerun checks outputs).
    rerun = snakemake(workdir, *args, "--scheduler", "greedy", timeout=300)
    assert rerun.returncode == 0, rerun.output[-3000:]
    written = {path.name for path in out.iterdir()}
    assert written == {f"{i}.txt" for i in range(MANY_JOBS)}


def test_a_ctrl_c_the_main_thread_swallowed_is_raised_again_as_it_hands_a_job_over():
    """Code in Snakemake's main thread that catches everything (pulp's bare
    ``except:`` around its solver's pipe) can swallow a Ctrl-C: the run went on to
    its end (1 of about 120 presses at 2,000 ready jobs). The executor's SIGINT
    handler notes the press; the next job Snakemake hands over raises it again,
    until Snakemake acts on it (cancels the jobs); a press while it does is noted, not
    raised into the cancelling. Run in a child: it takes SIGINT."""
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWING],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_default_sigint,
    )
    assert done.stdout.split() == ["swallowed", "raised", "handled", "noted"], (
        done.stdout + done.stderr
    )


SWALLOWING = """
import os, signal
from snakemake_executor_context.executor.stopping import CtrlC

ctrl_c = CtrlC()
ctrl_c.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
except:  # what pulp does around its solver's pipe
    print("swallowed")
try:
    ctrl_c.raise_if_swallowed()  # Snakemake hands the next job over
except KeyboardInterrupt:
    print("raised")
ctrl_c.handled()  # Snakemake cancels the jobs
ctrl_c.raise_if_swallowed()
print("handled")
os.kill(os.getpid(), signal.SIGINT)  # a second press, while the jobs are cancelled
print("noted")
"""
