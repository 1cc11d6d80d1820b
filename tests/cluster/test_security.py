"""Only the owner reaches a cluster: every listening port of an embedded or `up`
cluster refuses plain TCP, TLS without a certificate and another cluster's
certificate; its files are private; a second local user gets nowhere.

The second-user tests need root (to create the user ``ctxattacker`` and run as it);
elsewhere they skip with the reason, unless SNAKEMAKE_CONTEXT_REQUIRE_SECOND_USER=1
(as in CI), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.cluster.connection import ClusterConnection
from snakemake_executor_context.cluster.credentials import Credentials
from snakemake_executor_context.cluster.infofiles import ClusterFiles
from tests.conftest import shared_cluster

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("security_probe.py")
ATTACKER = "ctxattacker"
REQUIRE_SECOND_USER = "SNAKEMAKE_CONTEXT_REQUIRE_SECOND_USER"


# -- the clusters under test --------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> Iterator[ClusterConnection]:
    """The embedded cluster, started by the executor's own call, in a workflow
    directory that other users may traverse (0755)."""
    workdir = Path(tempfile.mkdtemp(prefix="ctx-wf-"))
    os.chmod(workdir, 0o755)
    connection = ClusterConnection.start_embedded(
        workdir / ".snakemake" / "context" / "cluster" / "run.json",
        servers=2,
        memory_budget="0.8",
        timeout=90,
    )
    try:
        yield connection
    finally:
        connection.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def up_cluster() -> Iterator[Path]:
    """A cluster started by `snakemake-context up` in an existing shared directory."""
    with shared_cluster("--servers", "2") as path:
        yield path


def _ports(scheduler_file: Path, plaintext: bool = False) -> tuple[int, list[int], list[int]]:
    """The scheduler's port, the Dask ports (scheduler, workers, nannies) and the
    other listening ports (HTTP) of the cluster's whole process tree."""
    files = ClusterFiles(scheduler_file)
    info = files.read_info()
    assert info is not None
    root = psutil.Process(info.pid)
    listening = {
        conn.laddr.port
        for proc in [root, *root.children(recursive=True)]
        for conn in proc.net_connections("tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    target = ClusterConnection.attach(
        address=None, scheduler_file=scheduler_file, timeout=20, allow_plaintext=plaintext
    )
    try:
        workers = target.client.scheduler_info(n_workers=-1)["workers"]
        dask_addresses = [info.address, *workers, *(w["nanny"] for w in workers.values())]
    finally:
        target.client.close()
    dask_ports = sorted(int(address.rsplit(":", 1)[1]) for address in dask_addresses)
    assert len(dask_ports) == 5 and set(dask_ports) <= listening, (dask_ports, listening)
    scheduler_port = int(info.address.rsplit(":", 1)[1])
    return scheduler_port, dask_ports, sorted(listening - set(dask_ports))


def _probe(spec: dict, command: list[str], env: dict | None = None) -> dict:
    done = subprocess.run(
        [*command, json.dumps(spec)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _foreign(directory: Path) -> dict[str, str]:
    """Another cluster's credentials (a real one: same code, its own authority)."""
    other = Credentials.generate(directory / "other.tls")
    return {"ca": str(other.ca_file), "cert": str(other.cert_file), "key": str(other.key_file)}


def _check_refusals(scheduler_file: Path, tmp_path: Path) -> None:
    scheduler_port, dask_ports, http_ports = _ports(scheduler_file)
    own = Credentials.beside(scheduler_file)
    markers = tmp_path / "markers"
    markers.mkdir()
    result = _probe(
        {
            "host": "127.0.0.1",
            "ports": dask_ports + http_ports,
            "http": http_ports,
            "scheduler_port": scheduler_port,
            "modes": ["plain", "tls-no-cert", "foreign", "own"],
            "foreign": _foreign(tmp_path),
            "own": {"ca": str(own.ca_file), "cert": str(own.cert_file), "key": str(own.key_file)},
            "markers": str(markers),
        },
        [sys.executable, str(PROBE)],
    )
    made = set(os.listdir(markers))
    # The positive control: with the cluster's own certificate the same probe runs
    # code on every Dask port, through Client.run and run_on_scheduler too.
    assert {f"rpc-{port}-own" for port in dask_ports} <= made, result
    assert {"client-run-own", "client-sched-own"} <= made, result
    # Nobody else ran anything anywhere.
    assert not {m for m in made if not m.endswith("-own")}, result
    for mode in ("plain", "foreign"):
        assert result["client"][mode].startswith("refused"), result
    # Dask's HTTP servers (plaintext, /sitemap.json to anyone) listen nowhere: every
    # port the cluster's processes listen on is one of its TLS Dask ports.
    assert http_ports == [], http_ports


def test_embedded_cluster_refuses_strangers_on_every_port(embedded, tmp_path):
    assert embedded.local is not None
    assert embedded.client.scheduler.address.startswith("tls://")
    _check_refusals(embedded.local.files.scheduler_file, tmp_path)


def test_up_cluster_refuses_strangers_on_every_port(up_cluster, tmp_path):
    _check_refusals(up_cluster, tmp_path)


def test_up_cluster_files_are_private(up_cluster):
    files = ClusterFiles(up_cluster)
    credentials = files.credentials
    for path in (
        files.scheduler_file,
        files.pid_file,
        files.log_file,
        files.catalog_file,
        credentials.ca_file,
        credentials.cert_file,
        credentials.key_file,
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(credentials.directory.stat().st_mode) == 0o700
    # The directory existed (a shared scratch directory): left as it was.
    assert stat.S_IMODE(up_cluster.parent.stat().st_mode) == 0o755


def test_embedded_cluster_files_are_private_and_job_files_follow_umask(embedded):
    assert embedded.local is not None
    files = embedded.local.files
    cluster_dir = files.scheduler_file.parent
    assert stat.S_IMODE(cluster_dir.stat().st_mode) == 0o700
    for path in (files.scheduler_file, files.pid_file, files.log_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # The workflow's own directories (created on the way) follow the umask.
    umask = os.umask(0)
    os.umask(umask)
    context_dir = cluster_dir.parent
    assert stat.S_IMODE(context_dir.stat().st_mode) == 0o777 & ~umask


def test_credentials_that_do_not_match_are_one_line(up_cluster, tmp_path):
    foreign = Credentials.generate(tmp_path / "foreign.tls")
    address = json.loads(up_cluster.read_text())["address"]
    from snakemake_executor_context.errors import ClusterError

    with pytest.raises(ClusterError) as caught:
        ClusterConnection.attach(
            address=address, scheduler_file=None, timeout=20, credentials=foreign.directory
        )
    message = str(caught.value)
    assert "\n" not in message
    assert f"the credentials in {foreign.directory} do not match the server at" in message


# -- a second local user ------------------------------------------------------------


def _need_second_user(reason: str) -> None:
    if os.environ.get(REQUIRE_SECOND_USER) == "1":
        pytest.fail(f"{REQUIRE_SECOND_USER}=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def attacker() -> Iterator[tuple[list[str], dict[str, str], Path]]:
    """(command prefix that runs the probe as ``ctxattacker``, its environment, a
    directory it may read and write)."""
    if os.geteuid() != 0:
        _need_second_user("the second-user tests need root (to create a user and run as it)")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        _need_second_user("useradd or runuser is missing")
    if subprocess.run(["id", ATTACKER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
            check=True,
            capture_output=True,
        )
    base = Path(tempfile.mkdtemp(prefix="ctx-attacker-"))
    os.chmod(base, 0o755)
    # A readable copy of what the probe imports (the test environment may live under a
    # directory the second user cannot enter): the top-level packages it loads.
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, distributed, distributed.protocol.pickle, cryptography.x509;"
            "import distributed.comm.tcp, ssl, urllib.request;"
            "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values())"
            " if getattr(m, '__file__', None)})))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    tops = set()
    for name in json.loads(listed.stdout.splitlines()[-1]):
        path = Path(name).resolve()
        if path.is_relative_to(site):
            tops.add(path.relative_to(site).parts[0])
    copy = base / "site"
    for top in sorted(tops):
        source = site / top
        if source.is_dir():
            shutil.copytree(source, copy / top)
        else:
            copy.mkdir(exist_ok=True)
            shutil.copy2(source, copy / top)
    shutil.copy2(PROBE, base / PROBE.name)
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(copy),
        "PYTHONNOUSERSITE": "1",
        "HOME": str(base),
    }
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (
        str(Path(sys.executable).resolve()),
        f"/usr/bin/{minor}",
        f"/usr/local/bin/{minor}",
    ):
        command = [str(shutil.which("runuser")), "-u", ATTACKER, "--", python]
        check = subprocess.run(
            [*command, "-c", "import distributed, cryptography; print('ok')"],
            capture_output=True,
            text=True,
            env=env,
        )
        if check.returncode == 0 and "ok" in check.stdout:
            break
    else:
        shutil.rmtree(base, ignore_errors=True)
        _need_second_user(
            f"no Python {sys.version_info.major}.{sys.version_info.minor} that {ATTACKER} "
            f"can run with a copy of the environment: {check.stderr.strip()[-300:]}"
        )
    try:
        yield [*command, str(base / PROBE.name)], env, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _unix_sockets(scheduler_file: Path) -> list[Path]:
    """The Unix sockets with a path that the cluster's process tree holds (the
    forkserver's, which forks a server for whoever connects), and their directories."""
    info = ClusterFiles(scheduler_file).read_info()
    assert info is not None
    root = psutil.Process(info.pid)
    paths = {
        Path(conn.laddr)
        for proc in [root, *root.children(recursive=True)]
        for conn in proc.net_connections("unix")
        if isinstance(conn.laddr, str) and conn.laddr.startswith("/")
    }
    return sorted(paths | {path.parent for path in paths})


def _second_user_attack(
    attacker, scheduler_file: Path, extra_reads: list[Path], plaintext: bool = False
) -> dict:
    command, env, base = attacker
    scheduler_port, dask_ports, http_ports = _ports(scheduler_file, plaintext)
    markers = Path(tempfile.mkdtemp(prefix="markers-", dir=base))
    os.chmod(markers, 0o1777)
    foreign = Path(tempfile.mkdtemp(prefix="foreign-", dir=base))
    foreign_files = _foreign(foreign)
    subprocess.run(["chmod", "-R", "a+rX", str(foreign)], check=True)
    files = ClusterFiles(scheduler_file)
    credentials = files.credentials
    sockets = _unix_sockets(scheduler_file)
    assert any(path.name.startswith("listener-") for path in sockets), sockets
    reads = [
        files.scheduler_file,
        files.pid_file,
        files.log_file,
        credentials.directory,
        credentials.key_file,
        credentials.cert_file,
        *sockets,
        *extra_reads,
    ]
    result = _probe(
        {
            "host": "127.0.0.1",
            "ports": dask_ports + http_ports,
            "http": http_ports,
            "scheduler_port": scheduler_port,
            "modes": ["plain", "tls-no-cert", "foreign"],
            "foreign": foreign_files,
            "markers": str(markers),
            "read": [str(path) for path in reads],
            "connect": [str(path) for path in sockets if path.name.startswith("listener-")],
        },
        command,
        env,
    )
    assert result["uid"] != 0
    if plaintext:  # the control: the same attack works on a cluster without TLS
        result["markers"] = sorted(os.listdir(markers))
        result["ports"] = (scheduler_port, dask_ports, http_ports)
        return result
    assert not os.listdir(markers), result  # no code ran, on any port, in any way
    for mode in ("plain", "foreign"):
        assert result["client"][mode].startswith("refused"), result
    for path in reads:
        assert result["read"][str(path)].startswith("denied"), result
    assert result["connect"], result
    for outcome in result["connect"].values():
        assert outcome.startswith("denied"), result
    return result


def test_second_user_attack_works_on_a_plaintext_cluster(attacker, tmp_path):
    """The control that shows the attack is real: against the same cluster without
    TLS (the benchmark-only switch) and in a directory it can read, the second user
    runs code on every Dask port."""
    from snakemake_executor_context.cluster.process import LocalClusterProcess

    shared = Path(tempfile.mkdtemp(prefix="ctx-plain-"))
    os.chmod(shared, 0o755)
    local = LocalClusterProcess.start(
        shared / "scheduler.json", servers=2, memory_budget="0.8", timeout=90, tls=False
    )
    try:
        result = _second_user_attack(attacker, local.files.scheduler_file, [], plaintext=True)
    finally:
        local.stop()
        shutil.rmtree(shared, ignore_errors=True)
    _, dask_ports, _ = result["ports"]
    assert {f"rpc-{port}-plain" for port in dask_ports} <= set(result["markers"]), result


def test_second_user_cannot_use_an_up_cluster(attacker, up_cluster):
    files = ClusterFiles(up_cluster)
    _second_user_attack(attacker, up_cluster, [files.catalog_file])


def test_second_user_cannot_use_an_embedded_cluster(attacker, embedded):
    assert embedded.local is not None
    _second_user_attack(attacker, embedded.local.files.scheduler_file, [])


def test_second_user_cannot_plant_the_live_catalog_directory(attacker, tmp_path, monkeypatch):
    """``ctxattacker`` pre-creates the live copy's directory of a network-filesystem
    catalog, in a shared sticky directory such as /tmp, as a symlink to a directory it
    owns: the victim's run refuses it, and nothing appears in the attacker's
    directory (before, the victim created the live catalog there, readable and
    writable by the attacker)."""
    from snakemake_executor_context.catalog import store
    from snakemake_executor_context.errors import UnsafePathError
    from tests.catalog.test_catalog import MOUNTS

    command, env, base = attacker
    python = command[:-1]
    shared_tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=base))
    os.chmod(shared_tmp, 0o1777)  # like /tmp: anyone creates, nobody removes others'
    target = shared_tmp / "attacker-owned"
    planted = shared_tmp / f"snakemake-context-{os.getuid()}"
    code = (
        "import os, sys; os.makedirs(sys.argv[2], exist_ok=True); "
        "os.symlink(sys.argv[2], sys.argv[1])"
    )
    subprocess.run([*python, "-c", code, str(planted), str(target)], check=True, env=env)
    assert planted.is_symlink() and planted.lstat().st_uid != os.getuid()
    # tmp_path/nfs counts as an NFS mount (no real one exists here).
    nfs = tmp_path / "nfs"
    nfs.mkdir()
    table = tmp_path / "mounts"
    table.write_text(MOUNTS.format(nfs=nfs, lustre=tmp_path / "l", fuse=tmp_path / "f"))
    monkeypatch.setattr(store, "MOUNT_TABLE", table)
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(shared_tmp))
    with pytest.raises(UnsafePathError, match=r"Refusing .* is a symlink"):
        store.open_store(nfs / "catalog.db")
    assert not list(target.iterdir())
