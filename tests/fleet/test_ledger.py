"""The ledger: every server-second in one bucket, each bucket from its own intervals,
on catalogs built through the catalog's own recording code (exact to the
millisecond), and its export."""

from __future__ import annotations

import csv
import io
import itertools
import json

import pytest
from sqlalchemy import select

from snakemake_executor_context.catalog.models import ForwardBatch, Pilot
from snakemake_executor_context.catalog.reading.ledger import (
    EXPORT_COLUMNS,
    export_csv,
    export_json,
    read_ledger,
    window_of,
)
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.accounting import (
    Load,
    ServerLife,
    Work,
    account,
    bucket_seconds,
    load_stretches,
)
from snakemake_executor_context.fleet.buckets import Bucket
from snakemake_executor_context.fleet.intervals import intersect, merge
from snakemake_executor_context.fleet.loads import LoadKind, load_parts
from tests.catalog_builder import EPOCH, CatalogBuilder

T0 = EPOCH


def assert_partition(ledger) -> None:
    """No two buckets of a server overlap, and its buckets sum to its life (1 ms)."""
    for server in ledger.servers:
        spans = {}
        for s in server.segments:
            spans.setdefault(s.bucket, []).append((s.start, s.end))
        merged = {b: merge(v) for b, v in spans.items()}
        for one, other in itertools.combinations(merged, 2):
            assert not intersect(merged[one], merged[other]), (server.name, one, other)
        assert sum(server.seconds().values()) == pytest.approx(server.life, abs=1e-3), server.name


def _build(path):
    """Server a (one GPU, H200) lives 38 s through every bucket a server without a batch
    system has; pilot b (two GPUs) is allocated 10 s before it registers, loses its one
    job (and the load in it) 12 s in, and its batch job ends 28 s after."""
    with CatalogBuilder(path) as b:
        run = b.run("run-1", jobs_total=4)
        a = b.server("a", gpu="NVIDIA H200")
        pilot = b.server("b", gpu="NVIDIA A100-SXM4-80GB", allocated_at=T0 - 10, gpus=2)
        b.pilot("b", pilot_kind="a100", job_id="77", submitted=T0 - 20, registered=T0)
        model = b.context("smollm2")
        other = b.context("embedder")
        b.tick(1)
        lost = b.start_job(run, "embed", server=pilot, context=other)
        b.emit(
            ev.ContextLoading(at=b.now, address=pilot, identity=other, name="embedder")
        )  # never ready: lost with its server
        b.tick(1)
        first = b.start_job(run, "score", server=a, context=model)
        b.load(a, model, seconds=10, conversions=1, reload_seconds=3, from_cache=False)
        assert b.lose_server(pilot, reason="preemption: injected SIGKILL") == [lost]
        b.finish_job(first, seconds=4, load_seconds=10, batches={8: 3, 4: 1})
        b.tick(5)
        b.job(run, "score", server=a, context=model, seconds=3)
        b.job(run, "score", server=a, context=model, seconds=2, ok=False)
        b.tick(4)
        b.evict(a, model)
        b.tick(5)
        b.drain(a)
        b.tick(3)
        b.leave(a)
        b.tick(2)
        b.pilot(
            "b",
            pilot_kind="a100",
            job_id="77",
            submitted=T0 - 20,
            registered=T0,
            ended=b.now,
            released=True,
        )
        b.finish_run(run)


EXPECTED_A = {
    Bucket.STARTING: 2.0,
    Bucket.LOADING_CONVERSION: 7.0,
    Bucket.LOADING_CACHE: 3.0,
    Bucket.RUNNING: 7.0,
    Bucket.FAILED: 2.0,
    Bucket.IDLE_WARM: 9.0,
    Bucket.IDLE_COLD: 5.0,
    Bucket.DRAINING: 3.0,
}
EXPECTED_B = {
    Bucket.ALLOCATED_BEFORE: 10.0,
    Bucket.STARTING: 1.0,
    Bucket.LOST: 11.0,
    Bucket.ALLOCATED_AFTER: 28.0,
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    path = tmp_path_factory.mktemp("ledger") / "catalog.db"
    _build(path)
    return path


def test_every_bucket_from_its_own_intervals_exactly(catalog) -> None:
    store = open_reader(catalog)
    with store.session() as session:
        ledger = read_ledger(session, window_of(session, since=T0 - 30, now=T0 + 40))
        batches = session.execute(select(ForwardBatch.size, ForwardBatch.calls)).all()
        pilot = session.execute(select(Pilot.ended, Pilot.released)).one()
    store.close()
    a, b = ledger.servers
    assert (a.name, b.name, b.pilot) == ("a", "b", True)
    assert a.seconds() == pytest.approx(EXPECTED_A, abs=1e-3)
    assert b.seconds() == pytest.approx(EXPECTED_B, abs=1e-3)
    assert (a.life, b.life) == (pytest.approx(38.0), pytest.approx(50.0))
    assert_partition(ledger)
    # GPU-seconds: the pilot's two GPUs count twice.
    assert ledger.totals()[Bucket.LOST] == pytest.approx(22.0)
    assert ledger.by("gpu_model")["a100-sxm4-80gb"][Bucket.ALLOCATED_AFTER] == pytest.approx(56.0)
    # Broken down by rule and context: the lost load is the embed job's.
    assert ledger.by("rule")["embed"] == {Bucket.LOST: pytest.approx(22.0)}
    assert ledger.by("context")["smollm2"][Bucket.IDLE_WARM] == pytest.approx(9.0)
    assert ledger.by("run")["run-1"][Bucket.RUNNING] == pytest.approx(7.0)
    assert sorted(batches) == [(4, 1), (8, 3)]
    assert pilot == (T0 + 40, True)


def test_a_runs_window_clips_what_lies_outside_it(catalog) -> None:
    store = open_reader(catalog)
    with store.session() as session:
        window = window_of(session)  # the latest run
        ledger = read_ledger(session, window)
    store.close()
    assert (window.run, window.start, window.end) == ("run-1", T0, T0 + 40)
    b = ledger.servers[1]
    assert Bucket.ALLOCATED_BEFORE not in b.seconds() and b.life == pytest.approx(40.0)
    assert_partition(ledger)


def test_export_rows_and_columns_as_documented(catalog) -> None:
    store = open_reader(catalog)
    with store.session() as session:
        ledger = read_ledger(session, window_of(session, since=T0 - 30, now=T0 + 40))
    store.close()
    text = export_csv(ledger.rows())
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0].split(",") == list(EXPORT_COLUMNS)
    keys = [(r["server"], r["bucket"], r["rule"], r["context"], r["run"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert {r["bucket"] for r in rows} <= {b.value for b in Bucket}
    lost = [r for r in rows if r["bucket"] == "lost"]
    assert lost == [
        {
            "run": "run-1",
            "server": "b",
            "host": "node1",
            "gpu_model": "a100-sxm4-80gb",
            "gpus": "2",
            "bucket": "lost",
            "rule": "embed",
            "context": "embedder",
            "seconds": "11.0",
            "gpu_seconds": "22.0",
        }
    ]
    assert sum(float(r["gpu_seconds"]) for r in rows) == pytest.approx(38 + 2 * 50)
    data = json.loads(export_json(ledger))
    assert set(data) == {"window", "buckets", "columns", "rows", "lives"}
    assert list(data["buckets"]) == [b.value for b in Bucket]
    assert data["rows"][0].keys() == EXPORT_COLUMNS.keys()


def test_attempts_sharing_a_server_share_its_seconds() -> None:
    """Two slots: two jobs at once count each second once, half to each."""
    life = ServerLife(
        name="s",
        joined=0.0,
        left=10.0,
        work=[Work(1.0, 5.0, "ok", "a"), Work(3.0, 7.0, "ok", "b"), Work(6.0, 9.0, "lost", "c")],
    )
    segments = account(life, 0.0, 10.0)
    seconds = bucket_seconds(segments)
    assert seconds == pytest.approx(
        {Bucket.STARTING: 1.0, Bucket.RUNNING: 5.0, Bucket.LOST: 3.0, Bucket.IDLE_COLD: 1.0}
    )
    by_rule: dict[str, float] = {}
    for s in segments:
        by_rule[s.rule] = by_rule.get(s.rule, 0.0) + s.seconds
    assert by_rule == pytest.approx({"": 2.0, "a": 3.0, "b": 2.0, "c": 3.0})


@pytest.mark.parametrize(
    ("conversions", "from_cache", "expected"),
    [
        (1, False, [(LoadKind.CONVERSION, 7.0), (LoadKind.CACHE, 3.0)]),
        (0, True, [(LoadKind.CACHE, 10.0)]),
        (0, None, [(LoadKind.SOURCE, 10.0)]),
        (0, False, [(LoadKind.SOURCE, 10.0)]),
    ],
)
def test_load_kinds_from_what_the_catalog_records(conversions, from_cache, expected) -> None:
    parts = load_parts(10.0, from_cache=from_cache, conversions=conversions, reload_seconds=3.0)
    assert parts == expected


def test_a_finished_load_is_cut_into_stretches_by_kind() -> None:
    """A load ready after 10 s that fetched its template from a peer for 4 s: 4 s of
    peer, then 6 s from the cache the transfer filled; a conversion, then its reload;
    a plain one, all of one kind (what the catalog and the simulator account)."""
    peer = load_stretches(100.0, 110.0, "m", from_cache=False, peer_seconds=4.0)
    assert peer == [Load(100.0, 104.0, LoadKind.PEER, "m"), Load(104.0, 110.0, LoadKind.CACHE, "m")]
    converted = load_stretches(0.0, 10.0, from_cache=False, conversions=1, reload_seconds=3.0)
    assert [(s.kind, s.end - s.start) for s in converted] == [
        (LoadKind.CONVERSION, 7.0),
        (LoadKind.CACHE, 3.0),
    ]
    assert load_stretches(0.0, 5.0, from_cache=True) == [Load(0.0, 5.0, LoadKind.CACHE)]


def test_the_monitors_live_ledger_matches_the_ledger_poll_by_poll(tmp_path) -> None:
    """The live ledger accounts again only what changed, and moves the others on: after
    each change its sums are the ledger's, read from scratch at the same moment."""
    from snakemake_executor_context.catalog.reading.liveledger import LiveLedger

    path = tmp_path / "catalog.db"
    live = LiveLedger()

    def compare(now: float) -> None:
        store = open_reader(path)
        with store.session() as session:
            sums = live.read(session, now)
            ledger = read_ledger(session, window_of(session, now=now))
        store.close()
        assert sums is not None and sums.window.live
        for mine, theirs in ((sums.by_model, "gpu_model"), (sums.by_context, "context")):
            expected = ledger.by(theirs)
            assert mine.keys() == expected.keys()
            for key, row in expected.items():
                assert mine[key] == pytest.approx(row, abs=1e-6), (theirs, key)

    with CatalogBuilder(path) as b:
        run = b.run("live")
        servers = [b.server(f"gpu{i}", gpu="NVIDIA H200") for i in range(3)]
        model = b.context("smollm2")
        b.tick(2)
        b.load(servers[0], model, seconds=4)
        b.commit()
        compare(b.now + 1)  # gpu0 idle warm, the others starting
        key = b.start_job(run, "score", server=servers[1], context=model)
        b.tick(3)
        b.commit()
        compare(b.now)  # gpu1 running, nothing else touched
        compare(b.now + 5)  # only the clocks move
        b.finish_job(key, seconds=2)
        b.drain(servers[2])
        b.tick(1)
        b.leave(servers[2])
        b.commit()
        compare(b.now + 2)
