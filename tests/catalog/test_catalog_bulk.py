"""The writer applies a batch's per-job events in bulk: the same rows as one event at
a time, in a few statements a batch."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select

from snakemake_executor_context.catalog.models import Base, Meta
from snakemake_executor_context.catalog.store import open_store
from snakemake_executor_context.catalog.writing.record import Recorder
from snakemake_executor_context.fleet import events as ev
from tests.catalog.test_catalog_postgres import empty_database, postgres  # noqa: F401

MODEL = "m" * 64
OTHER = "o" * 64


def _job_life(run_id: str, i: int, at: float) -> list[ev.Event]:
    """One job's events, as an executor and its servers send them; ``i`` picks what
    befalls it (ok, failed, cancelled, run again by Dask, retried, a group)."""
    key, address, other = f"use-{i}-a1-{i:08x}", f"tcp://s{i % 3}", f"tcp://s{(i + 1) % 3}"
    outputs = [f"out/{i}.txt", f"out/{i}.log", f"out/{i}.txt"]
    dispatched = ev.JobDispatched(
        at=at,
        run_id=run_id,
        key=key,
        jobid=str(i),
        rule="use",
        wildcards={"i": str(i)},
        context=MODEL if i % 4 else OTHER,
        context_name="model",
        target=address if i % 5 else None,
        submitted=at - 1,
        reason="warm",
        log=f"logs/{i}.log",
        stimulus="job-ready",
        outputs=outputs,
    )
    started = ev.JobStarted(at=at + 0.1, run_id=run_id, key=key, address=address)
    ok, cancelled = i % 7 != 3, i % 11 == 5
    finished = ev.JobFinished(
        at=at + 1,
        run_id=run_id,
        key=key,
        address=address,
        ok=ok and not cancelled,
        cancelled=cancelled,
        started=at + 0.1,
        finished=at + 1,
        items=i % 5,
        load_seconds=2.0 if i % 6 == 0 else 0.0,
        loaded=[MODEL] if i % 6 == 0 else [],
        batches={"8": 3, "2": 1} if i % 2 else {},
    )
    outcome = "cancelled" if cancelled else ("ok" if ok else "failed")
    reported = ev.JobReported(
        at=at + 1.2,
        run_id=run_id,
        key=key,
        jobid=str(i),
        rule="use",
        outcome=outcome,
        message=None if ok else f"boom {i}\nTraceback ...",
        stimulus="attempt-ended",
        outputs=outputs,
        jobs=3 if i % 9 == 0 else (0 if i % 9 == 1 else 1),
    )
    story = ev.JobStory(
        at=at + 0.2, run_id=run_id, key=key, jobid=str(i), rule="use", what="placed", detail="x"
    )
    life: list[ev.Event] = [dispatched, started, story, finished, reported]
    if i % 4 == 1:  # Dask ran it again on another server (the first was lost)
        life.insert(2, ev.JobStarted(at=at + 0.5, run_id=run_id, key=key, address=other))
    if i % 8 == 2:  # Snakemake's retry: a second attempt of the same job
        again = f"use-{i}-a2-{i:08x}"
        life += [
            ev.JobDispatched(at=at + 2, run_id=run_id, key=again, jobid=str(i), attempt=2),
            ev.JobStarted(at=at + 2.1, run_id=run_id, key=again, address=other),
            ev.JobFinished(at=at + 3, run_id=run_id, key=again, address="", items=7),
            ev.JobStory(at=at + 3, run_id=run_id, key=f"use-{i}", jobid=str(i), what="requeued"),
        ]
    return life


def _stream(seed: int, jobs: int = 24) -> list[ev.Event]:
    """A run's events shuffled (any order between processes), some sent twice (a
    replay), with servers joining, one lost mid-run, and the run's start and end."""
    rng = random.Random(seed)
    events: list[ev.Event] = [ev.ServerJoined(at=1.0, address="tcp://s0", name="gpu0")]
    for i in range(jobs):
        events += _job_life("r", i, 10.0 + i)
    events.append(ev.ServerJoined(at=2.0, address="tcp://s1", name="gpu1"))
    lost = [ev.LostJob(key=f"use-{i}-a1-{i:08x}", started=10.0 + i).to_wire() for i in (0, 3)]
    events.append(ev.ServerLeft(at=20.0, address="tcp://s0", reason="crash", lost=lost))
    events.append(ev.RunHeartbeat(at=30.0, run_id="r"))
    events.append(ev.JobReported(at=31.0, run_id="other", key="k-1-a1-x", jobid="1", rule="r"))
    events += rng.sample(events, len(events) // 4)
    rng.shuffle(events)
    return [ev.RunStarted(at=0.5, run_id="r"), *events, ev.RunFinished(at=99.0, run_id="r")]


def _contents(spec: str | Path) -> dict[str, list[tuple[Any, ...]]]:
    store = open_store(spec)
    with store.session() as session:
        tables = {
            table.name: [
                tuple(row) for row in session.execute(select(table).order_by(*table.primary_key))
            ]
            for table in Base.metadata.sorted_tables
            if table.name != Meta.__tablename__  # when each catalog was made
        }
    store.close()
    return tables


def _record(spec: str | Path, batches: list[list[ev.Event]]) -> dict[str, list[tuple[Any, ...]]]:
    store = open_store(spec)
    recorder = Recorder()
    for batch in batches:
        with store.session() as session, session.begin():
            recorder.apply(session, batch)
    store.close()
    return _contents(spec)


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_in_bulk_records_what_its_events_one_at_a_time_record(tmp_path, seed):
    """The same shuffled, replayed stream, one event a transaction, all in one, and
    in batches of random sizes: every table holds the same rows (ids included)."""
    stream = _stream(seed)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), 12))
    batches = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    one_by_one = _record(tmp_path / "one.db", [[event] for event in stream])
    in_bulk = _record(tmp_path / "bulk.db", [stream])
    in_batches = _record(tmp_path / "batches.db", batches)
    assert one_by_one["jobs"] and one_by_one["attempts"] and one_by_one["job_story"]
    for table, rows in one_by_one.items():
        assert in_bulk[table] == rows, table
        assert in_batches[table] == rows, table


@pytest.mark.parametrize("seed", range(2))
def test_on_postgres_a_batch_in_bulk_records_what_its_events_one_at_a_time_record(
    postgres,  # noqa: F811
    seed,
):
    """The same on PostgreSQL, whose serials give the ids of the rows a batch adds."""
    stream = _stream(seed)
    one_by_one = _record(postgres, [[event] for event in stream])
    empty_database(postgres)
    in_bulk = _record(postgres, [stream])
    for table, rows in one_by_one.items():
        assert in_bulk[table] == rows, table


def test_a_batch_of_many_jobs_is_a_few_statements(tmp_path):
    """A batch's statements do not grow with its jobs: 10 and 40 jobs' events (five
    to nine a job) are written in as many statements."""
    store = open_store(tmp_path / "c.db")
    recorder = Recorder()
    statements: list[str] = []
    sa_event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))

    def count(batch: list[ev.Event]) -> int:
        statements.clear()
        with store.session() as session, session.begin():
            recorder.apply(session, batch)
        return len(statements)

    count([ev.RunStarted(at=0.5, run_id="r"), ev.ServerJoined(at=1.0, address="tcp://s0")])
    few = count([e for i in range(10) for e in _job_life("r", i, 10.0 + i)])
    many = count([e for i in range(10, 50) for e in _job_life("r", i, 10.0 + i)])
    store.close()
    assert many <= few <= 20, (few, many)
