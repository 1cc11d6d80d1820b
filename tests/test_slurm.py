"""Pilots on a real SLURM: Debian's slurm-wlm and munge as a single-node cluster
(``tests/slurm/slurm-up.sh``: 8 declared CPUs on these 2-core machines, two fake GPU
types ``fakea`` and ``fakeb`` of 2 GPUs each, preemption by partition tier).

The fixture installs and starts SLURM where it can (root, Debian's packages reachable),
stops what it started, and skips with the reason elsewhere;
``SNAKEMAKE_CONTEXT_REQUIRE_SLURM=1`` (set by CI) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import BIN, WORKFLOWS, context_run

SLURM_DIR = Path(__file__).parent / "slurm"
REQUIRED = os.environ.get("SNAKEMAKE_CONTEXT_REQUIRE_SLURM") == "1"


def _skip(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason}, and SNAKEMAKE_CONTEXT_REQUIRE_SLURM=1")
    pytest.skip(reason)


def _running(pidfile: str, comm: str) -> bool:
    try:
        pid = int(Path(pidfile).read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    """A running single-node SLURM (started here unless it already ran)."""
    if os.geteuid() != 0:
        _skip("a single-node SLURM needs root to start munged, slurmctld and slurmd")
    if shutil.which("apt-get") is None and shutil.which("sbatch") is None:
        _skip("no SLURM and no apt-get to install Debian's slurm-wlm")
    was_running = _running("/run/slurmctld.pid", "slurmctld")
    started = subprocess.run(
        ["bash", str(SLURM_DIR / "slurm-up.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SLURM_SMOKE": "0"},
    )
    if started.returncode != 0:
        _skip(f"SLURM did not start: {started.stdout[-1500:]}{started.stderr[-1500:]}")
    try:
        yield
    finally:
        if not was_running:
            subprocess.run(
                ["bash", str(SLURM_DIR / "slurm-down.sh")], capture_output=True, timeout=120
            )


def _squeue() -> list[dict[str, str]]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j|%T|%b"], capture_output=True, text=True, check=True
    ).stdout
    return [
        dict(zip(("id", "name", "state", "gres"), line.split("|"), strict=True))
        for line in out.splitlines()
        if line.strip()
    ]


def _pilots() -> list[dict[str, str]]:
    return [job for job in _squeue() if job["name"] == "snakemake-context"]


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def pool(tmp_path: Path, slurm) -> Iterator:
    """Start `snakemake-context up --backend slurm ...` with given options; stopped after."""
    started: list[Path] = []

    def up(*options: str) -> Path:
        scheduler_file = tmp_path / f"pool{len(started)}" / "scheduler.json"
        result = subprocess.run(
            [
                str(BIN / "snakemake-context"),
                "up",
                "--scheduler-file",
                str(scheduler_file),
                "--backend",
                "slurm",
                "--pilot-memory",
                "1GB",
                "--walltime",
                "00:20:00",
                "--pilot-log-dir",
                str(tmp_path / "pilot-logs"),
                *options,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        started.append(scheduler_file)
        return scheduler_file

    try:
        yield up
    finally:
        for scheduler_file in started:
            subprocess.run(
                [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(scheduler_file)],
                capture_output=True,
                timeout=60,
            )
        _wait(lambda: not _pilots(), 30, "the pilots to leave the queue")


def test_a_context_workflow_runs_on_slurm_pilots(tmp_path: Path, pool) -> None:
    scheduler_file = pool("--gpu-type", "fakea", "--min-pilots", "1", "--max-pilots", "2")
    pilots = _wait(_pilots, 60, "a pilot in the queue")
    assert "gpu:fakea:1" in pilots[0]["gres"], pilots
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--config",
        "count=6",
        "sleep=0.2",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=240,
    ).check()
    for i in range(6):
        assert (workdir / "out" / f"{i}.txt").read_text().strip(), i
    summary = run.summaries()[-1]
    servers = json.dumps(summary)
    # The jobs ran on pilots, named after their GPU type.
    assert "pilot-fakea-" in servers, summary


GPU_MODEL_SNAKEFILE = """
rule all:
    input: expand("out/{kind}-{i}.txt", kind=["a", "b"], i=range(2))

rule on_a:
    output: "out/a-{i}.txt"
    resources: gpu=1, gpu_model="fakea"
    shell: "echo $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID > {output}"

rule on_b:
    output: "out/b-{i}.txt"
    resources: gpu=1, gpu_model="fakeb"
    shell: "echo $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID > {output}"
"""


def test_gpu_model_rules_run_only_on_pilots_of_their_type(tmp_path: Path, pool) -> None:
    scheduler_file = pool(
        "--gpu-type", "fakea", "--gpu-type", "fakeb", "--min-pilots", "2", "--max-pilots", "2"
    )
    pilots = _wait(lambda: len(_pilots()) == 2 and _pilots(), 60, "two pilots")
    gres = {job["id"]: job["gres"] for job in pilots}
    assert sorted(g.split(":")[-2] for g in gres.values()) == ["fakea", "fakeb"], gres
    workdir = tmp_path / "models"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(GPU_MODEL_SNAKEFILE)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--context-wait-for-server",
        "60",
        timeout=240,
    ).check()
    for kind in ("a", "b"):
        for i in range(2):
            job_id = (workdir / "out" / f"{kind}-{i}.txt").read_text().split()[-1]
            assert gres[job_id].split(":")[-2] == f"fake{kind}", (kind, gres)


def _pool_books(scheduler_file: Path) -> dict:
    out = subprocess.run(
        [
            str(BIN / "snakemake-context"),
            "status",
            "--json",
            "--scheduler-file",
            str(scheduler_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout).get("pool") or {}


def test_a_cancelled_pilot_is_survived_and_classified(tmp_path: Path, pool) -> None:
    scheduler_file = pool("--gpu-type", "fakea", "--min-pilots", "2", "--max-pilots", "2")
    _wait(lambda: len(_pilots()) == 2, 60, "two pilots")
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "--executor",
            "context",
            "--jobs",
            "2",
            "--context-scheduler-file",
            str(scheduler_file),
            "--config",
            "count=12",
            "sleep=2",
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TOY_LOAD_SECONDS": "0.5"},
    )
    try:
        _wait(
            lambda: (
                len(list((workdir / "out").glob("*.txt"))) >= 2
                if (workdir / "out").exists()
                else False
            ),
            120,
            "the first outputs",
        )
        victim = _pilots()[0]["id"]
        subprocess.run(["scancel", victim], check=True)
        output, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    for i in range(12):
        assert (workdir / "out" / f"{i}.txt").read_text().strip(), i

    def cancelled_record():
        records = _pool_books(scheduler_file).get("records", [])
        return [r for r in records if r["job_id"] == victim and r["batch_state"]]

    (record,) = _wait(cancelled_record, 60, "the pool to read the cancelled pilot's state")
    assert record["batch_state"] == "CANCELLED" and not record["released"], record
    books = _pool_books(scheduler_file)
    assert books["account"]["preempted"] >= 1, books
    # The pool keeps its minimum: the cancelled pilot was replaced.
    assert books["account"]["submitted"] >= 3, books


def test_pilots_retire_before_walltime_and_are_replaced_while_work_remains(
    tmp_path: Path, pool
) -> None:
    # Walltime 1:10, margin 45 s, stagger 5 s: each pilot retires after 20-25 s.
    scheduler_file = pool(
        "--gpu-type",
        "fakea",
        "--min-pilots",
        "0",
        "--max-pilots",
        "1",
        "--walltime",
        "00:01:10",
        "--retire-margin",
        "45",
        "--lifetime-stagger",
        "5",
        "--pilot-idle-timeout",
        "3",
    )
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--context-wait-for-server",
        "120",
        "--config",
        "count=16",
        "sleep=3",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=400,
    ).check()
    for i in range(16):
        assert (workdir / "out" / f"{i}.txt").read_text().strip(), i
    books = _wait(
        lambda: (b := _pool_books(scheduler_file))["account"]["running"] == 0 and b,
        60,
        "idle pilots to be released",
    )
    # 48 s of jobs on one pilot at a time that lives at most 25 s: at least two pilots.
    assert books["account"]["submitted"] >= 2, books
    assert books["account"]["crashed"] == 0, books


def test_a_run_with_a_backend_submits_its_own_pilots(tmp_path: Path, slurm) -> None:
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    run = context_run(
        workdir,
        "--context-backend",
        "slurm",
        "--context-pilot-gpu-types",
        "fakeb",
        "--context-pilot-memory",
        "1GB",
        "--context-max-pilots",
        "2",
        "--context-pilot-walltime",
        "00:10:00",
        "--config",
        "count=6",
        "sleep=0.2",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=240,
    ).check()
    for i in range(6):
        assert (workdir / "out" / f"{i}.txt").read_text().strip(), i
    assert "pilot-fakeb-" in json.dumps(run.summaries()[-1])
    # The run's pool ends with the run: its pilots leave the queue.
    _wait(lambda: not _pilots(), 60, "the run's pilots to leave the queue")


def test_a_rule_no_pilot_can_run_fails_at_start(tmp_path: Path, slurm) -> None:
    workdir = tmp_path / "models"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(GPU_MODEL_SNAKEFILE)
    run = context_run(
        workdir,
        "--context-backend",
        "slurm",
        "--context-pilot-gpu-types",
        "fakea",
        "--context-pilot-memory",
        "1GB",
        timeout=120,
    )
    assert run.returncode != 0
    assert "Rule 'on_b' asks for gpu=1, gpu_model=fakeb, which no pilot of the pool" in run.output
    assert "Traceback" not in run.output
    assert not _pilots()


def test_pilots_refuse_connections_without_the_credentials(tmp_path: Path, pool) -> None:
    from snakemake_executor_context.cluster.connection import ClusterConnection
    from snakemake_executor_context.cluster.credentials import Credentials

    from .test_security import PROBE, _foreign, _probe

    scheduler_file = pool("--gpu-type", "fakea", "--min-pilots", "1", "--max-pilots", "1")
    target = ClusterConnection.attach(address=None, scheduler_file=scheduler_file, timeout=20)
    try:
        _wait(lambda: target.client.scheduler_info(n_workers=-1)["workers"], 90, "a pilot")
        workers = target.client.scheduler_info(n_workers=-1)["workers"]
        scheduler = target.client.scheduler.address
    finally:
        target.client.close()
    # The pilot's own ports (its server and its nanny), on the host it registered from.
    addresses = [*workers, *(w["nanny"] for w in workers.values())]
    assert all(a.startswith("tls://") for a in [scheduler, *addresses]), addresses
    own = Credentials.beside(scheduler_file)
    markers = tmp_path / "markers"
    markers.mkdir()
    for address in addresses:
        host, port = address.removeprefix("tls://").rsplit(":", 1)
        _probe(
            {
                "host": host,
                "ports": [int(port)],
                "http": [],
                "scheduler_port": int(scheduler.rsplit(":", 1)[1]),
                "scheduler_host": scheduler.removeprefix("tls://").rsplit(":", 1)[0],
                "modes": ["plain", "tls-no-cert", "foreign", "own"],
                "foreign": _foreign(tmp_path / host.replace(".", "-") / port),
                "own": {
                    "ca": str(own.ca_file),
                    "cert": str(own.cert_file),
                    "key": str(own.key_file),
                },
                "markers": str(markers),
            },
            [sys.executable, str(PROBE)],
        )
    made = {m for m in os.listdir(markers) if m.startswith("rpc-")}
    # With the cluster's credentials the probe runs code on each pilot port; nobody
    # without them does.
    ports = {a.rsplit(":", 1)[1] for a in addresses}
    assert {f"rpc-{p}-own" for p in ports} <= made, made
    assert not {m for m in made if not m.endswith("-own")}, made


def test_a_real_preemption_is_classified_preempted(tmp_path: Path, pool) -> None:
    # slurm-up.sh: PreemptType=preempt/partition_prio, PreemptMode=CANCEL, and the
    # partition 'urgent' of a higher tier than the pilots' 'debug'.
    scheduler_file = pool("--gpu-type", "fakea", "--min-pilots", "1", "--max-pilots", "1")
    victim = _wait(_pilots, 60, "a pilot")[0]["id"]
    _wait(
        lambda: any(r["registered"] for r in _pool_books(scheduler_file).get("records", [])),
        60,
        "the pilot to register",
    )
    urgent = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp_path / "urgent.out"),
            "-p",
            "urgent",
            "--gres=gpu:fakea:4",
            "-t",
            "1",
            "--wrap",
            "sleep 3",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:

        def preempted():
            records = _pool_books(scheduler_file).get("records", [])
            return [r for r in records if r["job_id"] == victim and r["batch_state"]]

        (record,) = _wait(preempted, 90, "the pool to read the preempted pilot's state")
    finally:
        subprocess.run(["scancel", urgent], capture_output=True)
    assert record["batch_state"] == "PREEMPTED", record
    assert _pool_books(scheduler_file)["account"]["preempted"] >= 1
