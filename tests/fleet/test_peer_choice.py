"""Peer or source, chosen by measured rates: the pure decision
(:func:`~snakemake_executor_context.fleet.peerchoice.choose_origin`), the measurements
it is given (the fleet's, from events), a holder's estimate of when a busy transfer
ends, and on a real cluster a receiver that reads a fast source rather than wait for
the only, busy, holder.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
from pathlib import Path

import cloudpickle
import pytest

from snakemake_executor_context.contexts import make_declaration
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.fleet.measure import Measurements
from snakemake_executor_context.fleet.peerchoice import Holder, Rates, choose_origin
from snakemake_executor_context.fleet.state import FleetState
from snakemake_executor_context.server.peers.holder import TransferSessions
from tests.conftest import WORKFLOWS, persistent_cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 1_000_000


# ----------------------------------------------------------------------------------
# The decision.


def test_a_fast_source_beats_a_busy_peer_and_a_slow_one_does_not():
    rates = Rates(source_seconds=2.0, cache_seconds=1.0, peer_rate=100 * MB)
    busy = [Holder("tls://h", spare=0, wait=30.0)]
    choice = choose_origin(rates, 500 * MB, busy)
    assert choice.origin is LoadKind.SOURCE and choice.peer_seconds == pytest.approx(36.0)
    assert "busy for 30.0 s" in choice.why and "the source is faster" in choice.why
    # The same busy holder, against a source that took a minute: wait for it.
    slow = choose_origin(Rates(60.0, 1.0, 100 * MB), 500 * MB, busy)
    assert slow.origin is LoadKind.PEER and slow.wait and slow.free == ()


def test_a_free_holder_loses_to_a_source_faster_than_the_transfer():
    rates = Rates(source_seconds=3.0, cache_seconds=1.0, peer_rate=50 * MB)
    free = [Holder("tls://b", spare=1), Holder("tls://a", spare=2), Holder("tls://c", spare=0)]
    assert choose_origin(rates, 500 * MB, free).origin is LoadKind.SOURCE  # 11 s > 3 s
    fast = choose_origin(rates, 50 * MB, free)  # 1 s + 1 s < 3 s
    assert fast.origin is LoadKind.PEER and not fast.wait
    assert fast.free == ("tls://a", "tls://b")  # most to spare first; the busy one not


def test_what_is_not_measured_counts_as_nothing():
    busy = [Holder("tls://h", spare=0, wait=None)]
    # The source's loads never measured: a peer (the default), waiting for a busy one.
    assert choose_origin(Rates(), 500 * MB, busy).origin is LoadKind.PEER
    # No transfer measured, no wait known: the peer's known part (the cache load)
    # against the source.
    assert choose_origin(Rates(5.0, 1.0, None), 500 * MB, busy).origin is LoadKind.PEER
    assert choose_origin(Rates(0.5, 1.0, None), 500 * MB, busy).origin is LoadKind.SOURCE
    # A known wait alone can exceed the source.
    waits = [Holder("tls://h", 0, 20.0), Holder("tls://g", 0, 8.0)]
    choice = choose_origin(Rates(5.0, None, None), 500 * MB, waits)
    assert choice.origin is LoadKind.SOURCE and choice.peer_seconds == 8.0  # the soonest
    assert choose_origin(Rates(5.0), 1, []).origin is LoadKind.SOURCE  # nobody holds it


# ----------------------------------------------------------------------------------
# The measurements it is given: the fleet's view, from events.


def test_the_fleet_measures_source_cache_and_transfer_rates_from_events():
    state = FleetState()
    state.apply(ev.ServerJoined(address="tls://a", name="a"))
    ctx = {"address": "tls://a", "identity": "ctx", "gpu_model": "cpu"}
    other = {**ctx, "identity": "other"}
    state.apply(ev.ContextReady(**ctx, load_seconds=40.0, conversions=1, reload_seconds=4.0))
    state.apply(ev.ContextReady(**ctx, load_seconds=9.0, peer_seconds=5.0))
    state.apply(ev.ContextReady(**other, load_seconds=7.0, from_cache=False))
    state.apply(ev.ContextReady(**other, load_seconds=2.0, from_cache=True))
    parts = [(500 * MB, 5.0, "ok"), (100 * MB, 1.0, "refused"), (0, 0.0, "ok")]
    for nbytes, seconds, outcome in parts:
        state.apply(
            ev.ContextTransferred(
                address="tls://b", identity="ctx", bytes=nbytes, seconds=seconds, outcome=outcome
            )
        )
    rates = state.measure.rates("ctx", "cpu")
    # A converting context's source is its conversion; the cache is what the loads
    # took after converting or fetching; only the whole transfer gives a rate.
    assert rates == Rates(source_seconds=40.0, cache_seconds=4.0, peer_rate=100 * MB)
    elsewhere = state.measure.rates("other", "a100")  # another model: the mean of any
    assert elsewhere == Rates(source_seconds=7.0, cache_seconds=2.0, peer_rate=100 * MB)
    copy = Measurements()
    copy.merge_wire(state.measure.to_wire())  # a snapshot keeps them
    assert copy.rates("ctx", "cpu") == rates


def test_a_holder_says_when_its_first_transfer_ends():
    sessions = TransferSessions(limit=2)
    assert sessions.wait(now=0) is None  # none open
    first = sessions.begin("c", Path("/x"), {"a": 60 * MB, "b": 40 * MB}, now=0)
    second = sessions.begin("c", Path("/x"), {"a": 30 * MB}, now=5)
    assert first and second and sessions.wait(now=5) is None  # nothing sent yet
    sessions.open[first].sent = 40 * MB  # 40 MB in 10 s: 60 MB left take 15 s more
    assert sessions.wait(now=10) == pytest.approx(15.0)
    # Paced at 10 MB/s: what is sent but not yet paid for, then the rest at the pace.
    sessions.open[second].sent, sessions.open[second].paced_until = 20 * MB, 12.0
    assert sessions.wait(now=10, rate=10 * MB) == pytest.approx(2.0 + 1.0)


# ----------------------------------------------------------------------------------
# On a real cluster.


async def _acquire(declaration, dask_worker=None) -> None:
    """Load the context as a job would, on this server (the fleet measures it)."""
    from snakemake_executor_context.server.server import ContextServer

    cache = ContextServer.current().cache
    await asyncio.to_thread(cache.acquire, declaration)
    cache.release(declaration.identity)


async def _sessions(dask_worker=None) -> list[int]:
    """Bytes sent so far by each transfer this holder serves."""
    holder = dask_worker.handlers["snakemake_context_template"].__self__
    return [session.sent for session in holder.sessions.open.values()]


def _measured(declaration, dask_scheduler=None) -> dict:
    from snakemake_executor_context.defaults import HUB_PLUGIN_NAME

    return dask_scheduler.plugins[HUB_PLUGIN_NAME].rates(declaration.identity, "")


@pytest.mark.slow
def test_a_receiver_reads_a_fast_source_rather_than_wait_for_the_only_busy_holder(tmp_path):
    """One holder serving one transfer at a time at 2 MB/s (16 MB: 8 s); the source
    writes the same files in well under a second, as the fleet measured when the
    holder loaded it. A second receiver asks while the first transfer runs: it reads
    the source at once, tries no transfer; the first receiver's transfer goes on."""
    from distributed import Client

    from snakemake_executor_context.cluster.credentials import Credentials
    from tests.server.test_peers import _fetch_here, _load_here, _tree_digest

    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "peers", workdir)
    log = workdir / "source.log"
    arguments = {"seed": 7, "megabytes": 16, "source_log": str(log), "source_seconds": 0.0}
    declaration = make_declaration("files", "loaders.py:load", arguments, workdir)
    caches = tmp_path / "caches"
    up = ["--servers", "3", "--own-caches", str(caches), "--peer-transfers", "1"]
    with persistent_cluster(tmp_path / "cluster", *up, "--peer-mbps", "2") as path:
        security = Credentials.beside(path).security()
        with Client(scheduler_file=str(path), security=security, timeout=30) as client:
            client.wait_for_workers(3, timeout=60)
            names = {i["name"]: a for a, i in client.scheduler_info()["workers"].items()}
            holder, first, second = (names[n] for n in sorted(names))
            client.run(_acquire, declaration, workers=[holder])
            while client.run_on_scheduler(_measured, declaration)["source_seconds"] is None:
                threading.Event().wait(0.1)  # the holder's load reaches the hub
            fetched: dict = {}
            receiver = threading.Thread(
                target=lambda: fetched.update(client.run(_fetch_here, declaration, workers=[first]))
            )
            receiver.start()
            while not any(client.run(_sessions, workers=[holder])[holder]):
                threading.Event().wait(0.1)  # the transfer has begun
            decided = client.run(_fetch_here, declaration, workers=[second])[second]
            busy = client.run(_sessions, workers=[holder])[holder]
            client.run(_load_here, declaration, workers=[second])
            receiver.join()
    assert busy, "the holder's transfer ended before the second receiver decided"
    assert decided["seconds"] is None and decided["events"] == [], decided
    assert "the source is faster. Loading it from its source." in decided["said"][-1], decided
    assert len(log.read_text().splitlines()) == 2  # the holder's load and the second's
    assert fetched[first]["seconds"] is not None and fetched[first]["events"][-1][2] == "ok"
    entries = [caches / name / "peers-7-16" for name in sorted(names)]
    assert len({_tree_digest(entry) for entry in entries}) == 1
