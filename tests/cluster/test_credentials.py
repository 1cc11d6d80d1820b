"""The pieces of trust, each on its own (fast): private files and directories, a
cluster's credentials, process identity, and the checks of settings and addresses."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from snakemake_executor_context.cluster.attach import parse_address, resolve_target
from snakemake_executor_context.cluster.credentials import (
    Credentials,
    private_dir,
    private_file,
    write_private,
)
from snakemake_executor_context.cluster.infofiles import ClusterFiles, identity
from snakemake_executor_context.errors import ClusterError, UnsafePathError
from snakemake_executor_context.executor.recording import _outside
from snakemake_executor_context.settings.table import option

SERVERS = option("servers").allowed
MEMORY_BUDGET = option("contexts_memory").allowed


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_is_created_0700_and_parents_follow_the_umask(tmp_path):
    target = tmp_path / "a" / "b"
    private_dir(target)
    assert _mode(target) == 0o700
    umask = os.umask(0)
    os.umask(umask)
    assert _mode(tmp_path / "a") == 0o777 & ~umask


def test_private_dir_refuses_a_symlink_and_tightens_or_refuses_an_open_one(tmp_path):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="is a symlink"):
        private_dir(tmp_path / "link")
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePathError, match="open to other users"):
        private_dir(open_dir, tighten=False)
    private_dir(open_dir)
    assert _mode(open_dir) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_private_dir_refuses_another_users_directory(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafePathError, match="belongs to uid 65534, not to this user"):
        private_dir(theirs)


def test_private_files(tmp_path):
    write_private(tmp_path / "f", "secret")
    assert _mode(tmp_path / "f") == 0o600 and (tmp_path / "f").read_text() == "secret"
    loose = tmp_path / "loose.db"
    loose.write_text("")
    os.chmod(loose, 0o644)
    private_file(loose)
    assert _mode(loose) == 0o600
    made = private_file(tmp_path / "new" / "c.db")
    assert _mode(made) == 0o600 and _mode(made.parent) == 0o700


def test_each_cluster_has_its_own_authority(tmp_path):
    one = Credentials.generate(tmp_path / "one.tls")
    two = Credentials.generate(tmp_path / "two.tls")
    assert _mode(one.directory) == 0o700
    for path in (one.ca_file, one.cert_file, one.key_file):
        assert _mode(path) == 0o600
    assert one.ca_file.read_bytes() != two.ca_file.read_bytes()
    from cryptography import x509

    ca = x509.load_pem_x509_certificate(one.ca_file.read_bytes())
    cert = x509.load_pem_x509_certificate(one.cert_file.read_bytes())
    other_ca = x509.load_pem_x509_certificate(two.ca_file.read_bytes())
    cert.verify_directly_issued_by(ca)
    with pytest.raises((ValueError, TypeError, Exception)):
        cert.verify_directly_issued_by(other_ca)
    assert one.security().require_encryption
    one.remove()
    assert not one.directory.exists()


def test_identity_tells_a_process_from_a_later_one():
    process = subprocess.Popen(["sleep", "30"])
    try:
        for _ in range(100):  # until it has exec'd
            mine = identity(process.pid)
            if mine.get("cmdline") == ["sleep", "30"]:
                break
            time.sleep(0.02)
        assert mine["cmdline"] == ["sleep", "30"] and mine["start_ticks"] > 0
        assert identity(process.pid) == mine
    finally:
        process.kill()
        process.wait()
    assert identity(process.pid) == {} or identity(process.pid) != mine


def test_pid_file_of_another_process_names_nothing(tmp_path):
    files = ClusterFiles(tmp_path / "s.json")
    from dataclasses import replace

    from snakemake_executor_context.cluster.info import ClusterInfo

    files.write_info(ClusterInfo(pid=os.getpid()))
    assert files.running_pid() == os.getpid()
    assert _mode(files.pid_file) == 0o600
    record = files.read_info()
    assert record is not None and record.start_ticks is not None
    forged = replace(record, start_ticks=record.start_ticks + 1)
    files.pid_file.write_text(__import__("json").dumps(forged.to_wire()))
    assert files.running_pid() is None


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("tls://127.0.0.1:8786", ("tls", "127.0.0.1", 8786)),
        ("tcp://node7:1234", ("tcp", "node7", 1234)),
        ("node7:1234", ("tcp", "node7", 1234)),
        ("tls://[::1]:8786", ("tls", "::1", 8786)),
    ],
)
def test_good_addresses(address, expected):
    assert parse_address(address, "--x") == expected


@pytest.mark.parametrize(
    "address", ["localhost", "tls://h:0", "tls://h:70000", "http://h:1", "tls://h:p", "", "tls://"]
)
def test_bad_addresses_are_one_line(address):
    with pytest.raises(ClusterError) as caught:
        parse_address(address, "--context-scheduler-address")
    assert "\n" not in str(caught.value)
    assert "--context-scheduler-address" in str(caught.value) and "tls://HOST:PORT" in str(
        caught.value
    )


def test_plaintext_needs_the_setting(tmp_path):
    with pytest.raises(ClusterError, match="plaintext scheduler"):
        resolve_target(address="tcp://h:1", scheduler_file=None)
    target = resolve_target(address="tcp://h:1", scheduler_file=None, allow_plaintext=True)
    assert target.security is None and target.warning and "plaintext" in target.warning


@pytest.mark.parametrize("value", [None, 0, 1, 8])
def test_good_server_counts(value):
    assert SERVERS.problem(value) is None


@pytest.mark.parametrize("value", [-1, 257, 1.5, True])
def test_bad_server_counts(value):
    assert "a whole number of servers" in (SERVERS.problem(value) or "")


@pytest.mark.parametrize("value", ["0.8", "1", "6GB", "512 MiB"])
def test_good_memory_budgets(value):
    assert MEMORY_BUDGET.problem(value) is None


@pytest.mark.parametrize("value", ["abc", "0", "1.5", "-1GB", "", "0GB"])
def test_bad_memory_budgets(value):
    assert "(0, 1]" in (MEMORY_BUDGET.problem(value) or "")


def test_catalogs_outside_the_workflow_directory_are_private(tmp_path):
    workdir = tmp_path / "wf"
    assert _outside(str(workdir / ".snakemake/context/catalog.db"), str(workdir)) is None
    assert _outside("postgresql+psycopg://u@h/db", str(workdir)) is None
    assert _outside(str(tmp_path / "shared.db"), str(workdir)) == tmp_path / "shared.db"
