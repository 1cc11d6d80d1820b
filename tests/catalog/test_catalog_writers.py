"""A catalog that loses nothing: two writers on one file, two nodes on one network
catalog, a writer lease taken over, abandoned runs, the local directory's checks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from snakemake_executor_context.catalog import store
from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.catalog.writing import lease, writer
from snakemake_executor_context.catalog.writing.lease import WriterLease, sibling_path
from snakemake_executor_context.catalog.writing.writer import open_writer
from snakemake_executor_context.errors import UnsafePathError
from snakemake_executor_context.fleet import events as ev
from tests.catalog.test_catalog import MOUNTS, _job_events
from tests.conftest import REPO, busy_loops

# A run's recording (executor/recording.py) exactly as the executor drives it, in
# its own process, attached to a cluster whose scheduler writes no catalog (the run
# writes its own: the same writer an embedded cluster's hub runs); the Dask client is
# a stub, since only the catalog side is under test and two real clusters would not
# fit two cores beside the busy loops.
RUN = textwrap.dedent("""
    import json, sys, time
    from snakemake_executor_context.executor.recording import Recording
    from snakemake_executor_context.fleet import events as ev
    from snakemake_executor_context.fleet.state import FleetState
    from tests.catalog.test_catalog import _job_events

    catalog, run_id, jobs, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    class Client:
        def subscribe_topic(self, *a): pass
        def unsubscribe_topic(self, *a): pass
        def run_on_scheduler(self, *a): raise OSError("no hub on this scheduler")
        def register_plugin(self, *a): raise OSError("no hub on this scheduler")
        def run(self, *a, **k): return {}

    class Connection:
        client = Client()
        description = "stub"
        embedded = False

    said = []
    class Log:
        def warning(self, message): said.append(message); print(message, file=sys.stderr)
        info = warning

    recording = Recording(Connection(), run_id, ".", catalog, Log())
    recording.begin(FleetState(), lambda e: None, jobs_total=jobs, declarations=[])
    import os
    open(go + "." + run_id, "w").close()  # its catalog is open
    while not os.path.exists(go):
        time.sleep(0.01)
    for i in range(jobs):
        for event in _job_events(run_id, i):
            recording.emit(event)
    recording.finished(ev.RunFinished(run_id=run_id, ok=True))
    print(json.dumps({"location": recording.location, "said": said}))
""")

BUSY = "while True: pass"
#: Jobs each of the two runs records (each a few events, written while the other run
#: writes): enough that both write for seconds at once.
JOBS = 600


def _jobs_recorded(path: str, run_id: str) -> int:
    with open_reader(path).session() as session:
        rows = {row.run_id: row for row in queries.runs(session, limit=100)}
    return rows[run_id].jobs_ok if run_id in rows else 0


@pytest.mark.slow
def test_two_writers_on_one_sqlite_catalog_lose_no_job(tmp_path):
    catalog = tmp_path / "shared" / "catalog.db"
    go = tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy_loops())]
    runs = {}
    try:
        for run_id in ("run-a", "run-b"):
            runs[run_id] = subprocess.Popen(
                [sys.executable, "-c", RUN, str(catalog), run_id, str(JOBS), str(go)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(0.5 if run_id == "run-a" else 0)
        opened = [tmp_path / f"go.{run_id}" for run_id in runs]
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in opened):
            for run_id, process in runs.items():
                assert process.poll() is None, (run_id, process.communicate())
            assert time.monotonic() < deadline, "the two runs never opened their catalogs"
            time.sleep(0.05)
        go.touch()
        outcome = {}
        for run_id, process in runs.items():
            out, err = process.communicate(timeout=240)
            assert process.returncode == 0, err
            outcome[run_id] = (json.loads(out.strip().splitlines()[-1]), err)
    finally:
        for process in [*busy, *runs.values()]:
            process.kill()
            process.wait()
    for run_id, (result, err) in outcome.items():
        location = result["location"]
        assert _jobs_recorded(location, run_id) == JOBS, (run_id, location, err)
        assert "did not record" not in err, err
        if location != str(catalog):
            # It wrote its own catalog, and said where.
            assert location == sibling_path(str(catalog), f"run {run_id}")
            assert any(
                location in line and "is being written by" in line for line in result["said"]
            )
    # Exactly one of them was the shared catalog's writer.
    assert sorted(r["location"] == str(catalog) for r, _ in outcome.values()) == [False, True]


@pytest.fixture
def nfs(tmp_path, monkeypatch):
    """tmp_path/nfs is an NFS mount by the mount table (no real one exists here)."""
    shared = tmp_path / "nfs"
    shared.mkdir()
    table = tmp_path / "mounts"
    table.write_text(MOUNTS.format(nfs=shared, lustre=tmp_path / "lustre", fuse=tmp_path / "fuse"))
    monkeypatch.setattr(store, "MOUNT_TABLE", table)
    monkeypatch.setattr(writer, "SNAPSHOT_SECONDS", 0.1)
    return shared


def _node(monkeypatch, tmp_path, name):
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / name))


def test_two_nodes_on_one_network_catalog_lose_neither_run(tmp_path, nfs, monkeypatch):
    requested = nfs / "ctx" / "catalog.db"
    said = []
    _node(monkeypatch, tmp_path, "node1")
    first = open_writer(str(requested), owner="run r1", warn=pytest.fail, say=said.append)
    _node(monkeypatch, tmp_path, "node2")
    second = open_writer(str(requested), owner="run r2", warn=pytest.fail, say=said.append)
    for run_id, sink in (("r1", first), ("r2", second)):
        sink.submit(ev.RunStarted(run_id=run_id))
        for i in range(20):
            for event in _job_events(run_id, i):
                sink.submit(event)
    first.close()
    second.close()
    own = sibling_path(str(requested), "run r2")
    assert second.store.location.snapshot == Path(own)
    assert len(said) == 1 and own in said[0] and "run r1" in said[0], said
    assert _jobs_recorded(str(requested), "r1") == 20
    assert _jobs_recorded(own, "r2") == 20
    assert not (nfs / "ctx" / "catalog.db.writer").exists()  # released
    # The next run (node 2 again) takes the lease and goes on from node 1's snapshot.
    third = open_writer(str(requested), owner="run r3", warn=pytest.fail, say=said.append)
    for event in _job_events("r3", 0):
        third.submit(event)
    third.close()
    assert _jobs_recorded(str(requested), "r1") == 20
    assert _jobs_recorded(str(requested), "r3") == 1


def test_a_stale_lease_is_taken_over_and_its_run_marked_abandoned(tmp_path):
    path = tmp_path / "catalog.db"
    said = []
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import os, signal
                from snakemake_executor_context.catalog.writing.writer import open_writer
                from snakemake_executor_context.fleet import events as ev
                w = open_writer({str(path)!r}, owner="run dead", warn=print, say=print,
                                heartbeat_run="dead")
                host = {socket.gethostname()!r}
                w.submit(ev.RunStarted(run_id="dead", pid=os.getpid(), host=host))
                assert w.flush(30)
                os.kill(os.getpid(), signal.SIGKILL)
            """),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -9, killed.stderr
    assert (tmp_path / "catalog.db.writer").exists()
    with open_reader(path).session() as session:
        assert queries.runs(session)[0].state == "running"
    # Its process is gone (same host): the lease is taken over without a minute's wait.
    again = open_writer(str(path), owner="run next", warn=pytest.fail, say=said.append)
    again.close()
    assert any("took it over" in line and "run dead" in line for line in said), said
    assert any("abandoned" in line and "dead" in line for line in said), said
    with open_reader(path).session() as session:
        (row,) = queries.runs(session)
    assert row.run_id == "dead" and row.state == "abandoned"


def test_a_live_lease_is_kept_and_a_silent_one_expires(tmp_path, monkeypatch):
    path = tmp_path / "c.db.writer"
    holder = WriterLease(path, "run a")
    assert holder.acquire() is None
    with pytest.raises(lease.LeaseHeld, match="run a on"):
        WriterLease(path, "run b").acquire()
    assert holder.beat()
    # Another host's lease, its heartbeat 61 s old: taken over.
    data = json.loads(path.read_text())
    data.update(host="elsewhere", heartbeat=time.time() - 61)
    path.write_text(json.dumps(data))
    taken = WriterLease(path, "run b").acquire()
    assert taken is not None and taken.owner == "run a" and taken.host == "elsewhere"
    assert not holder.beat()  # the old holder learns it lost the lease


def test_a_planted_local_directory_is_refused(tmp_path, nfs, monkeypatch):
    base = tmp_path / "local"
    base.mkdir()
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(base))
    planted = base / f"snakemake-context-{os.getuid()}"
    target = tmp_path / "attacker"
    target.mkdir()
    planted.symlink_to(target)
    requested = nfs / "catalog.db"
    with pytest.raises(UnsafePathError, match=r"Refusing .* is a symlink .* Fix: set SNAKE"):
        store.open_store(requested)
    assert not list(target.iterdir())  # nothing was created through the link
    planted.unlink()
    planted.mkdir(mode=0o755)
    planted.chmod(0o755)
    with pytest.raises(UnsafePathError, match=r"has mode 0755, open to other users"):
        store.open_store(requested)
    planted.chmod(0o700)
    # Another user's directory (simulated: this test runs as one user; the second-user
    # variant belongs to the trust tests).
    real_uid = os.getuid()
    monkeypatch.setattr(store.os, "getuid", lambda: real_uid + 1)
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(base))
    (base / f"snakemake-context-{real_uid + 1}").mkdir(mode=0o700)
    with pytest.raises(UnsafePathError, match=rf"belongs to uid {real_uid}, not to this user"):
        store.open_store(requested)
    monkeypatch.setattr(store.os, "getuid", lambda: real_uid)
    store.open_store(requested).close()
    assert (planted.stat().st_mode & 0o777) == 0o700


class _StubClient:
    """A Dask client whose scheduler has no hub (see RUN above)."""

    def subscribe_topic(self, *args):
        pass

    def unsubscribe_topic(self, *args):
        pass

    def run_on_scheduler(self, *args):
        raise OSError("no hub on this scheduler")

    register_plugin = run_on_scheduler

    def run(self, *args, **kwargs):
        return {}


class _StubConnection:
    client = _StubClient()
    description = "stub"
    embedded = False


class _Log:
    def __init__(self):
        self.lines = []

    def warning(self, message):
        self.lines.append(message)

    info = warning


@pytest.mark.slow
def test_events_a_run_could_not_record_are_counted_and_reported(tmp_path, monkeypatch):
    import sqlite3

    from snakemake_executor_context.executor.recording import Recording
    from snakemake_executor_context.fleet.state import FleetState

    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 100)
    path = tmp_path / "catalog.db"
    log = _Log()
    recording = Recording(_StubConnection(), "r", str(tmp_path), str(path), log)
    recording.begin(FleetState(), lambda e: None, jobs_total=3, declarations=[])
    # Waits for the writer's own first transaction (the run's start), then keeps the
    # catalog locked to the run's end.
    blocker = sqlite3.connect(path, timeout=30)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        for i in range(3):
            for event in _job_events("r", i):
                recording.emit(event)
        recording.finished(ev.RunFinished(run_id="r", ok=True))
    finally:
        blocker.rollback()
        blocker.close()
    (report,) = [line for line in log.lines if "did not record" in line]
    dropped = int(report.split("did not record ")[1].split()[0])
    assert dropped >= 3 * 4, report  # every job event at least, and said so
    assert any("cannot be written" in line for line in log.lines), log.lines


FULL_DISK = textwrap.dedent("""
    import resource, sys
    from snakemake_executor_context.catalog.writing.writer import open_writer
    from snakemake_executor_context.catalog.store import CatalogError

    # A disk that takes only this many bytes per file (writes beyond fail with EFBIG,
    # as a full disk fails them with ENOSPC).
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        open_writer(sys.argv[1], owner="run full", warn=print, say=print).close()
    except CatalogError as error:
        print("refused:", error)
        sys.exit(3)
""")


@pytest.mark.parametrize("limit", [64, 2048])
def test_a_catalog_that_fails_to_open_leaves_no_token_and_nothing_readable(tmp_path, limit):
    """A full disk: with 64 bytes the writer's token cannot be written, with 2 KB SQLite's
    first page cannot. Nothing is left that others could read (the catalog, if any,
    0600), and no empty token that would pass for a live writer's."""
    catalog = tmp_path / "catalog.db"
    os.umask(0o022)
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(catalog), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert not catalog.with_name("catalog.db.writer").exists(), sorted(os.listdir(tmp_path))
    for path in tmp_path.iterdir():
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
