"""The one check of private directories (snakemake_executor_context.privacy), where
the server records the process groups its nanny will kill: a planted path is refused,
never followed."""

from __future__ import annotations

import os

import pytest

from snakemake_executor_context.errors import ContextExecutorError
from snakemake_executor_context.privacy import private_dir, private_dir_problem
from snakemake_executor_context.server.pgroups import GroupRecord


def test_a_fresh_private_directory_is_0700(tmp_path):
    assert private_dir_problem(tmp_path / "a" / "b", tighten=False) is None
    assert os.stat(tmp_path / "a" / "b").st_mode & 0o777 == 0o700


def test_a_planted_process_group_record_is_refused(tmp_path):
    # Another user creates the directory first, as a symlink to a place they chose:
    # following it would let them name the process groups this user's nanny kills.
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / "pgroups").symlink_to(elsewhere)
    record = GroupRecord(nanny_pid=1, name="cpu0", root=root)
    with pytest.raises(ContextExecutorError, match=r"is a symlink .* Fix: remove it"):
        record.add(12345)
    assert not list(elsewhere.iterdir())


def test_an_open_directory_is_refused_unless_tightened(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(ValueError, match="has mode 0777, open to other users"):
        private_dir(open_dir, ValueError, "chmod 700 it", tighten=False)
    private_dir(open_dir, ValueError, "chmod 700 it")
    assert os.stat(open_dir).st_mode & 0o777 == 0o700
