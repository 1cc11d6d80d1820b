"""The catalog all or nothing: its creation killed (a real SIGKILL) at every step is
used or finished by the next run, what releases before left half made is finished,
and a catalog deleted or replaced under a real run keeps the run's records where its
last lines say (one line each)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateTable

from snakemake_executor_context.catalog.migrations.runner import leftovers
from snakemake_executor_context.catalog.models import Base
from snakemake_executor_context.catalog.reading import history
from snakemake_executor_context.catalog.store import CatalogSchemaError, open_reader, open_store
from snakemake_executor_context.catalog.writing.follow import FileId, moved
from snakemake_executor_context.catalog.writing.writer import open_writer
from snakemake_executor_context.executor.recording import Recording
from snakemake_executor_context.fleet import events as ev
from tests.conftest import BIN, context_run, toy_files

#: Creates a catalog as a run opens it (``open_writer``) once per step: a forked
#: child counts the statements it sends SQLite and its commits, and SIGKILLs itself
#: before step N (N = 0: never). Prints {N: (exit status, steps)}; one import for all.
CREATOR = r"""
import json, os, signal, sys
from sqlalchemy import Engine, event
from snakemake_executor_context.catalog.writing.writer import open_writer

def create(path, kill_at):
    steps = [0]
    def step(*_args, **_kwargs):
        steps[0] += 1
        if steps[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    event.listen(Engine, "before_cursor_execute", step)
    event.listen(Engine, "commit", step)
    writer = open_writer(path, owner="run killed", warn=print, say=print)
    writer.close()
    return steps[0]

base, points = sys.argv[1], json.loads(sys.argv[2])
found = {}
for n in points:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, str(create(os.path.join(base, f"{n}.db"), n)).encode())
        os._exit(0)
    os.close(write)
    steps = os.read(read, 100).decode()
    os.close(read)
    _, status = os.waitpid(pid, 0)
    found[n] = (status, int(steps) if steps else None)
print(json.dumps(found))
"""


def _create(base: Path, points: list[int]) -> dict[int, tuple[int, int | None]]:
    done = subprocess.run(
        [sys.executable, "-c", CREATOR, str(base), json.dumps(points)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    return {int(n): tuple(v) for n, v in json.loads(done.stdout.splitlines()[-1]).items()}


def _record_a_run(path: Path, run_id: str) -> list[str]:
    """Open the catalog as the next run does, record a run in it; what it said."""
    said: list[str] = []
    writer = open_writer(str(path), owner=f"run {run_id}", warn=said.append, say=said.append)
    writer.submit(ev.RunStarted(run_id=run_id, workdir=str(path.parent), jobs_total=0))
    writer.submit(ev.RunFinished(run_id=run_id, ok=True))
    writer.close()
    return said


def _runs(path: Path) -> dict[str, str]:
    reader = open_reader(path)
    try:
        with reader.session() as session:
            return {row.run_id: row.state for row in history.runs(session)}
    finally:
        reader.close()


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows if not name.startswith("sqlite_")}


@pytest.mark.slow
def test_creation_killed_at_every_step_is_used_or_finished_by_the_next_run(tmp_path):
    ((status, steps),) = _create(tmp_path, [0]).values()
    assert status == 0 and steps is not None and steps > len(Base.metadata.tables)
    killed = _create(tmp_path, list(range(1, steps + 1)))
    assert all(os.WIFSIGNALED(s) and os.WTERMSIG(s) == 9 for s, _ in killed.values()), killed
    whole = set(Base.metadata.tables) | {"alembic_version"}
    states = []
    for n in killed:
        path = tmp_path / f"{n}.db"
        states.append(_tables(path))
        # All or nothing: no tables, or every one of them with the version stamp.
        assert states[-1] in (set(), whole), (n, states[-1])
        said = _record_a_run(path, f"next-{n}")
        assert all("not a catalog" not in line for line in said), (n, said)
        assert _runs(path) == {f"next-{n}": "finished"}, n
    # Both were hit: killed in the creation's transaction, and after its commit
    # (while the run marked abandoned runs).
    assert set() in states and whole in states
    print(f"{len(killed)} kill points, {sum(s == whole for s in states)} after the commit")


@pytest.mark.slow
def test_a_run_finishes_a_catalog_killed_in_its_creation(tmp_path, make_workflow):
    workdir = make_workflow(
        {
            "Snakefile": 'rule all:\n    output: "done.txt"\n    shell: "touch {output}"\n',
        }
    )
    catalog = workdir / ".snakemake" / "context" / "catalog.db"
    catalog.parent.mkdir(parents=True)
    ((_, steps),) = _create(tmp_path, [0]).values()
    assert steps is not None
    # Killed halfway through, in the creation's transaction.
    _create(catalog.parent, [steps // 2])
    os.rename(catalog.parent / f"{steps // 2}.db", catalog)
    os.rename(catalog.parent / f"{steps // 2}.db.writer", f"{catalog}.writer")
    assert _tables(catalog) == set()
    run = context_run(workdir, "--context-servers", "1", timeout=240).check()
    assert "not a catalog" not in run.output
    assert "had a writer lease without a heartbeat" in run.output  # the killed one's
    (state,) = _runs(catalog).values()
    assert state == "finished"


@pytest.mark.parametrize("made", range(1, len(Base.metadata.sorted_tables) + 1))
def test_what_a_release_before_left_half_made_is_finished(tmp_path, made):
    """Releases before this one created the tables one commit each, in this order,
    and stamped the version last: a kill left the first ``made`` tables, empty."""
    path = tmp_path / "c.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        for table in Base.metadata.sorted_tables[:made]:
            db.execute(str(CreateTable(table).compile(dialect=sqlite.dialect())))
    assert _record_a_run(path, "next") == []
    assert _runs(path) == {"next": "finished"}
    assert _tables(path) == set(Base.metadata.tables) | {"alembic_version"}


def test_a_half_made_catalog_with_rows_or_other_columns_is_not_taken(tmp_path):
    """Not the plugin's, or holding records: refused as before, nothing written."""
    with_rows = tmp_path / "rows.db"
    with sqlite3.connect(with_rows, isolation_level=None) as db:
        runs = CreateTable(Base.metadata.tables["runs"]).compile(dialect=sqlite.dialect())
        db.execute(str(runs))
        db.execute(
            "INSERT INTO runs (run_id, workdir, host, pid, cluster, started, jobs_ok, "
            "jobs_failed, items, loads) VALUES ('x', '', '', 0, '', 0, 0, 0, 0, 0)"
        )
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE runs (x)")
    for path in (with_rows, other):
        with pytest.raises(CatalogSchemaError, match="is not a catalog of this plugin"):
            open_store(path)
        assert _tables(path) == {"runs"}
    with sqlite3.connect(with_rows) as db:
        assert db.execute("SELECT run_id FROM runs").fetchall() == [("x",)]
    assert leftovers({"runs": [c.name for c in Base.metadata.tables["runs"].columns]})
    assert not leftovers({"runs": ["x"]}) and not leftovers({"mine": ["id"]})


def test_moved_compares_the_open_file_with_the_path():
    opened = FileId(1, 2)
    assert moved(opened, FileId(1, 2)) is None
    assert moved(opened, None) == "deleted"
    assert moved(opened, FileId(1, 3)) == "replaced"


def test_a_catalog_that_cannot_be_written_again_is_said_and_no_report_named(tmp_path):
    """Its directory replaced by a file under the writer: one line, the records lost,
    and the run's last lines name no report."""
    path = tmp_path / "d" / "c.db"
    path.parent.mkdir()
    said: list[str] = []
    writer = open_writer(str(path), owner="run r", warn=said.append, say=said.append)
    writer.heartbeat_run = "r"
    writer.submit(ev.RunStarted(run_id="r"))
    assert writer.flush(30)
    os.rename(path.parent, tmp_path / "aside")
    path.parent.write_text("")
    writer.submit(ev.RunFinished(run_id="r", ok=True))
    writer.close()
    (line,) = [line for line in said if "cannot be written again" in line]
    assert str(path) in line and "they are lost" in line and "Fix:" in line
    shown: list[str] = []
    log = SimpleNamespace(info=shown.append, warning=shown.append)
    recording = Recording(None, "r", str(tmp_path), None, log)  # type: ignore[arg-type]
    recording.writes = True
    recording._ledger(str(path))
    assert shown == []
    recording._ledger(str(tmp_path / "aside" / "c.db"))  # what it recorded before
    assert shown == [
        "Where this run's GPU-seconds went (the ledger): snakemake-context report "
        f"--run r --catalog {tmp_path / 'aside' / 'c.db'}"
    ]


SLOW_JOBS = toy_files(
    """
rule all:
    input: expand("out/{i}.txt", i=range(6))

rule work:
    output: "out/{i}.txt"
    params: go=workflow.basedir + "/go"
    resources: context="toy"
    script: "work.py"
""",
    {
        # The first job to start runs at once; the others wait for the test's "go".
        "work.py": """
import os, time
from pathlib import Path
from snakemake_executor_context import load_context

load_context(snakemake)
go = Path(snakemake.params.go)
try:
    os.close(os.open(f"{go}.first", os.O_CREAT | os.O_EXCL))
except FileExistsError:
    deadline = time.time() + 90
    while not go.exists() and time.time() < deadline:
        time.sleep(0.1)
Path(snakemake.output[0]).write_text("ok")
""",
    },
)


def _move_mid_run(workdir: Path, move) -> tuple[str, str]:
    """A real run of six context jobs; once its first job is recorded in the
    catalog, ``move(catalog)``, then let the other five run. Its output, and run id."""
    catalog = workdir / ".snakemake" / "context" / "catalog.db"
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    process = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "2", "--context-servers", "1"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not _first_job_recorded(catalog):
            assert time.time() < deadline and process.poll() is None, "no job recorded"
            time.sleep(0.2)
        move(catalog)
        (workdir / "go").touch()
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
    assert process.returncode == 0, output
    (run_id,) = set(re.findall(r"report --run (\S+)", output)) or {""}
    return output, run_id


def _first_job_recorded(catalog: Path) -> bool:
    if not catalog.exists():
        return False
    try:
        with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True) as db:
            return bool(db.execute("SELECT 1 FROM jobs WHERE outcome = 'ok'").fetchall())
    except sqlite3.Error:
        return False


def _report(run_id: str, *catalog: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), "report", "--run", run_id, *catalog, "-o", "r.html"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _jobs_ok(path: Path, run_id: str) -> int:
    reader = open_reader(path)
    try:
        with reader.session() as session:
            (row,) = [r for r in history.runs(session) if r.run_id == run_id]
            assert row.state == "finished", row
            return row.jobs_ok
    finally:
        reader.close()


@pytest.mark.slow
def test_a_catalog_deleted_mid_run_is_written_again_with_the_run(make_workflow):
    workdir = make_workflow(SLOW_JOBS)
    output, run_id = _move_mid_run(workdir, lambda catalog: catalog.unlink())
    catalog = workdir / ".snakemake" / "context" / "catalog.db"
    lines = [line for line in output.splitlines() if "was deleted while" in line]
    assert len(lines) == 1 and str(catalog) in lines[0] and "wrote it again" in lines[0]
    assert _jobs_ok(catalog, run_id) == 6  # the first job, recorded before, too
    assert f"snakemake-context report --run {run_id}\n" in output + "\n"
    assert _report(run_id, cwd=workdir).returncode == 0
    assert not list(catalog.parent.glob("catalog.*.db"))


@pytest.mark.slow
def test_a_catalog_replaced_mid_run_is_left_and_the_run_goes_beside(make_workflow):
    workdir = make_workflow(SLOW_JOBS)
    planted = b"not ours " * 100

    def replace(catalog: Path) -> None:
        other = catalog.with_name("other")
        other.write_bytes(planted)
        os.replace(other, catalog)

    output, run_id = _move_mid_run(workdir, replace)
    catalog = workdir / ".snakemake" / "context" / "catalog.db"
    beside = catalog.with_name(f"catalog.{run_id}.db")
    lines = [line for line in output.splitlines() if "was replaced by another file" in line]
    assert len(lines) == 1 and str(catalog) in lines[0] and str(beside) in lines[0], output
    assert catalog.read_bytes() == planted
    assert not Path(f"{catalog}-wal").exists()  # the run's own, stale: removed
    assert _jobs_ok(beside, run_id) == 6
    assert f"snakemake-context report --run {run_id} --catalog {beside}" in output
    assert _report(run_id, "--catalog", str(beside), cwd=workdir).returncode == 0
