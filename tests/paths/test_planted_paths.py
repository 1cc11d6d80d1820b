"""Every path of the table in docs/security-paths.md, against a file, a directory and
a symlink owned by the real second user (``ctxattacker``): the one path rule
(snakemake_executor_context.paths) refuses each in one line, and nothing is read
from, written into or created through what was planted.

The planted things are made here as root and handed to the second user's uid (so
that also the rows inside the private root, which that user could never reach, are
covered); the end-to-end tests (tests/test_planted_e2e.py) plant as the second user
itself. Needs root, like the second-user tests of tests/cluster/test_security.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from snakemake_executor_context import modelcache, paths
from snakemake_executor_context.catalog.store import open_store
from snakemake_executor_context.cluster.credentials import Credentials, private_file
from snakemake_executor_context.cluster.infofiles import ClusterFiles
from snakemake_executor_context.cluster.process import LocalClusterProcess
from snakemake_executor_context.errors import UnsafePathError
from snakemake_executor_context.strays.processgroups import GroupRecord
from tests.conftest import need_second_user


@pytest.fixture(scope="module")
def second_uid() -> int:
    return need_second_user()


@dataclass
class Place:
    """The directories one case runs in: the private root's base, a sticky directory
    anyone may write to (as /tmp), the attacker's own directory."""

    base: Path
    shared: Path
    theirs: Path

    @property
    def root(self) -> Path:
        return self.base / f"snakemake-context-{os.getuid()}"

    @property
    def cache_entry(self) -> Path:
        return self.shared / "models" / "model-0123456789abcdef"


@pytest.fixture
def place(tmp_path: Path, monkeypatch, second_uid: int) -> Iterator[Place]:
    top = Path(tempfile.mkdtemp(prefix="ctx-planted-"))
    os.chmod(top, 0o755)
    here = Place(top / "base", top / "shared", top / "theirs")
    here.base.mkdir()
    here.shared.mkdir()
    os.chmod(here.shared, 0o1777)
    here.theirs.mkdir()
    os.chown(here.theirs, second_uid, second_uid)
    (here.shared / "models").mkdir(mode=0o777)
    os.chmod(here.shared / "models", 0o1777)
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(here.base))
    monkeypatch.setenv(modelcache.MODEL_CACHE_VARIABLE, str(here.shared / "models"))
    try:
        yield here
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _fail(_: Path) -> None:
    raise AssertionError("a conversion must not start over a planted entry")


@dataclass(frozen=True)
class Row:
    """One path of the table: where it lies, and the plugin's code that uses it."""

    name: str
    where: Callable[[Place], Path]
    use: Callable[[Place], object]
    kind: str  # "dir" or "file": what the plugin makes there


def _scheduler(place: Place) -> ClusterFiles:
    return ClusterFiles(place.shared / "x.json")


ROWS = [
    Row("private root", lambda p: p.root, lambda p: paths.private_root(), "dir"),
    Row(
        "Dask scratch space",
        lambda p: p.root / paths.SCRATCH_NAME,
        lambda p: paths.scratch_dir(),
        "dir",
    ),
    Row(
        "process-group records",
        lambda p: p.root / "pgroups",
        lambda p: GroupRecord(1, "cpu0").add(12345),
        "dir",
    ),
    Row(
        "live catalogs",
        lambda p: p.root / "catalogs",
        lambda p: open_store(p.shared / "catalog.db").close(),
        "dir",
    ),
    Row(
        "recorded manifests",
        lambda p: p.root / "manifests",
        lambda p: modelcache.manifest_path(p.cache_entry),
        "dir",
    ),
    Row(
        "source digests",
        lambda p: p.root / "digests",
        lambda p: modelcache.file_sha256(Path(__file__)),
        "dir",
    ),
    Row(
        "locks",
        lambda p: p.root / "locks",
        lambda p: paths.private_lock("x").__enter__(),
        "dir",
    ),
    Row(
        "cluster temporary files",
        lambda p: p.root / "tmp",
        lambda p: paths.private_temporary_directory(),
        "dir",
    ),
    Row(
        "Dask's scheduler file",
        lambda p: p.root / "clusters",
        lambda p: _scheduler(p).dask_scheduler_file,
        "dir",
    ),
    Row(
        "scheduler file",
        lambda p: p.shared / "x.json",
        lambda p: _scheduler(p).prepare(own_directory=False),
        "file",
    ),
    Row(
        "pid file (down)",
        lambda p: p.shared / "x.pid",
        lambda p: LocalClusterProcess.find(p.shared / "x.json"),
        "file",
    ),
    Row(
        "cluster log",
        lambda p: p.shared / "x.log",
        lambda p: os.close(paths.open_append(p.shared / "x.log")),
        "file",
    ),
    Row(
        "credentials",
        lambda p: p.shared / "x.tls",
        lambda p: Credentials.beside(p.shared / "x.json").check("test"),
        "dir",
    ),
    Row(
        "restart holds",
        lambda p: p.shared / "x.holds",
        lambda p: _scheduler(p).prepare(own_directory=False),
        "dir",
    ),
    Row(
        "catalog beside the scheduler file",
        lambda p: p.shared / "x.db",
        lambda p: private_file(p.shared / "x.db"),
        "file",
    ),
    Row(
        "catalog's SQLite sidecar",
        lambda p: p.shared / "x.db-wal",
        lambda p: private_file(p.shared / "x.db"),
        "file",
    ),
    Row(
        "catalog snapshot in a shared directory",
        lambda p: p.shared / "catalog.db",
        lambda p: open_store(p.shared / "catalog.db").close(),
        "file",
    ),
    Row(
        "model cache entry",
        lambda p: p.cache_entry,
        lambda p: modelcache.convert_once(p.cache_entry, _fail),
        "dir",
    ),
]


def _plant(path: Path, planted: str, place: Place, uid: int, kind: str) -> Callable[[], None]:
    """Plant ``planted`` (file, directory, symlink) of the second user at ``path``;
    the check that nothing went into or through it."""
    target = place.theirs / ("x" if kind == "file" else "")
    if path != place.root and path.is_relative_to(place.root):
        paths.private_root()  # this user's, as it would be: the second user plants inside
    if planted == "file":
        path.write_text("planted\n")
        os.chmod(path, 0o644)
        os.chown(path, uid, uid)
    elif planted == "directory":
        path.mkdir()
        os.chown(path, uid, uid)
    else:
        path.symlink_to(target)
        os.lchown(path, uid, uid)

    def untouched() -> None:
        if planted == "file":
            assert path.read_text() == "planted\n"
        elif planted == "directory":
            assert not list(path.iterdir()), list(path.iterdir())
        assert not list(place.theirs.iterdir()), list(place.theirs.iterdir())

    return untouched


@pytest.mark.parametrize("planted", ["file", "directory", "symlink"])
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_a_planted_path_is_refused_in_one_line(row: Row, planted: str, place, second_uid):
    path = row.where(place)
    untouched = _plant(path, planted, place, second_uid, row.kind)
    with pytest.raises(UnsafePathError) as caught:
        row.use(place)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message or str(place.root) in message, message
    untouched()


def test_the_private_root_names_the_setting_that_moves_it(place, second_uid):
    _plant(place.root, "symlink", place, second_uid, "dir")
    with pytest.raises(UnsafePathError) as caught:
        paths.scratch_dir()
    assert paths.LOCAL_DIR_VARIABLE in str(caught.value)
    assert paths.LOCAL_DIR_SETTING in str(caught.value)


def test_another_users_cache_directory_is_used_and_its_entries_checked(place, second_uid):
    """The cache itself may be a shared directory (a lab's): what this user converts
    into it is theirs and loads; the other user's entry beside it does not."""
    shared_cache = place.shared / "lab"
    shared_cache.mkdir()
    os.chown(shared_cache, second_uid, second_uid)
    os.chmod(shared_cache, 0o777)
    mine = shared_cache / "mine"

    def write(into: Path) -> None:
        (into / "config.json").write_text("{}")

    assert modelcache.convert_once(mine, write)
    assert modelcache.is_cached(mine)
    with modelcache.open_entry(mine) as through:
        assert (Path(through) / "config.json").read_text() == "{}"
    theirs = shared_cache / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    for made in (theirs, theirs / "config.json"):
        os.chown(made, second_uid, second_uid)
    assert not modelcache.is_cached(theirs)
    with pytest.raises(UnsafePathError, match="you recorded no digests"):
        modelcache.open_entry(theirs).__enter__()


def test_an_entry_that_is_no_longer_this_users_loads_only_by_its_digests(place, second_uid):
    """An entry this user wrote, later handed to another uid (a shared filesystem's
    mapping, a chown): loaded when its files match the digests recorded at writing,
    refused once one of them changed."""
    entry = place.cache_entry

    def write(into: Path) -> None:
        (into / "config.json").write_text('{"a": 1}')
        (into / "weights").write_bytes(b"\0" * 1000)

    assert modelcache.convert_once(entry, write)
    for made in (entry, entry / "config.json", entry / "weights"):
        os.chown(made, second_uid, second_uid)
    assert modelcache.is_cached(entry)
    with modelcache.open_entry(entry) as through:
        assert (Path(through) / "weights").stat().st_size == 1000
    (entry / "weights").write_bytes(b"\1" * 1000)  # same size, other content
    assert modelcache.is_cached(entry)  # the probe compares sizes only
    with pytest.raises(UnsafePathError, match="does not match the digests you recorded"):
        modelcache.open_entry(entry).__enter__()
