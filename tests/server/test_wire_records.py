"""Records that cross a process boundary: each is written with its own ``to_wire`` and
read back with its own ``from_wire``, through msgpack as Dask's RPC carries it, and a
reply that is not the record is refused in one way, not read as half a record."""

from __future__ import annotations

import msgpack
import pytest

from snakemake_executor_context.fleet.peerchoice import Rates
from snakemake_executor_context.server.peers.wire import Chunk, MalformedReply, TemplateOffer


def _through_msgpack(wire: object) -> object:
    return msgpack.unpackb(msgpack.packb(wire))


def test_a_holders_offer_arrives_whole() -> None:
    offer = TemplateOffer(held=True, spare=0, nbytes=123, wait=4.5, token="t", manifest="{}")
    assert TemplateOffer.from_wire(_through_msgpack(offer.to_wire())) == offer
    refused = TemplateOffer(held=False, why="not in this server's cache")
    assert TemplateOffer.from_wire(_through_msgpack(refused.to_wire())) == refused


@pytest.mark.parametrize(
    "reply",
    [None, OSError("connection closed"), {"spare": 1}, {"held": True, "spare": "many"}],
)
def test_a_reply_that_is_not_an_offer_is_malformed(reply: object) -> None:
    """An exception the call returned, an answer without ``held``, or a field of the
    wrong type: the receiver tries another holder or the source."""
    with pytest.raises(MalformedReply):
        TemplateOffer.from_wire(reply)


def test_a_chunk_is_its_bytes_or_its_error() -> None:
    assert Chunk.from_wire({"data": b"abc"}) == Chunk(data=b"abc")
    assert Chunk.from_wire(_through_msgpack(Chunk(error="gone").to_wire())) == Chunk(error="gone")
    with pytest.raises(MalformedReply):
        Chunk.from_wire({"data": "text, not bytes"})


def test_the_hubs_rates_arrive_with_their_unknowns() -> None:
    rates = Rates(source_seconds=20.0, cache_seconds=None, peer_rate=1e8)
    assert Rates.from_wire(_through_msgpack(rates.to_wire())) == rates
    assert Rates.from_wire(None) == Rates()  # a hub that could not say: nothing measured


def test_the_cluster_processs_record_reads_back_whole(tmp_path) -> None:
    """The record the cluster process writes beside its scheduler file (JSON, 0600)
    reads back as the same record, its planned servers' GPUs included; a file that is
    not one reads as no cluster."""
    import json
    import os
    from dataclasses import replace

    from snakemake_executor_context.cluster.info import ClusterInfo, PlannedServer
    from snakemake_executor_context.cluster.infofiles import ClusterFiles
    from snakemake_executor_context.fleet.gpus import GpuInfo

    gpu = GpuInfo(index=0, uuid="GPU-1", name="NVIDIA H200", memory_bytes=141 * 10**9)
    info = ClusterInfo(
        pid=os.getpid(),
        address="tls://127.0.0.1:8786",
        servers=(PlannedServer("gpu0", gpu, 1, {"gpu": 1.0}), PlannedServer("cpu1")),
        started=1.5,
        steps={"scheduler and servers": 2.5},
        catalog="/tmp/c.db",
        pilots={"backend": "slurm"},
        slots=4,
    )
    files = ClusterFiles(tmp_path / "scheduler.json")
    files.write_info(info)
    read = files.read_info()
    assert read is not None and read.start_ticks is not None  # its identity was added
    assert replace(read, start_ticks=None, cmdline=()) == info
    files.pid_file.write_text(json.dumps({"address": "no pid"}))
    assert files.read_info() is None


def test_a_servers_inventory_reads_back_whole_and_keeps_its_summary_keys() -> None:
    """What a server answers `status` and a run's summary: the same record back, its
    counts at the top level of the wire form (the summary's `loads`, `evictions`)."""
    from snakemake_executor_context.fleet.gpus import GpuInfo
    from snakemake_executor_context.fleet.outcome import ServerIdentity
    from snakemake_executor_context.server.inventory import (
        HeldContext,
        ServerInventory,
        ServerStats,
        SlotState,
    )

    inventory = ServerInventory(
        server=ServerIdentity("server-0", "node1", 1234, "tls://10.0.0.1:40000"),
        gpu=GpuInfo(index=0, uuid="GPU-1", name="NVIDIA H200", memory_bytes=141 * 10**9),
        memory_bytes=64 * 10**9,
        memory_budget=50 * 10**9,
        bytes_loaded=10**9,
        contexts=(HeldContext("abc", ("llm",), "loader.py:load", 10**9, 2.5, 7, 1),),
        running=("noop-1-a1-x.0",),
        slots=SlotState(2, ("noop-1-a1-x.0",), (), {"abc": 2}, {"abc": 10**8}),
        counts=ServerStats(loads=1, jobs=8, evictions=0, evicted=[]),
    )
    wire = _through_msgpack(inventory.to_wire())
    assert isinstance(wire, dict) and (wire["loads"], wire["jobs"]) == (1, 8)
    assert ServerInventory.from_wire(wire) == inventory
