"""A model-cache entry is checked against the manifest recorded when it was written
before every load that uses it (snakemake_executor_context.cachecheck): its sizes
always, the digests of the files whose stat changed since it was last verified (a
file rewritten and given its old mtime back has a new ctime). A damaged entry of the
user's own is moved aside, named in one line (the job's log) and a catalog row, and
made again: with the source there, every output is right and the run ends 0.

On real entry directories in a cache and private root of each test's own; the end to
end test runs the real command line on the peers test workflow (a context whose
template is a cache entry of seeded files, loaded by reading them back).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from sqlalchemy import select

from snakemake_executor_context import modelcache
from snakemake_executor_context.catalog.models import DamagedEntry
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.errors import UnsafePathError
from snakemake_executor_context.modelcache import cachecheck, cacheroom
from snakemake_executor_context.modelcache.manifest import Manifest
from tests.conftest import WORKFLOWS, context_run
from tests.server.test_peers import _tree_digest


@pytest.fixture
def private(tmp_path, monkeypatch) -> Path:
    """A private root and a model cache of this test's own."""
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / "local"))
    cache = tmp_path / "models"
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(cache))
    return cache


@pytest.fixture
def digests(monkeypatch) -> list[Path]:
    """The files whose digests the checks take (a spy on the one function that
    reads them; the checks run for real)."""
    taken: list[Path] = []
    real = cachecheck.digest_file

    def spy(path: Path) -> tuple[int, str]:
        taken.append(path)
        return real(path)

    monkeypatch.setattr(cachecheck, "digest_file", spy)
    return taken


def _write(into: Path) -> None:
    (into / "weights").mkdir()
    (into / "weights" / "w.bin").write_bytes(bytes(range(256)) * 4096)
    (into / "config.json").write_text('{"layers": 2}')


def _flip16(path: Path) -> None:
    """16 bytes flipped in the middle of ``path``, its mtime put back (only its ctime
    tells)."""
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(16):
        data[middle + i] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


def _truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


DAMAGE = {"16 flipped bytes": (_flip16, "sha256"), "truncated to half": (_truncate_half, "bytes")}


def test_what_a_conversion_digested_is_not_read_again_and_a_changed_file_is(private, digests):
    entry = private / "model"
    assert modelcache.convert_once(entry, _write)
    digests.clear()  # the conversion's own reading, as it wrote
    with modelcache.open_entry(entry):
        pass
    assert digests == []  # verified as written: sizes and stats only
    os.utime(entry / "config.json")  # same bytes, new times: read again, once
    with modelcache.open_entry(entry):
        pass
    with modelcache.open_entry(entry):
        pass
    assert [p.name for p in digests] == ["config.json"]
    digests.clear()
    cachecheck.forget(entry)  # as when a peer reported a file whose digest differs
    with modelcache.open_entry(entry):
        pass
    assert sorted(p.name for p in digests) == ["config.json", "w.bin"]


def test_the_check_decides_by_names_sizes_and_stats():
    manifest = Manifest.from_json(
        '{"format": "snakemake-context-manifest", "version": 1, "files": ['
        f'{{"path": "a", "size": 3, "sha256": "{"0" * 64}"}}, '
        f'{{"path": "b/c", "size": 5, "sha256": "{"1" * 64}"}}]}}'
    )
    found = {"a": (3, 1, 1, 10, 10), "b/c": (5, 2, 1, 10, 10)}
    assert cachecheck.plan(manifest, found, None) == (None, ["a", "b/c"])
    assert cachecheck.plan(manifest, found, dict(found)) == (None, [])
    assert cachecheck.plan(manifest, found, {**found, "a": (3, 1, 1, 10, 9)}) == (None, ["a"])
    assert cachecheck.plan(manifest, {**found, "a": (2, 1, 1, 10, 10)}, found)[0] == (
        "a: 2 bytes, the manifest says 3"
    )
    assert cachecheck.plan(manifest, {"a": found["a"]}, found)[0].startswith("b/c: missing")
    assert cachecheck.plan(manifest, {**found, "d": found["a"]}, found)[0] == (
        "d: not in the manifest"
    )


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_moved_aside_and_made_again(private, damage, capfd):
    entry = private / "model"
    assert modelcache.convert_once(entry, _write)
    good = _tree_digest(entry)
    change, says = DAMAGE[damage]
    change(entry / "weights" / "w.bin")
    assert modelcache.is_cached(entry) is (damage == "16 flipped bytes")  # sizes only
    with cachecheck.watching() as found:
        assert modelcache.convert_once(entry, _write)  # as a loader does: made again
    (damaged,) = found
    assert damaged.entry == str(entry) and says in damaged.problem
    aside = Path(damaged.aside)
    assert aside.name == entry.name and aside.parent.name.startswith(".damaged-model.")
    assert _tree_digest(aside) != good == _tree_digest(entry)
    with modelcache.open_entry(entry) as path:
        assert _tree_digest(Path(path)) == good
    lines = [line for line in capfd.readouterr().err.splitlines() if "differs" in line]
    assert len(lines) == 1 and str(entry) in lines[0] and str(aside) in lines[0], lines


def test_a_file_changed_while_it_is_loaded_fails_the_load(private):
    entry = private / "model"
    modelcache.convert_once(entry, _write)
    loading = modelcache.open_entry(entry)
    with pytest.raises(UnsafePathError, match="changed while it was loaded"), loading as path:
        _flip16(Path(path) / "weights" / "w.bin")
    assert not entry.exists()  # moved aside: the next load makes it again
    assert [p.name.startswith(".damaged-model.") for p in private.iterdir()] == [True]


def test_an_entry_moved_aside_stays_while_its_name_is_in_use(private):
    entry = private / "model"
    modelcache.convert_once(entry, _write)
    release = cacheroom.hold_entry(entry)  # a server holding it loaded, say
    _truncate_half(entry / "config.json")
    assert modelcache.check_before_load(entry)
    assert modelcache.make_room(private, 0) == []
    (aside,) = private.iterdir()
    assert (aside / "model").is_dir()  # a reader may still have it open
    release()
    modelcache.make_room(private, 0)
    assert list(private.iterdir()) == []


def _peers_loaders():
    spec = importlib.util.spec_from_file_location("peers_loaders", WORKFLOWS / "peers/loaders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_servers_damaged_entry_goes_aside_and_every_output_is_right(
    private, tmp_path, workflow, damage
):
    """The real command line, one server whose cache holds the context's template:
    damaged on disk, it is moved aside before the load, the load reads the source,
    every output is right, the run ends 0; one line of the job's log names it, and a
    catalog row."""
    workdir = workflow("peers")
    loaders = _peers_loaders()
    loaders.load(seed=1, megabytes=4)  # the server's own entry, written earlier
    entry = private / "peers-1-4"
    source = tmp_path / "source"
    source.mkdir()
    loaders.write_source(source, 1, 4)
    DAMAGE[damage][0](entry / "weights" / "b.bin")
    config = ["count=4", "megabytes=4", "sleep=0"]  # the cache and root: the fixture's
    run = context_run(workdir, "--context-servers", "1", "--config", *config).check()
    outputs = [p.read_text().split()[0] for p in sorted((workdir / "out").glob("*.txt"))]
    assert outputs == [_tree_digest(source)] * 4, run.output
    assert _tree_digest(entry) == _tree_digest(source)
    logs = [p.read_text() for p in (workdir / ".snakemake/context/logs/use").glob("*.log")]
    lines = [line for log in logs for line in log.splitlines() if "differs" in line]
    assert len(lines) == 1 and f"model-cache entry {entry} differs" in lines[0], logs
    assert not any("still open" in log for log in logs), logs  # the template's lock
    with open_reader(workdir / ".snakemake/context/catalog.db").session() as session:
        (row,) = session.scalars(select(DamagedEntry)).all()
    assert row.entry == str(entry) and row.context_id is not None
    assert DAMAGE[damage][1] in row.problem and f"moved aside to {row.aside}" in lines[0]
    assert Path(row.aside).parent.name.startswith(".damaged-peers-1-4.")
    assert _tree_digest(Path(row.aside)) != _tree_digest(source)
