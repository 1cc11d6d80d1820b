"""The one rule for paths outside the workflow directory (snakemake_executor_context.paths),
each piece on its own, as this user (the same checks against a real second user's
files, directories and symlinks are in tests/cluster/test_security.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from snakemake_executor_context import paths
from snakemake_executor_context.errors import UnsafePathError
from snakemake_executor_context.strays.processgroups import GroupRecord


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def base(tmp_path, monkeypatch) -> Path:
    """A base directory of this user's for the private root."""
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(tmp_path / "local"))
    return tmp_path / "local"


def test_a_fresh_private_directory_is_0700(tmp_path):
    assert paths.dir_problem(tmp_path / "a" / "b", tighten=False) is None
    assert _mode(tmp_path / "a" / "b") == 0o700


def test_the_private_root_and_its_directories_are_made_0700(base):
    scratch = paths.scratch_dir()
    root = base / f"snakemake-context-{os.getuid()}"
    assert scratch == root / paths.SCRATCH_NAME
    assert _mode(root) == 0o700 and _mode(scratch) == 0o700
    assert paths.private_path("pgroups") == root / "pgroups"


def test_the_private_root_moves_with_its_variable_else_xdg_else_tmpdir(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.LOCAL_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert paths.local_base() == tmp_path
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    assert paths.local_base() == tmp_path / "t"
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(tmp_path / "mine"))
    assert paths.local_base() == tmp_path / "mine"


def test_a_planted_root_is_refused_in_one_line_naming_what_moves_it(base):
    elsewhere = base.parent / "attacker"
    elsewhere.mkdir()
    base.mkdir()
    (base / f"snakemake-context-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError) as caught:
        paths.scratch_dir()
    message = str(caught.value)
    assert "\n" not in message and "is a symlink" in message
    assert paths.LOCAL_DIR_VARIABLE in message and paths.LOCAL_DIR_SETTING in message
    assert not list(elsewhere.iterdir())


def test_a_root_in_a_directory_anyone_may_change_is_refused(tmp_path, monkeypatch):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # writable by all, no sticky bit: the root could be swapped
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(open_dir))
    with pytest.raises(UnsafePathError, match=r"other users may change \(mode 0777"):
        paths.private_root()
    os.chmod(open_dir, 0o1777)  # sticky, as /tmp: nobody removes or renames others' entries
    assert paths.private_root() == open_dir / f"snakemake-context-{os.getuid()}"


def test_a_planted_process_group_record_is_refused(tmp_path):
    # Another user creates the directory first, as a symlink to a place they chose:
    # following it would let them name the process groups this user's nanny kills.
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / "pgroups").symlink_to(elsewhere)
    record = GroupRecord(nanny_pid=1, name="cpu0", root=root)
    with pytest.raises(UnsafePathError, match=r"is a symlink .* Fix: remove it"):
        record.add(12345)
    assert not list(elsewhere.iterdir())


def test_process_group_records_live_in_the_private_root(base):
    record = GroupRecord(nanny_pid=1, name="cpu0")
    record.add(4242)
    assert record.path.parent == paths.private_path("pgroups")
    assert record.groups() == {4242} and _mode(record.path) == 0o600
    os.chmod(record.path, 0o666)  # a record others could have edited is not read
    assert record.groups() == set()


def test_an_open_directory_is_refused_unless_tightened(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePathError, match="has mode 0777, open to other users"):
        paths.private_dir(open_dir, "chmod 700 it", tighten=False)
    paths.private_dir(open_dir, "chmod 700 it")
    assert _mode(open_dir) == 0o700


def test_files_are_written_exclusively_and_never_through_a_symlink(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep")
    link = tmp_path / "x.pid"
    link.symlink_to(target)
    for action in (
        lambda: paths.write_private(link, "forged"),
        lambda: os.close(paths.open_append(link)),
        lambda: paths.read_trusted(link),
    ):
        with pytest.raises(UnsafePathError, match="is a symlink"):
            action()
    assert target.read_text() == "keep"
    assert not paths.create_exclusive(link)  # a dangling or live symlink is "there"
    fresh = tmp_path / "fresh"
    assert paths.create_exclusive(fresh, b"x") and _mode(fresh) == 0o600
    paths.write_private(fresh, "y")
    assert fresh.read_text() == "y" and _mode(fresh) == 0o600


def test_a_file_others_may_write_is_not_trusted(tmp_path):
    loose = tmp_path / "loose"
    loose.write_text("x")
    os.chmod(loose, 0o666)
    with pytest.raises(UnsafePathError, match=r"writable by other users \(mode 0666\)"):
        paths.read_trusted(loose)
    # This user's own log, left open: appending tightens it instead.
    os.close(paths.open_append(loose))
    assert _mode(loose) == 0o600 and paths.read_trusted(loose) == b"x"
    assert paths.read_trusted(tmp_path / "missing") is None


def test_remove_own_leaves_a_directory_alone(tmp_path):
    (tmp_path / "d").mkdir()
    assert not paths.remove_own(tmp_path / "d") and (tmp_path / "d").is_dir()
    (tmp_path / "f").write_text("")
    assert paths.remove_own(tmp_path / "f") and not (tmp_path / "f").exists()


def test_the_shell_lines_a_pilot_evaluates(base):
    done = subprocess.run(
        [sys.executable, "-P", "-m", "snakemake_executor_context.paths", "--shell"],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    scratch = base / f"snakemake-context-{os.getuid()}" / paths.SCRATCH_NAME
    assert f"export DASK_TEMPORARY_DIRECTORY={scratch}" in done.stdout
    assert f"export {paths.LOCAL_DIR_VARIABLE}={base}" in done.stdout
    (scratch.parent).chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-P", "-m", "snakemake_executor_context.paths", "--shell"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and paths.LOCAL_DIR_VARIABLE in done.stderr


def test_an_own_cache_entry_nobody_else_can_reach_is_used_whatever_its_modes(base, tmp_path):
    """A pilot's node-local cache made 0700, filled by `rsync -a` from a group-writable
    shared source: the files keep their modes, and no one else can reach them."""
    from snakemake_executor_context import modelcache

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    entry = cache / "model"
    entry.mkdir(mode=0o775)
    (entry / "config.json").write_text("{}")
    os.chmod(entry / "config.json", 0o664)
    assert modelcache.is_cached(entry)
    with modelcache.open_entry(entry) as through:
        assert (Path(through) / "config.json").read_text() == "{}"
    # The same entry where others may enter and write: trusted only by recorded
    # digests, and there are none.
    os.chmod(cache, 0o777)
    assert not modelcache.is_cached(entry)
    with pytest.raises(UnsafePathError, match="you recorded no digests"):
        modelcache.open_entry(entry).__enter__()
    assert not os.stat(entry / "config.json").st_mode & 0o022  # closed to others now


def test_the_private_root_never_makes_the_directories_above_its_base(tmp_path, monkeypatch):
    """A mistyped base (/nonexistent/dir) made /nonexistent and everything under it:
    the base itself may be made (one level), never the directories above it."""
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(tmp_path / "missing" / "dir"))
    with pytest.raises(UnsafePathError) as caught:
        paths.private_root()
    assert "\n" not in str(caught.value) and paths.LOCAL_DIR_SETTING in str(caught.value)
    assert not (tmp_path / "missing").exists()
    monkeypatch.setenv(paths.LOCAL_DIR_VARIABLE, str(tmp_path / "one"))
    assert paths.private_root() == tmp_path / "one" / f"snakemake-context-{os.getuid()}"
