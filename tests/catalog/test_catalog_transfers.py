"""Peer-to-peer transfer in the catalog: each try recorded (its receiver, holder,
bytes, seconds and outcome), a load's seconds from peers in the ledger's peer bucket,
and `status` saying how each context's placements got it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from snakemake_executor_context.catalog.models import EventRecord, Placement, Server, Transfer
from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.reading.ledger import read_ledger, window_of
from snakemake_executor_context.catalog.reading.overview import format_overview
from snakemake_executor_context.catalog.store import open_reader, open_store
from snakemake_executor_context.catalog.writing.writer import CatalogWriter
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.buckets import Bucket
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.simulate.measured import read_run
from tests.catalog.test_catalog import _cli
from tests.catalog_builder import CatalogBuilder

MODEL = "s" * 64
HOLDER, RECEIVER, STRANGER = "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4002", "tcp://10.9.9.9:1"


def _written(path, events: list[ev.Event]) -> None:
    """Record events through the writer a run uses (its thread, its transactions)."""
    warnings: list[str] = []
    catalog = CatalogWriter(open_store(path), warn=warnings.append)
    for event in events:
        assert catalog.submit(event)
    assert catalog.flush(30)
    catalog.close(timeout=30)
    assert not warnings


def test_each_transfer_try_is_a_row_and_a_note(tmp_path):
    """Three tries of one receiver: from a known holder (its server row found), from an
    address no server of the catalog has (kept as the address), and none at all."""
    path = tmp_path / "c.db"
    t = 1_700_000_000.0
    _written(
        path,
        [
            ev.ServerJoined(at=t, address=HOLDER, name="server-1"),
            ev.ServerJoined(at=t, address=RECEIVER, name="server-2"),
            ev.ContextLoading(at=t + 1, address=RECEIVER, identity=MODEL, name="smollm2"),
            ev.ContextTransferred(
                at=t + 3,
                address=RECEIVER,
                identity=MODEL,
                peer=HOLDER,
                bytes=538_000_000,
                seconds=2.1,
            ),
            ev.ContextTransferred(
                at=t + 4,
                address=RECEIVER,
                identity=MODEL,
                peer=STRANGER,
                bytes=12_000_000,
                seconds=0.4,
                outcome="connection reset by peer",
            ),
            ev.ContextTransferred(
                at=t + 5, address=RECEIVER, identity=MODEL, outcome="no holder answered"
            ),
        ],
    )
    reader = open_reader(path)
    with reader.session() as session:
        ids = dict(session.execute(select(Server.name, Server.id)).tuples().all())
        rows = session.scalars(select(Transfer).order_by(Transfer.id)).all()
        got = [
            (r.server_id, r.peer, r.peer_server_id, r.at, r.bytes, r.seconds, r.outcome)
            for r in rows
        ]
        notes = session.scalars(
            select(EventRecord.text).where(EventRecord.kind == "context-transferred")
        ).all()
        servers = session.scalar(select(Server.id).where(Server.address == STRANGER))
    reader.close()
    receiver, holder = ids["server-2"], ids["server-1"]
    assert got == [
        (receiver, HOLDER, holder, t + 3, 538_000_000, 2.1, "ok"),
        (receiver, STRANGER, None, t + 4, 12_000_000, 0.4, "connection reset by peer"),
        (receiver, "", None, t + 5, 0, 0.0, "no holder answered"),
    ]
    assert servers is None, "a holder's address never makes a server row"
    assert notes == [
        "smollm2 fetched from server-1 by server-2: 538 MB in 2.1 s",
        f"smollm2 from {STRANGER} to server-2 ended early (12.0 MB in 0.4 s): "
        "connection reset by peer",
        "smollm2: no peer could serve server-2: no holder answered",
    ]


def _peer_catalog(path) -> tuple[str, float]:
    """server-1 loads smollm2 from the source (10 s); server-2 fetches it from
    server-1 (3 s, after a try that failed) and reads the cache it filled (2 s more)."""
    with CatalogBuilder(path) as b:
        run = b.run("run-1")
        one = b.server("server-1")
        two = b.server("server-2")
        model = b.context("smollm2")
        b.load(one, model, seconds=10.0, nbytes=538_000_000)
        b.emit(ev.ContextLoading(at=b.now, address=two, identity=model, name="smollm2"))
        start = b.now
        b.transfer(two, model, "tcp://10.9.9.9:1", seconds=1.0, nbytes=0, outcome="refused")
        b.transfer(two, model, one, seconds=2.0, nbytes=538_000_000)
        b.tick(2.0)
        b.emit(
            ev.ContextReady(
                at=b.now,
                address=two,
                identity=model,
                load_seconds=b.now - start,
                bytes=538_000_000,
                peer_seconds=3.0,
            )
        )
        b.tick(1.0)
        b.finish_run(run)
    return model, start


def test_a_peer_load_is_in_the_ledgers_peer_bucket_and_the_rest_from_the_cache(tmp_path):
    path = tmp_path / "c.db"
    _peer_catalog(path)
    reader = open_reader(path)
    with reader.session() as session:
        (peer_seconds,) = session.scalars(
            select(Placement.peer_seconds).where(Placement.peer_seconds.is_not(None))
        ).all()
        ledger = read_ledger(session, window_of(session, run="run-1"))
    reader.close()
    assert peer_seconds == 3.0
    by_server = {s.name: s.seconds() for s in ledger.servers}
    assert by_server["server-2"][Bucket.LOADING_PEER] == pytest.approx(3.0, abs=1e-3)
    assert by_server["server-2"][Bucket.LOADING_CACHE] == pytest.approx(2.0, abs=1e-3)
    assert Bucket.LOADING_SOURCE not in by_server["server-2"]
    assert by_server["server-1"][Bucket.LOADING_SOURCE] == pytest.approx(10.0, abs=1e-3)
    assert Bucket.LOADING_PEER not in by_server["server-1"]
    # The simulator's replay classifies the same load the same way.
    kinds = {(load.server, load.kind) for load in read_run(str(path), "run-1").loads}
    assert kinds == {("server-1", LoadKind.SOURCE), ("server-2", LoadKind.PEER)}


def test_status_says_how_each_context_was_got_and_its_transfers(tmp_path):
    path = tmp_path / "c.db"
    model, _ = _peer_catalog(path)
    reader = open_reader(path)
    with reader.session() as session:
        report = queries.overview(session)
    reader.close()
    (context,) = report["contexts"]
    assert context["kinds"] == {"source": 1, "peer": 1}
    (fetched,) = report["transfers"]
    assert (fetched["identity"], fetched["transfers"], fetched["failed"]) == (model, 2, 1)
    assert (fetched["bytes"], fetched["seconds"]) == (538_000_000, 3.0)
    assert report["counts"]["transfers"] == 2
    text = format_overview(str(path), report)
    line = "    loads: 1 from the source, 1 from peers; transfers: 2 from peers, 538 MB in 3.0 s, "
    assert line + "1 ended early" in text.splitlines()
    # The command itself, in text and JSON.
    args = ("status", "--scheduler-file", str(tmp_path / "none.json"), "--catalog", str(path))
    shown = _cli(*args)
    assert shown.returncode == 0, shown.stderr
    assert "1 from peers; transfers: 2 from peers" in shown.stdout
    assert json.loads(_cli(*args, "--json").stdout)["transfers"][0]["failed"] == 1


def test_load_kinds_agree_with_the_ledgers_split():
    """A placement's kind is its load's first part: peer before cache, conversion
    first, otherwise by the cache probe."""
    assert queries.load_kind(True, 0, 1.5) == LoadKind.PEER
    assert queries.load_kind(None, None, 0.0) == LoadKind.PEER
    assert queries.load_kind(False, 2, None) == LoadKind.CONVERSION
    assert queries.load_kind(True, None, None) == LoadKind.CACHE
    assert queries.load_kind(False, 0, None) == LoadKind.SOURCE


def test_the_monitor_shows_where_each_placement_got_its_context(tmp_path):
    """The monitor's contexts agree with `status` (loads by kind), and its Contexts
    view's "from" column names the peer load."""
    from snakemake_context_monitor import CatalogSource
    from snakemake_context_monitor.model import Memo
    from snakemake_context_monitor.views import contexts as view

    path = tmp_path / "c.db"
    _peer_catalog(path)
    source = CatalogSource(path)
    snapshot = source.fetch()
    source.close()
    reader = open_reader(path)
    with reader.session() as session:
        assert snapshot.contexts == queries.contexts(session)
    reader.close()
    assert snapshot.contexts[0].kinds == {"source": 1, "peer": 1}
    assert {p.server: p.kind for p in snapshot.placements} == {
        "server-1": "source",
        "server-2": "peer",
    }
    page = view.page(snapshot, Memo())
    column = [key for key, _, _ in view.COLUMNS].index("from")
    shown = {cells[1]: cells[column] for cells in page.tables["contexts-table"].values()}
    assert shown == {"server-1": "source", "server-2": "peer"}
    assert "1 from peers" in page.texts["contexts-summary"]
