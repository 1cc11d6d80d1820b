"""A node-local model cache's size limit (``--context-model-cache-size``): before a
template enters, the least recently used ones no process of the node uses are removed
to make room, with their recorded manifests; one a server holds loaded or a reader
has open is kept. On real template directories: a cache of our own in this process
(the users are other processes), and a persistent cluster whose two servers share one
cache, with a run of the real command line on it afterwards.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from snakemake_executor_context import modelcache
from snakemake_executor_context.contexts import make_declaration
from snakemake_executor_context.modelcache.cacheroom import MODEL_CACHE_SIZE_VARIABLE
from tests.conftest import context_run, persistent_cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 1 << 20
#: What an entry of the test workflow of ``megabytes=4`` holds (its files, rounded up).
ENTRY = 4 * MB + 12345 + 100


@pytest.fixture
def private(tmp_path, monkeypatch) -> Path:
    """A private root and a model cache of this test's own (locks, manifests)."""
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / "local"))
    cache = tmp_path / "models"
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(cache))
    return cache


def _convert(cache: Path, name: str, megabytes: int) -> Path:
    entry = cache / name

    def write(into: Path) -> None:
        (into / "weights").mkdir()
        (into / "weights" / "w.bin").write_bytes(random.Random(name).randbytes(megabytes * MB))

    assert modelcache.convert_once(entry, write)
    return entry


def _hold_in_another_process(entry: Path) -> subprocess.Popen:
    """A reader in its own process with the entry open (until its stdin closes)."""
    code = (
        "import sys; from pathlib import Path; from snakemake_executor_context import modelcache\n"
        f"with modelcache.open_entry(Path({str(entry)!r})):\n"
        "    print('open', flush=True); sys.stdin.read()\n"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout.readline().strip() == "open"
    return reader


def test_the_least_recently_used_entry_nobody_uses_makes_room(private, monkeypatch):
    monkeypatch.setenv(MODEL_CACHE_SIZE_VARIABLE, str(10 * MB))
    held, old, recent = (_convert(private, n, 3) for n in ("held", "old", "recent"))
    # Last used, oldest first: "held" (open in another process from now on), "old",
    # "recent".
    reader = _hold_in_another_process(held)
    for entry in (old, recent):
        time.sleep(0.01)  # distinct times of last use on coarse clocks
        with modelcache.open_entry(entry):
            pass
    try:
        assert modelcache.manifest_path(old).exists()
        time.sleep(0.01)
        new = _convert(private, "new", 3)  # 9 MB there + 3 MB > 10 MB: one must go
        assert not old.exists() and not modelcache.manifest_path(old).exists()
        assert held.exists() and recent.exists() and new.exists()
    finally:
        reader.stdin.close()
        reader.wait()
    assert not [p for p in private.iterdir() if p.name.startswith(".")]  # nothing left aside
    # Its reader gone, "held" was used until just now: "recent" is the one to go next.
    _convert(private, "newer", 3)
    assert not recent.exists() and held.exists() and new.exists()
    with modelcache.open_entry(held) as path:  # what stays is whole, and checked
        assert (Path(path) / "weights" / "w.bin").stat().st_size == 3 * MB


def test_without_a_limit_nothing_is_removed(private, monkeypatch):
    monkeypatch.delenv(MODEL_CACHE_SIZE_VARIABLE, raising=False)
    entries = [_convert(private, str(n), 1) for n in range(3)]
    assert modelcache.make_room(private, 1 << 40) == []
    assert all(entry.exists() for entry in entries)


def test_the_setting_reaches_the_cluster_process_and_pilots():
    from snakemake_executor_context.pilots.request import PilotOptions
    from snakemake_executor_context.server.config import PilotServerSettings
    from snakemake_executor_context.settings.shape import Shape

    shape = Shape(model_cache_size="20MB").check()
    assert shape.serve_args()[-2:] == ["--model-cache-size", "20MB"]
    assert shape.model_cache_bytes == 20_000_000 and Shape().model_cache_bytes == 0
    assert "--model-cache-size" not in Shape().serve_args()
    wire = PilotOptions("slurm", shape=Shape(model_cache_size="2GB")).server_settings().to_wire()
    assert PilotServerSettings.from_wire(wire).shape.model_cache_bytes == 2_000_000_000


# ----------------------------------------------------------------------------------
# Two servers of one node sharing one cache.


async def _load(declaration, keep: bool, dask_worker=None) -> None:
    """Load the context as a job does; unless ``keep``, evict it from memory after."""
    from snakemake_executor_context.server.server import ContextServer

    cache = ContextServer.current().cache
    await asyncio.to_thread(cache.acquire, declaration)
    cache.release(declaration.identity, drop=not keep)


@pytest.mark.slow
def test_a_full_cache_drops_the_unused_template_keeps_loaded_and_read_ones(
    tmp_path, monkeypatch, workflow
):
    """Templates of 4 MB, room for three. Last used, oldest first: B (being read by
    another process), C (loaded on the other server), A (unused): D enters, A goes.
    Then a run of the real command line needs A again: its source is read once more
    and D (unused, least recently used now) goes; the run's outputs are right."""
    from distributed import Client

    from snakemake_executor_context.cluster.credentials import Credentials
    from tests.server.test_peers import _tree_digest

    (tmp_path / "local").mkdir()  # `up` refuses a missing one, as --context-local-dir does
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / "local"))
    cache = tmp_path / "models"
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(cache))
    workdir = workflow("peers")
    log = tmp_path / "source.log"
    a, b, c, d = 1, 2, 3, 4

    def context(seed: int):
        arguments = {"seed": seed, "megabytes": 4, "source_log": str(log), "source_seconds": 0.0}
        return make_declaration("files", "loaders.py:load", arguments, workdir)

    def entry(seed: int) -> Path:
        return cache / f"peers-{seed}-4"

    up = ["--servers", "2", "--model-cache-size", f"{3 * ENTRY}B"]
    with persistent_cluster(tmp_path / "cluster", *up) as path:
        security = Credentials.beside(path).security()
        with Client(scheduler_file=str(path), security=security, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            names = {i["name"]: a for a, i in client.scheduler_info()["workers"].items()}
            one, other = (names[n] for n in sorted(names))
            client.run(_load, context(b), False, workers=[one])
            reader = _hold_in_another_process(entry(b))
            try:
                client.run(_load, context(c), True, workers=[other])
                client.run(_load, context(a), False, workers=[one])
                client.run(_load, context(d), False, workers=[one])
                assert not entry(a).exists() and not modelcache.manifest_path(entry(a)).exists()
                assert all(entry(seed).exists() for seed in (b, c, d))
            finally:
                reader.stdin.close()
                reader.wait()
            config = [f"seed={a}", "megabytes=4", f"source_log={log}", "count=2", "sleep=0"]
            run = context_run(workdir, "--context-scheduler-file", str(path), "--config", *config)
            run.check()
    assert len(log.read_text().splitlines()) == 5, run.output  # A's source twice
    assert not entry(d).exists() and all(entry(seed).exists() for seed in (a, b, c))
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]
    spec = importlib.util.spec_from_file_location("peers_loaders", workdir / "loaders.py")
    loaders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaders)
    source = tmp_path / "source"
    source.mkdir()
    loaders.write_source(source, a, 4)  # what the source holds
    outputs = {p.read_text().split()[0] for p in (workdir / "out").glob("*.txt")}
    assert outputs == {_tree_digest(source)} == {_tree_digest(entry(a))}
