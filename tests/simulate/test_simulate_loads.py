"""How the simulator models a load (snakemake_executor_context/simulate/simservers.py,
docs/simulator.md): from the source, a read of the context's bytes over the shared
filesystem, in a turn where the pool limits reads from one source, then the software
start and state creation outside the turn; from a peer, the transfer then the state
creation, without a turn; from the local cache, the state creation, without a turn.
And the simulator's defaults are the plugin's declared ones."""

from __future__ import annotations

import random
from dataclasses import fields, replace
from typing import Any

import pytest

from snakemake_executor_context.defaults import PEER_WAIT_SECONDS
from snakemake_executor_context.dispatch.vocabulary import JobTicket
from snakemake_executor_context.executor.settings import ExecutorSettings, PilotRequest, Tuning
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.fleet.outcome import Outcome
from snakemake_executor_context.fleet.peerchoice import Rates
from snakemake_executor_context.pilots.batch.walltime import read_walltime
from snakemake_executor_context.settings.table import setting_default
from snakemake_executor_context.simulate import simdefaults
from snakemake_executor_context.simulate.clock import Clock
from snakemake_executor_context.simulate.hosting import Serving, Turns
from snakemake_executor_context.simulate.model import (
    ContextModel,
    JobTimes,
    PoolSpec,
    ServerKind,
    Storage,
)
from snakemake_executor_context.simulate.shared import Shared
from snakemake_executor_context.simulate.simservers import SimServer
from tests.conftest import bench_module

paper = bench_module("paper")

#: 4 GB read at 1 GB/s from the source (4 s alone), 0.5 GB/s from a peer (8 s).
NBYTES = 4_000_000_000
READ = 4.0
PEER = 8.0
#: Beyond the bytes: software start and state creation (source), state creation
#: (cache, peer).
SOURCE_REST = 8.0
CACHE_REST = 2.0


class _Host:
    """What a server needs of its simulation, and nothing else: one context, a
    shared filesystem of 1 GB/s, turns at the source of ``limit``."""

    def __init__(self, limit: int, *, peers: tuple[str, ...] = (), transfers: int = 2) -> None:
        self.clock = Clock()
        self.times = JobTimes(item={("infer", "a10"): 1.0})
        self.storage = Storage(
            shared_bandwidth=1e9, peer_bandwidth=0.5e9, peer=True, peer_transfers=transfers
        )
        self.mode = "full"
        self.rng = random.Random(1)
        self.turns = Turns(limit)
        self.filesystem = Shared(self.clock, lambda n: self.storage.shared_bandwidth)
        self.run_id = "test"
        self.model = ContextModel(
            "m",
            "m-id",
            NBYTES,
            {LoadKind.SOURCE: SOURCE_REST, LoadKind.CACHE: CACHE_REST},
        )
        #: Servers that find the holders (by address), the holders, what the fleet
        #: measured, and each server's ContextReady.
        self.peers = set(peers)
        self.holding: list[SimServer] = []
        self.measured = Rates()
        self.ready: dict[str, ev.ContextReady] = {}

    def context(self, identity: str) -> ContextModel:
        return self.model

    def emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.ContextReady):
            self.ready[event.address] = event

    def ended(self, key: str, outcome: Outcome) -> None:
        pass

    def holders(self, identity: str, address: str) -> list[Serving]:
        if address not in self.peers:
            return []
        return [s.serving for s in self.holding if s.address != address]

    def rates(self, identity: str, gpu_model: str) -> Rates:
        return self.measured

    def note(self, what: str, detail: str) -> None:
        pass


def _ticket(n: int) -> JobTicket:
    return JobTicket(
        key=f"infer-{n}",
        label="rule 'infer'",
        title=f"Rule 'infer' ({n})",
        rule="infer",
        jobid=str(n),
        kind="context",
        identity="m-id",
        context="m",
    )


def _server(host: _Host, name: str) -> SimServer:
    return SimServer(host, f"sim://{name}", name, ServerKind("a10", 1), 0.0)


def _arrive(host: _Host, server: SimServer, at: float, n: int) -> None:
    host.clock.at(at, server.arrive, _ticket(n), f"infer-{n}-1", 1)


def _run(host: _Host, servers: list[SimServer]) -> dict[str, tuple[float, float, LoadKind]]:
    host.clock.run(lambda: False)
    return {
        server.name: (load.start, load.end, load.kind)
        for server in servers
        for load in server.loads
    }


def test_a_turn_at_the_source_covers_the_read_alone() -> None:
    """Two servers load from the source at once under a limit of 1: the second's read
    starts when the first's read ends (4 s), not when its whole load ends (12 s), and
    the first's read is not shared with the second's (it ends at 4 s, not 8 s)."""
    host = _Host(limit=1)
    a, b = _server(host, "a"), _server(host, "b")
    _arrive(host, a, 0.0, 1)
    _arrive(host, b, 0.0, 2)
    loads = _run(host, [a, b])
    assert loads["a"] == pytest.approx((0.0, READ + SOURCE_REST, LoadKind.SOURCE))
    # b waited for a's read, then read alone; its rest overlapped a's.
    assert loads["b"] == pytest.approx((0.0, 2 * READ + SOURCE_REST, LoadKind.SOURCE))
    # Without a limit the two reads share the filesystem: both end at 8 s.
    host = _Host(limit=0)
    a, b = _server(host, "a"), _server(host, "b")
    _arrive(host, a, 0.0, 1)
    _arrive(host, b, 0.0, 2)
    loads = _run(host, [a, b])
    assert loads["a"][1] == pytest.approx(2 * READ + SOURCE_REST)
    assert loads["b"][1] == pytest.approx(2 * READ + SOURCE_REST)


def test_loads_from_a_peer_or_the_cache_take_no_turn() -> None:
    """While the source's only turn is held (a reads, b waits), servers that load
    from a peer or from their local cache start at once."""
    host = _Host(limit=1, peers=("sim://p", "sim://q"))
    a, b = _server(host, "a"), _server(host, "b")
    p, q, c = _server(host, "p"), _server(host, "q"), _server(host, "c")
    c.disk.add("m-id")
    host.holding.append(_holder(host))
    for n, server in enumerate((a, b)):
        _arrive(host, server, 0.0, n)
    for n, server in enumerate((p, q, c), start=2):
        _arrive(host, server, 1.0, n)
    loads = _run(host, [a, b, p, q, c])
    assert loads["b"][1] == pytest.approx(2 * READ + SOURCE_REST)
    for name in ("p", "q"):  # each its own transfer over the network, no wait
        assert loads[name] == pytest.approx((1.0, 1.0 + PEER + CACHE_REST, LoadKind.PEER))
    assert loads["c"] == pytest.approx((1.0, 1.0 + CACHE_REST, LoadKind.CACHE))
    assert host.ready["sim://p"].at == pytest.approx(1.0 + PEER + CACHE_REST)
    assert host.ready["sim://p"].peer_seconds == pytest.approx(PEER)


def _holder(host: _Host) -> SimServer:
    """A server whose disk holds the context's template."""
    holder = _server(host, "h")
    holder.disk.add("m-id")
    return holder


def test_a_busy_holder_is_waited_for_while_a_peer_is_still_faster() -> None:
    """A holder serving its one transfer: the second receiver waits for it to end
    (nothing measured says the source is faster), then fetches; the wait is its
    fetch's, as a real receiver's peer_seconds count it."""
    host = _Host(limit=1, peers=("sim://p", "sim://q"), transfers=1)
    holder = _holder(host)
    host.holding.append(holder)
    p, q = _server(host, "p"), _server(host, "q")
    _arrive(host, p, 1.0, 1)
    _arrive(host, q, 1.0, 2)
    loads = _run(host, [p, q])
    assert loads["p"] == pytest.approx((1.0, 1.0 + PEER + CACHE_REST, LoadKind.PEER))
    assert loads["q"] == pytest.approx((1.0, 1.0 + 2 * PEER + CACHE_REST, LoadKind.PEER))
    assert host.ready["sim://q"].peer_seconds == pytest.approx(2 * PEER)
    assert not holder.serving.sessions


def test_the_source_when_it_is_measured_faster_than_a_busy_holder() -> None:
    """The fleet measured loads from the source at 12 s: a free holder (8 s of
    transfer, 2 s from the cache) is faster, a busy one (8 s more) is not, so the
    second receiver reads the source (fleet.peerchoice.choose_origin decides)."""
    host = _Host(limit=1, peers=("sim://p", "sim://q"), transfers=1)
    host.measured = Rates(source_seconds=12.0, cache_seconds=CACHE_REST, peer_rate=0.5e9)
    host.holding.append(_holder(host))
    p, q = _server(host, "p"), _server(host, "q")
    _arrive(host, p, 1.0, 1)
    _arrive(host, q, 1.0, 2)
    loads = _run(host, [p, q])
    assert loads["p"] == pytest.approx((1.0, 1.0 + PEER + CACHE_REST, LoadKind.PEER))
    assert loads["q"] == pytest.approx((1.0, 1.0 + READ + SOURCE_REST, LoadKind.SOURCE))
    assert host.ready["sim://q"].peer_seconds is None


def test_a_receiver_waits_for_busy_holders_no_longer_than_a_real_one() -> None:
    """Holders busy past the real receiver's wait (PEER_WAIT_SECONDS): it reads the
    source when the wait is over."""
    host = _Host(limit=1, peers=("sim://p", "sim://q"), transfers=1)
    host.storage = replace(host.storage, peer_bandwidth=NBYTES / (2 * PEER_WAIT_SECONDS))
    host.holding.append(_holder(host))
    p, q = _server(host, "p"), _server(host, "q")
    _arrive(host, p, 1.0, 1)
    _arrive(host, q, 1.0, 2)
    loads = _run(host, [p, q])
    given_up = 1.0 + PEER_WAIT_SECONDS
    assert loads["q"] == pytest.approx((1.0, given_up + READ + SOURCE_REST, LoadKind.SOURCE))


def test_a_server_gone_gives_its_turn_back_once() -> None:
    """A server that leaves while it reads gives its turn to the next at once; one
    that leaves after its read (in its state creation) holds none, so the turn count
    stays right: the next reader still waits for the one reading."""
    host = _Host(limit=1)
    a, b, c, d = (_server(host, name) for name in "abcd")
    _arrive(host, a, 0.0, 1)
    _arrive(host, b, 0.0, 2)
    host.clock.at(1.0, a.leave, 1.0)  # in its read: b reads from 1 s
    host.clock.at(6.0, b.leave, 6.0)  # in its rest (read 1-5 s): no turn to give back
    _arrive(host, c, 5.5, 3)  # reads from 5.5 s, alone: ends at 9.5 s
    _arrive(host, d, 6.5, 4)  # waits for c's read (a double release would not)
    loads = _run(host, [a, b, c, d])
    assert loads["a"][1] == pytest.approx(1.0) and loads["b"][1] == pytest.approx(6.0)
    assert loads["c"][1] == pytest.approx(5.5 + READ + SOURCE_REST)
    assert loads["d"] == pytest.approx((6.5, 5.5 + 2 * READ + SOURCE_REST, LoadKind.SOURCE))


def test_a_read_not_modelled_holds_no_turn() -> None:
    """Without the filesystem's bandwidth the read takes no time, so no load waits:
    a load costs its stated seconds, limit or not."""
    host = _Host(limit=1)
    host.storage = Storage()
    a, b = _server(host, "a"), _server(host, "b")
    _arrive(host, a, 0.0, 1)
    _arrive(host, b, 0.0, 2)
    loads = _run(host, [a, b])
    assert loads["a"][1] == pytest.approx(SOURCE_REST)
    assert loads["b"][1] == pytest.approx(SOURCE_REST)


def test_the_simulators_defaults_are_the_plugins() -> None:
    """Read from the executor's settings, as a user gets them: RQ4's first pool and
    a pool spec's limit are the plugin's."""
    every = (*fields(ExecutorSettings), *fields(PilotRequest), *fields(Tuning))
    declared: dict[str, Any] = {f.name: f.default for f in every}
    limit, transfers = declared["pilot_loads_per_source"], declared["peer_transfers"]
    assert (limit, transfers) == (simdefaults.LOADS_PER_SOURCE, simdefaults.PEER_TRANSFERS)
    assert PoolSpec().loads_per_source == limit
    spec, walltime = PoolSpec(), read_walltime("slurm", declared["pilot_walltime"]).seconds
    assert (spec.minimum, spec.maximum, spec.idle_timeout, spec.retire_margin) == (
        declared["min_pilots"],
        declared["max_pilots"],
        declared["pilot_idle_timeout"],
        declared["pilot_retire_margin"],
    )
    assert spec.walltime == walltime and ServerKind("a10", 1).slots == declared["slots"]
    assert Storage().peer_transfers == transfers
    assert paper.RQ4_POOLS[0] == ("pool_defaults", limit, transfers > 0)
    with pytest.raises(LookupError):
        setting_default("no_such_setting")


def test_a_pool_that_reads_one_at_a_time_keeps_up_with_one_without_a_limit() -> None:
    """The paper's workload on a growing pool of 12 (small): with the turn around the
    read alone (0.35 s of 3.7 GB), one read at a time costs next to nothing; were it
    held for the whole load (30 s here), the pilots would queue for it."""
    params = paper.Params(claim_seconds=0.05, init_seconds=10.0, source_seconds=20.0)
    made = {}
    for limit in (0, 1):
        fleet, slow = paper.mixed_fleet(
            12, pool=PoolSpec(queue_wait=5.0, queue_draw="fixed", loads_per_source=limit)
        )
        made[limit] = paper.run(replace(params, slowdowns=slow), "full", fleet, claims=4000)
        assert made[limit].jobs == 40 and made[limit].loads == {"source": 12}
    assert made[1].makespan <= made[0].makespan + 1.0
