"""The catalog on its own: schema, writer, readers, snapshots, the builder."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from snakemake_executor_context.catalog import store
from snakemake_executor_context.catalog.models import SCHEMA_VERSION, Meta
from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.store import (
    CatalogError,
    CatalogSchemaError,
    is_network_fs,
    open_reader,
    open_store,
)
from snakemake_executor_context.catalog.writing import writer
from snakemake_executor_context.catalog.writing.writer import CatalogWriter
from snakemake_executor_context.fleet import events as ev
from tests.catalog_builder import CatalogBuilder

MODEL = "m" * 64


class Warnings(list):
    """Collects the writer's warnings (its warn callback)."""

    def __call__(self, message: str) -> None:
        self.append(message)


def _job_events(run_id: str, i: int, address: str = "tcp://s0", at: float = 0.0) -> list[ev.Event]:
    """The four events of one job, as an executor and a server send them."""
    key = f"use-{i}-a1-{i:08x}"
    at = at or time.time()
    return [
        ev.JobDispatched(
            at=at, run_id=run_id, key=key, jobid=str(i), rule="use", context=MODEL, target=address
        ),
        ev.JobStarted(at=at, run_id=run_id, key=key, address=address, context=MODEL),
        ev.JobFinished(
            at=at + 0.5,
            run_id=run_id,
            key=key,
            address=address,
            context=MODEL,
            started=at,
            finished=at + 0.5,
            items=2,
        ),
        ev.JobReported(at=at + 0.5, run_id=run_id, key=key, jobid=str(i), rule="use"),
    ]


def test_builder_makes_a_catalog_the_queries_read(tmp_path):
    with CatalogBuilder(tmp_path / "c.db") as b:
        h200 = b.server("gpu0", gpu="NVIDIA H200")
        a100 = b.server("gpu1", gpu="NVIDIA A100-SXM4-80GB MIG 3g.40gb", mig=True)
        cpu = b.server("cpu0", gpu=None)
        model = b.context("smollm2", arguments={"source": "SmolLM2-135M"})
        run = b.run(jobs_total=14)
        b.load(h200, model, seconds=12.0, from_cache=True)
        for _ in range(10):
            b.job(run, "score", server=h200, context=model, seconds=2.0, items=32)
        b.load(a100, model, seconds=20.0)
        b.job(run, "score", server=a100, context=model, seconds=4.0, items=32, ok=False)
        b.job(run, "report", server=cpu)
        b.start_job(run, "score", server=a100, context=model)
        b.tick(7)
        (lost,) = b.lose_server(a100)
        b.finish_run(run, ok=False)
    reader = open_reader(tmp_path / "c.db")
    with reader.session() as session:
        report = queries.overview(session)
    fleet = {row["gpu_model"]: row for row in report["fleet"]}
    assert fleet["h200"]["servers"] == 1 and fleet["h200"]["compute_capability"] == "9.0"
    assert fleet["cpu"]["servers"] == 1
    assert fleet["a100-sxm4-80gb-mig-3g.40gb"]["lost"] == 1
    (context,) = report["contexts"]
    assert context["name"] == "smollm2" and context["warm_on"] == ["gpu0"]
    assert context["loads"] == 2 and context["from_cache"] == 1
    assert context["arguments"] == {"source": "SmolLM2-135M"}
    (run_row,) = report["runs"]
    assert run_row["state"] == "failed" and run_row["jobs_total"] == 14
    assert (run_row["jobs_ok"], run_row["jobs_failed"], run_row["items"]) == (11, 1, 320)
    (loss,) = report["losses"]
    assert loss["server"] == "gpu1" and loss["jobs_lost"] == 1 and loss["seconds_lost"] == 7.0
    assert loss["jobs"] == [f"score ({lost})"]
    assert report["jobs"][0]["key"] == lost and report["jobs"][0]["outcome"] == "lost"
    speed = {(row["context"], row["gpu_model"]): row for row in report["throughput"]}
    assert speed[("smollm2", "h200")]["items_per_second"] == 16.0
    kinds = [event["kind"] for event in report["events"]]
    assert {"server-lost", "context-ready", "job-failed", "run-finished"} <= set(kinds)
    measured = queries.placement_measurements(reader.session())
    assert [model, "h200", 2.0, 10] in measured["job"]
    assert json.dumps(report)  # plain data all the way down


def test_schema_version_mismatch_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "old.db"
    open_store(path).close()
    catalog = open_store(path)
    with catalog.session() as session, session.begin():
        session.get(Meta, "schema_version").value = str(SCHEMA_VERSION + 1)
    catalog.close()
    with pytest.raises(CatalogSchemaError) as raised:
        open_store(path)
    message = str(raised.value)
    assert f"has schema version {SCHEMA_VERSION + 1}" in message
    assert f"writes schema version {SCHEMA_VERSION}" in message
    assert "--context-catalog NEW.db" in message and f"mv {path} {path}.old" in message
    assert "upgrade snakemake-executor-plugin-context" in message  # it is newer
    with pytest.raises(CatalogSchemaError):
        open_reader(path)
    # A SQLite file that is something else entirely is not taken over either.
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE runs (x)")
    with pytest.raises(CatalogSchemaError, match="is not a catalog of this plugin"):
        open_store(other)


def test_unwritable_catalog_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CatalogError, match=r"Cannot open the catalog .*a-file/catalog\.db"):
        open_store(blocker / "catalog.db")


def test_a_locked_catalog_warns_once_and_the_writer_catches_up(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(writer, "RETRY_SECONDS", 0.2)
    path = tmp_path / "c.db"
    warnings = Warnings()
    catalog = CatalogWriter(open_store(path), warn=warnings)
    catalog.submit(ev.RunStarted(run_id="r"))
    assert catalog.flush(30)
    blocker = sqlite3.connect(path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(5):
        for item in _job_events("r", i):
            assert catalog.submit(item)  # never blocks
    while not warnings:
        time.sleep(0.05)
    blocker.rollback()
    blocker.close()
    for i in range(5, 8):
        for event in _job_events("r", i):
            catalog.submit(event)
    deadline = time.monotonic() + 60
    while catalog.written < 1 + 8 * 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    catalog.close()
    assert len(warnings) == 1 and "cannot be written" in warnings[0], warnings
    assert "locked" in warnings[0]
    with open_reader(path).session() as session:
        assert queries.counts(session).attempts == 8  # the kept-back batch got in
        assert queries.runs(session)[0].jobs_ok == 8


def test_a_full_queue_drops_and_warns_once_without_blocking(tmp_path):
    path = tmp_path / "c.db"
    warnings = Warnings()
    catalog = CatalogWriter(open_store(path), warn=warnings, queue_size=3)
    # The writer is stuck behind a lock (up to its busy timeout) while events pour in.
    blocker = sqlite3.connect(path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    accepted = [catalog.submit(ev.RunHeartbeat(run_id="r")) for _ in range(200)]
    blocker.rollback()
    blocker.close()
    catalog.close(timeout=1.0)
    assert not all(accepted) and catalog.dropped > 0
    assert any("queue of 3 events is full" in w for w in warnings)
    assert len([w for w in warnings if "is full" in w]) == 1


MOUNTS = """\
sysfs /sys sysfs rw 0 0
/dev/sda1 / ext4 rw 0 0
tmpfs /tmp tmpfs rw 0 0
server:/export/home {nfs} nfs4 rw,vers=4.2 0 0
lustre@o2ib:/scratch {lustre} lustre rw 0 0
sshfs#me@h: {fuse} fuse.sshfs rw 0 0
"""


@pytest.fixture
def network_mounts(tmp_path, monkeypatch):
    """A mount table in which tmp_path/nfs is NFS, tmp_path/lustre Lustre and
    tmp_path/fuse an sshfs mount (no real network filesystem exists here)."""
    dirs = {name: tmp_path / name for name in ("nfs", "lustre", "fuse", "local")}
    for directory in dirs.values():
        directory.mkdir()
    table = tmp_path / "mounts"
    table.write_text(MOUNTS.format(**{k: v for k, v in dirs.items() if k != "local"}))
    monkeypatch.setattr(store, "MOUNT_TABLE", table)
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / "node-local"))
    return dirs


def test_network_filesystems_are_recognised(network_mounts):
    assert is_network_fs(network_mounts["nfs"] / "deeper" / "catalog.db")
    assert is_network_fs(network_mounts["lustre"])
    assert is_network_fs(network_mounts["fuse"] / "x.db")
    assert not is_network_fs(network_mounts["local"] / "x.db")


def test_a_catalog_kept_in_the_private_root_says_which_of_the_two_reasons(network_mounts):
    on_nfs = store.resolve_location(network_mounts["nfs"] / "catalog.db")
    assert on_nfs.snapshot is not None and "on a network filesystem" in on_nfs.describe()
    shared = network_mounts["local"] / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a local directory anyone may write, not a network filesystem
    open_to_all = store.resolve_location(shared / "catalog.db")
    assert open_to_all.snapshot is not None
    described = open_to_all.describe()
    assert "network" not in described, described
    assert f"in {shared}, a directory other users may write (mode 0777)" in described


def test_catalog_on_a_network_filesystem_is_a_published_snapshot(
    tmp_path, network_mounts, monkeypatch
):
    monkeypatch.setattr(writer, "SNAPSHOT_SECONDS", 0.1)
    requested = network_mounts["nfs"] / "ctx" / "catalog.db"
    catalog = open_store(requested)
    location = catalog.location
    assert location.snapshot == requested
    assert location.path is not None and str(location.path).startswith(str(tmp_path / "node-local"))
    warnings = Warnings()
    live = CatalogWriter(catalog, warn=warnings)
    live.submit(ev.RunStarted(run_id="r1"))
    for i in range(3):
        for event in _job_events("r1", i):
            live.submit(event)
    deadline = time.monotonic() + 60
    while not requested.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Published while the writer runs, and readable immutable.
    reader = open_reader(requested)
    assert "immutable=1" in str(reader.engine.url)
    live.close()
    assert not warnings
    with open_reader(requested).session() as session:
        assert queries.counts(session).attempts == 3
    # Only the snapshot is on the network filesystem: no WAL or journal beside it.
    assert sorted(p.name for p in requested.parent.iterdir()) == ["catalog.db"]
    assert sqlite3.connect(requested).execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    # On another node (no local copy), a writer goes on from the published snapshot.
    location.path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{location.path}{suffix}").unlink(missing_ok=True)
    again = CatalogWriter(open_store(requested), warn=warnings)
    for event in _job_events("r2", 9):
        again.submit(event)
    again.close()
    with open_reader(requested).session() as session:
        assert queries.counts(session).attempts == 4
        assert queries.counts(session).runs == 2


READER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from snakemake_executor_context.catalog.reading import status as queries
    from snakemake_executor_context.catalog.store import open_reader

    path, stop = sys.argv[1], Path(sys.argv[2])
    catalog = None
    while True:
        last = stop.exists()
        try:
            if catalog is None:
                catalog = open_reader(path)
            with catalog.session() as session:
                counts = queries.counts(session)
                runs = queries.runs(session)
            done = runs[0].jobs_ok if runs else 0
            print(json.dumps({"attempts": counts.attempts, "jobs_ok": done}), flush=True)
        except Exception as error:
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        if last:
            break
        time.sleep(0.02)
""")


def test_a_reader_polling_a_busy_writer_never_sees_a_lock_and_converges(tmp_path):
    path = tmp_path / "c.db"
    warnings = Warnings()
    catalog = CatalogWriter(open_store(path), warn=warnings)
    catalog.submit(ev.RunStarted(run_id="r"))
    assert catalog.flush(30)
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    jobs, sent, started = 150, 0, time.monotonic()
    for i in range(jobs):
        for item in _job_events("r", i):
            catalog.submit(item)
            sent += 1
        # Paced at 200 events per second (50 jobs of 4 events): a busy run.
        time.sleep(max(0.0, started + sent / 200 - time.monotonic()))
    assert catalog.flush(60)
    stop.touch()
    output, _ = reader.communicate(timeout=120)
    catalog.close()
    polls = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert not warnings
    assert "locked" not in output and not any("error" in poll for poll in polls), output[-2000:]
    assert len(polls) >= 10  # it polled while the writer wrote
    attempts = [poll["attempts"] for poll in polls]
    assert attempts == sorted(attempts)  # never went backwards
    assert polls[-1] == {"attempts": jobs, "jobs_ok": jobs}


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    from tests.conftest import BIN

    return subprocess.run(
        [str(BIN / "snakemake-context"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_story_finds_the_newest_job_that_wrote_an_output_file(tmp_path):
    """`snakemake-context story PATH`: the path of an output file, relative to the
    directory the command runs in or absolute, names the newest job whose run (in that
    workflow directory) declared it; --run names another run's; an unknown path is one
    line that names it and what to give instead."""
    path = tmp_path / "catalog.db"
    # As a run records its directory: os.getcwd(), symbolic links resolved.
    here, elsewhere = tmp_path.resolve() / "wf", tmp_path.resolve() / "other"
    (here / "out").mkdir(parents=True)
    elsewhere.mkdir()
    with CatalogBuilder(path) as b:
        server = b.server("cpu0")
        old = b.run("run-old", workdir=str(here))
        b.job(old, "score", server=server, wildcards={"shard": "1"}, outputs=["out/1.txt"])
        b.finish_run(old)
        b.tick(60)
        new = b.run("run-new", workdir=str(here))
        b.job(new, "score", server=server, wildcards={"shard": "2"}, outputs=["out/2.txt"])
        b.job(new, "score", server=server, wildcards={"shard": "1"}, outputs=["out/1.txt"])
        b.job(new, "index", server=server, outputs=["/refs/genome.fa.fai"])
        b.finish_run(new)
        b.tick(60)
        # The newest run of all, in another workflow directory, with the same name.
        other = b.run("run-other", workdir=str(elsewhere))
        b.job(other, "score", server=server, wildcards={"shard": "7"}, outputs=["out/1.txt"])
        b.finish_run(other)
    catalog = ("--catalog", str(path))

    def first_line(*args: str, cwd: Path = here) -> str:
        done = _cli("story", *args, *catalog, cwd=cwd)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()[0]

    for spelling, cwd in [
        ("out/1.txt", here),
        ("./out//1.txt", here),
        (str(here / "out" / "1.txt"), elsewhere),
        ("1.txt", here / "out"),
    ]:
        assert first_line(spelling, cwd=cwd).startswith("score(shard=1)"), spelling
        assert "of run run-new" in first_line(spelling, cwd=cwd), spelling
    assert "of run run-old" in first_line("out/1.txt", "--run", old)
    assert first_line("out/1.txt", cwd=elsewhere).startswith("score(shard=7)")
    assert first_line("/refs/genome.fa.fai").startswith("index")
    # What it accepted before still names the job.
    assert first_line("score(shard=2)", "--run", new).startswith("score(shard=2)")

    unknown = _cli("story", "out/9.txt", *catalog, cwd=here)
    assert unknown.returncode != 0
    (line,) = unknown.stderr.strip().splitlines()
    assert f"has the output '{here / 'out' / '9.txt'}'" in line, line
    assert "Fix: give the path of an output file of a recorded job" in line, line
    elsewhere_only = _cli("story", "out/2.txt", "--run", other, *catalog, cwd=here)
    assert elsewhere_only.returncode != 0
    assert f"No job of run {other} has the output" in elsewhere_only.stderr


def test_a_group_jobs_outputs_are_each_of_its_jobs_normalized():
    """What the catalog records of a job's outputs: a group's are its jobs', the file
    one passes to the next too, each normalized as ``story PATH`` compares them."""
    from types import SimpleNamespace

    from snakemake_executor_context.executor.jobbuild import output_paths

    first = SimpleNamespace(output=["mid/1.txt"], is_group=lambda: False)
    second = SimpleNamespace(output=["./out//1.txt", "/refs/x.fai"], is_group=lambda: False)
    group = SimpleNamespace(jobs=[first, second], is_group=lambda: True)
    assert output_paths(second) == ("/refs/x.fai", "out/1.txt")
    assert output_paths(group) == ("/refs/x.fai", "mid/1.txt", "out/1.txt")


def test_up_refuses_a_catalog_of_another_schema_before_starting(tmp_path):
    path = tmp_path / "old.db"
    catalog = open_store(path)
    with catalog.session() as session, session.begin():
        session.get(Meta, "schema_version").value = "0"
    catalog.close()
    scheduler = tmp_path / "s.json"
    up = _cli("up", "--scheduler-file", str(scheduler), "--catalog", str(path))
    assert up.returncode == 1
    assert "has schema version 0" in up.stderr and "--context-catalog NEW.db" in up.stderr
    assert not scheduler.exists() and not scheduler.with_suffix(".pid").exists()


def test_status_reads_a_catalog_without_a_cluster(tmp_path):
    with CatalogBuilder(tmp_path / "c.db") as b:
        server = b.server("gpu0")
        run = b.run()
        b.job(run, "score", server=server, context=b.context("m"), items=4)
        b.finish_run(run)
    text = _cli(
        "status",
        "--scheduler-file",
        str(tmp_path / "none.json"),
        "--catalog",
        str(tmp_path / "c.db"),
    )
    assert text.returncode == 0, text.stderr
    for heading in (
        "Fleet by GPU model:",
        "Contexts:",
        "Runs:",
        "Recent server losses:",
        "Recent jobs:",
    ):
        assert heading in text.stdout
    assert "h200" in text.stdout and "score(i=" in text.stdout
    data = json.loads(
        _cli(
            "status",
            "--scheduler-file",
            str(tmp_path / "none.json"),
            "--catalog",
            str(tmp_path / "c.db"),
            "--json",
        ).stdout
    )
    assert data["servers"] == {} and data["runs"][0]["jobs_ok"] == 1
    # Nothing to show at all: a clear error.
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = _cli("status", "--scheduler-file", str(empty / "none.json"), cwd=empty)
    assert nothing.returncode == 1 and "no catalog was found" in nothing.stderr


@pytest.mark.slow
def test_status_and_story_read_the_running_clusters_catalog_else_this_directorys(
    tmp_path, make_workflow
):
    """A stopped cluster's catalog stays beside its scheduler file; in a workflow
    directory with an embedded run's own catalog, status and story read the
    directory's (status says so on its first line); once a cluster runs, its catalog
    (a job story does not find there says where it looked)."""
    from tests.conftest import context_run, persistent_cluster, toy_files

    cluster = tmp_path / "home" / "scheduler.json"
    cluster.parent.mkdir()
    with CatalogBuilder(cluster.with_suffix(".db")) as b:
        b.finish_run(b.run("old-run"))
        b.server("old0")
    workdir = make_workflow(
        toy_files(
            'rule use:\n  output: "out.txt"\n  resources: context="toy"\n'
            '  script: "scripts/use.py"\n'
        )
    )
    context_run(workdir, "--context-servers", "1").check()
    own = workdir / ".snakemake" / "context" / "catalog.db"
    attach = ("--scheduler-file", str(cluster))

    status = _cli("status", *attach, cwd=workdir)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == f"Catalog: {own} (this directory's)", status.stdout
    assert "cpu0" in status.stdout and "old0" not in status.stdout, status.stdout
    story = _cli("story", "out.txt", *attach, cwd=workdir)
    assert story.returncode == 0 and "use [job 0] of run" in story.stdout, story.stderr
    elsewhere = _cli("status", *attach, cwd=tmp_path)
    assert elsewhere.stdout.splitlines()[0] == (
        f"Catalog: {cluster.with_suffix('.db')} (a stopped cluster's, beside {cluster})"
    ), elsewhere.stdout
    assert "old0" in elsewhere.stdout

    with persistent_cluster(cluster.parent, "--servers", "0"):
        status = _cli("status", *attach, cwd=workdir)
        first = f"Catalog: {cluster.with_suffix('.db')} (the running cluster's)"
        assert status.stdout.splitlines()[0] == first, status.stdout
        story = _cli("story", "out.txt", *attach, cwd=workdir)
        assert story.returncode == 1 and len(story.stderr.splitlines()) == 1, story.stderr
        assert first in story.stderr, "a job it has not: the line names where it looked"


class _RecordingScheduler:
    """Stands in for the Dask scheduler's event log only: the plugin publishes
    through ``log_event`` and then sees its own events, as on a real scheduler."""

    def __init__(self, plugin) -> None:
        self.plugin = plugin
        self.left: list[ev.ServerLeft] = []

    def log_event(self, topic, msg) -> None:
        for item in ev.decode(msg):
            if isinstance(item, ev.ServerLeft):
                self.left.append(item)
        self.plugin.log_event(topic, msg)


@pytest.mark.parametrize(
    ("started", "processing", "lost"),
    [
        # Running job known; the second key was queued behind it (prefetch).
        (["use-0-a1-aa.1"], ["use-0-a1-aa.1", "use-2-a1-bb.1"], ["use-0-a1-aa.1"]),
        # Its start had not reached the view yet: one slot, so one job was hit.
        ([], ["use-0-a1-aa.1", "use-2-a1-bb.1"], ["use-0-a1-aa.1"]),
        # Nothing there: a clean departure with no loss.
        ([], [], []),
    ],
)
def test_a_lost_server_counts_the_jobs_it_ran_not_those_queued_behind(started, processing, lost):
    from snakemake_executor_context.cluster.hub import FleetHub

    plugin = FleetHub()
    plugin.scheduler = scheduler = _RecordingScheduler(plugin)
    address = "tcp://127.0.0.1:1"
    plugin._publish(ev.ServerJoined(address=address, name="cpu0", host="127.0.0.1", slots=1))
    for key in started:
        plugin._publish(ev.JobStarted(key=key, address=address, run_id="r"))
    plugin.log_event(
        "all",
        {
            "action": "remove-worker",
            "worker": address,
            "processing-tasks": processing,
            "stimulus_id": "handle-worker-cleanup-1795953990.72",
        },
    )
    (left,) = scheduler.left
    assert [job.key for job in left.lost_jobs()] == lost
    # Nothing is known of the process (no nanny of ours): a preemption, classified.
    assert left.reason == "preemption: lost (connection closed, no exit code known) " + (
        "(handle-worker-cleanup)"
    )


def test_an_attempts_end_recorded_twice_counts_once(tmp_path):
    """The executor records an attempt's end from its result when the server's own
    JobFinished has not come; when it comes later, nothing is counted twice."""
    from snakemake_executor_context.catalog.models import Attempt, Run

    catalog = CatalogWriter(open_store(tmp_path / "c.db"), warn=pytest.fail)
    catalog.submit(ev.RunStarted(run_id="r"))
    dispatched, started, finished, reported = _job_events("r", 1)
    assert isinstance(finished, ev.JobFinished)
    finished.loaded = [MODEL]
    for event in (dispatched, started, finished, reported, finished):
        catalog.submit(event)
    catalog.close()
    with open_reader(tmp_path / "c.db").session() as session:
        (run,) = session.query(Run).all()
        (attempt,) = session.query(Attempt).all()
        assert run.loads == 1 and run.jobs_ok == 1
        assert attempt.outcome == "ok" and attempt.items == 2


def test_a_late_end_of_a_lost_attempt_is_fenced_off(tmp_path):
    """A server stopped (SIGSTOP) mid-job, lost, then woken: its late JobFinished of
    the given-up attempt never turns the lost attempt into an ok one."""
    from snakemake_executor_context.catalog.models import Attempt, Run

    catalog = CatalogWriter(open_store(tmp_path / "c.db"), warn=pytest.fail)
    catalog.submit(ev.RunStarted(run_id="r"))
    catalog.submit(ev.ServerJoined(address="tcp://s0", name="cpu0"))
    dispatched, started, finished, _ = _job_events("r", 1)
    assert isinstance(finished, ev.JobFinished)
    finished.loaded = [MODEL]
    catalog.submit(dispatched)
    catalog.submit(started)
    left = ev.ServerLeft(address="tcp://s0", reason="preemption: heartbeat lost")
    left.lost = [ev.LostJob(key=finished.key, started=started.at).to_wire()]
    catalog.submit(left)
    catalog.submit(finished)
    catalog.close()
    with open_reader(tmp_path / "c.db").session() as session:
        (attempt,) = session.query(Attempt).all()
        (run,) = session.query(Run).all()
        assert attempt.outcome == "lost"
        assert run.loads == 0 and run.jobs_ok == 0


def test_attempts_a_loss_record_missed_join_that_servers_loss(tmp_path):
    """A server's leaving listed one of the two attempts it ran; the run's dispatch
    tells the other (AttemptsLost): one loss row of the server, both attempts lost in
    it. A server that left listing none gets a loss row from dispatch's record alone."""
    from snakemake_executor_context.catalog.models import Attempt, ServerLoss

    catalog = CatalogWriter(open_store(tmp_path / "c.db"), warn=pytest.fail)
    catalog.submit(ev.RunStarted(run_id="r"))
    for address in ("tcp://s0", "tcp://s1"):
        catalog.submit(ev.ServerJoined(address=address, name=address[-2:]))
    now = time.time()
    first, second, third = (_job_events("r", i, address=a, at=now)[:2] for i, a in
                            ((1, "tcp://s0"), (2, "tcp://s0"), (3, "tcp://s1")))  # fmt: skip
    for dispatched, started in (first, second, third):
        catalog.submit(dispatched)
        catalog.submit(started)
    left = ev.ServerLeft(at=now + 4, address="tcp://s0", reason="crash: killed by SIGKILL")
    left.lost = [ev.LostJob(key=first[0].key, started=now).to_wire()]
    catalog.submit(left)
    catalog.submit(ev.ServerLeft(at=now + 4, address="tcp://s1", reason="crash: SIGKILL"))
    for address, dispatched in (("tcp://s0", second[0]), ("tcp://s1", third[0])):
        told = ev.LostJob(key=dispatched.key, run_id="r", started=now).to_wire()
        lost = ev.AttemptsLost(at=now + 4, run_id="r", address=address, reason="crash", lost=[told])
        catalog.submit(lost)
    catalog.close()
    with open_reader(tmp_path / "c.db").session() as session:
        attempts = session.query(Attempt).order_by(Attempt.key).all()
        assert [a.outcome for a in attempts] == ["lost", "lost", "lost"]
        losses = session.query(ServerLoss).order_by(ServerLoss.id).all()
        assert [(loss.jobs_lost, round(loss.seconds_lost)) for loss in losses] == [(2, 8), (1, 4)]
        assert [a.loss_id for a in attempts] == [losses[0].id, losses[0].id, losses[1].id]


def test_story_finds_a_job_by_its_rule_and_wildcards_in_the_run_named(tmp_path):
    """`snakemake-context story` with a rule and its wildcards, in both spellings, in
    the latest run or the one --run names; a rule that matches several jobs, or none,
    is one line that says how to name one."""
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        toy = b.context("toy", loader="pkg:load")
        server = b.server("gpu0")
        first = b.run("run-first")
        for shard in ("1", "2"):
            b.job(first, "score", server=server, context=toy, wildcards={"shard": shard})
        b.finish_run(first)
        b.tick(60)
        latest = b.run("run-latest")
        b.job(latest, "score", server=server, context=toy, wildcards={"shard": "1"})
        b.finish_run(latest)
    named = _cli("story", "score(shard=2)", "--run", first, "--catalog", str(path))
    assert named.returncode == 0, named.stderr
    assert named.stdout.splitlines()[0].startswith("score(shard=2)"), named.stdout
    assert f"run {first}" in named.stdout.splitlines()[0], named.stdout
    spaced = _cli("story", "score shard=1", "--catalog", str(path))
    assert spaced.returncode == 0, spaced.stderr
    assert f"run {latest}" in spaced.stdout.splitlines()[0], spaced.stdout
    missing = _cli("story", "score(shard=2)", "--catalog", str(path))  # not in the latest
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
    assert f"No job 'score(shard=2)' in run {latest}" in missing.stderr, missing.stderr
    several = _cli("story", "score", "--run", first, "--catalog", str(path))
    assert several.returncode != 0 and len(several.stderr.strip().splitlines()) == 1
    assert "2 jobs of run run-first match 'score'" in several.stderr, several.stderr
