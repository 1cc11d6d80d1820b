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
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batchpools import SLURM_GPU_MODELS, pilot_pool, slurm_pilots, wait
from tests.batchpools import pool_books as _pool_books
from tests.conftest import BIN, REPO, WORKFLOWS, context_run

pytestmark = pytest.mark.slow


@pytest.fixture
def pool(tmp_path: Path, slurm) -> Iterator:
    """Start `snakemake-context up --backend slurm ...` with given options; stopped after."""
    yield from pilot_pool(tmp_path, "slurm", (), slurm_pilots, 30)


def test_gpu_model_rules_run_only_on_pilots_of_their_type(tmp_path: Path, pool) -> None:
    scheduler_file = pool(
        "--gpu-type", "fakea", "--gpu-type", "fakeb", "--min-pilots", "2", "--max-pilots", "2"
    )
    pilots = wait(lambda: len(slurm_pilots()) == 2 and slurm_pilots(), 60, "two pilots")
    gres = {job["id"]: job["gres"] for job in pilots}
    assert sorted(g.split(":")[-2] for g in gres.values()) == ["fakea", "fakeb"], gres
    workdir = tmp_path / "models"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(SLURM_GPU_MODELS)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--context-tuning",
        "wait_for_server=60",
        timeout=240,
    ).check()
    for kind in ("a", "b"):
        for i in range(2):
            job_id = (workdir / "out" / f"{kind}-{i}.txt").read_text().split()[-1]
            assert gres[job_id].split(":")[-2] == f"fake{kind}", (kind, gres)


def test_a_run_with_a_backend_submits_its_own_pilots(tmp_path: Path, slurm) -> None:
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    run = context_run(
        workdir,
        "--context-pilots",
        "backend=slurm",
        "gpu_type=fakeb",
        "memory=1GB",
        "max=2",
        "walltime=00:10:00",
        "--config",
        "count=6",
        "sleep=0.2",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=240,
    ).check()
    for i in range(6):
        assert (workdir / "out" / f"{i}.txt").read_text().strip(), i
    assert "pilot-fakeb-" in json.dumps(run.summaries()[-1])
    # SLURM's reading of the walltime, in the run's output.
    assert (
        "Pilots' walltime (--context-pilots walltime): SLURM reads '00:10:00' as HH:MM:SS: "
        "00:10:00 (10 min)" in run.output
    ), run.output
    # The run's pool ends with the run: its pilots leave the queue.
    wait(lambda: not slurm_pilots(), 60, "the run's pilots to leave the queue")


def test_pilots_refuse_connections_without_the_credentials(tmp_path: Path, pool) -> None:
    from snakemake_executor_context.cluster.connection import ClusterConnection
    from snakemake_executor_context.cluster.credentials import Credentials
    from tests.cluster.test_security import PROBE, _foreign, _probe

    scheduler_file = pool("--gpu-type", "fakea", "--min-pilots", "1", "--max-pilots", "1")
    target = ClusterConnection.attach(address=None, scheduler_file=scheduler_file, timeout=20)
    try:
        wait(lambda: target.client.scheduler_info(n_workers=-1)["workers"], 90, "a pilot")
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
    victim = wait(slurm_pilots, 60, "a pilot")[0]["id"]
    wait(
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

        (record,) = wait(preempted, 90, "the pool to read the preempted pilot's state")
    finally:
        subprocess.run(["scancel", urgent], capture_output=True)
    assert record["batch_state"] == "PREEMPTED", record
    assert _pool_books(scheduler_file)["account"]["preempted"] >= 1


#: Walltimes in each of SLURM's forms (and one refused), as sbatch --time gets them.
WALLTIMES = ["4", "04:00", "0:59", "1:30:00", "00:01:10", "2-0", "1-02:30", "1-02:03:04", "99:99"]


def test_walltimes_are_read_as_slurm_reads_them(tmp_path: Path, slurm) -> None:
    """Each form's reading (and the reading a refusal states) is the time limit
    ``scontrol show job`` shows for a job submitted with that --time."""
    import re

    from snakemake_executor_context.pilots.batch.walltime import (
        WalltimeError,
        read_walltime,
        slurm_time,
    )

    for text in WALLTIMES:
        job = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-o", "/dev/null", f"--time={text}", "--wrap=true"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            shown = subprocess.run(
                ["scontrol", "show", "job", job], capture_output=True, text=True, check=True
            ).stdout
        finally:
            subprocess.run(["scancel", job], capture_output=True)
        limit = re.search(r"TimeLimit=(\S+)", shown)
        assert limit, shown
        try:
            ours = slurm_time(read_walltime("slurm", text).seconds)
        except WalltimeError as refused:
            assert text == "99:99"
            assert f"SLURM reads it as MM:SS, {limit.group(1)} " in str(refused), refused
            continue
        assert ours == limit.group(1), (text, ours, shown)


NO_GPU_TYPE_SNAKEFILE = """
rule all:
    input: "out.txt"

rule needs_gpu:
    output: "out.txt"
    resources: gpu=1
    shell: "touch {output}"
"""


def test_a_rule_no_registered_pilot_can_run_fails_in_one_line(tmp_path: Path, slurm) -> None:
    """A pilot without a GPU type on a node NVML sees no GPU of advertises gpu=0: once
    it registers, the gpu=1 rule fails naming the rule and what the pilots offer,
    instead of waiting for a pilot that can never come."""
    workdir = tmp_path / "nogpu"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(NO_GPU_TYPE_SNAKEFILE)
    run = context_run(
        workdir,
        "--context-pilots",
        "backend=slurm",
        "memory=1GB",
        "--context-plain-jobs",
        "servers",
        timeout=240,
    )
    assert run.returncode != 0, run.output
    (line,) = [
        line for line in run.output.splitlines() if "which no pilot of the pool can run" in line
    ]
    assert "Rule 'needs_gpu' asks for gpu=1" in line, line
    assert "registered offering gpu=0" in line, line
    assert "Traceback" not in run.output
    wait(lambda: not slurm_pilots(), 60, "the run's pilots to leave the queue")
    # How long after the pilot registered the job failed (the catalog's times).
    import sqlite3

    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        joined = db.execute("select min(joined) from servers").fetchone()[0]
        failed = db.execute("select max(finished) from jobs").fetchone()[0]
    print(f"failed {failed - joined:.1f} s after the pilot registered (fleet checks: 2 s)")


def test_sigterm_ends_a_run_waiting_for_pilots(tmp_path: Path, slurm) -> None:
    """Pilots that stay pending (held until tomorrow): SIGTERM ends the run, as
    SIGINT does, and its pilots leave the queue."""
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            *("--executor", "context", "--jobs", "2", "--context-pilots", "backend=slurm"),
            *("memory=1GB", "gpu_type=fakea", "directive=--begin=now+1day"),
            *("--config", "count=2", "sleep=0.2"),
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait(lambda: slurm_pilots() or process.poll() is not None, 90, "a pending pilot")
        assert process.poll() is None, process.communicate()[0]
        time.sleep(3)  # the run is waiting for the pilot now
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode != 0, output
    assert "not started: Snakemake was asked to stop (SIGTERM)" in output, output
    assert "Traceback" not in output, output
    wait(lambda: not slurm_pilots(), 60, "the run's pilots to leave the queue")


def test_a_pilot_that_joins_mid_run_warms_from_an_earlier_pilot(tmp_path: Path, pool) -> None:
    """Pilots with caches of their own (as on different nodes): the first reads the
    context's source, the one the run's demand adds fetches the template from it."""
    caches, log = tmp_path / "caches", tmp_path / "source.log"
    scheduler_file = pool(
        "--gpu-type", "fakea", "--min-pilots", "1", "--max-pilots", "2", "--own-caches", str(caches)
    )
    wait(slurm_pilots, 60, "a pilot in the queue")
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "peers", workdir)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--config",
        "count=16",
        "sleep=2",
        "megabytes=16",
        f"source_log={log}",
        timeout=300,
    ).check()
    assert len(log.read_text().splitlines()) == 1  # the source, read by the first pilot
    with sqlite3.connect(scheduler_file.with_suffix(".db")) as db:
        transfers = db.execute(
            "select s.name, p.name, t.outcome, t.bytes from transfers t "
            "join servers s on s.id = t.server_id join servers p on p.id = t.peer_server_id"
        ).fetchall()
    assert transfers and all(outcome == "ok" for _, _, outcome, _ in transfers), transfers
    assert all(to.startswith("pilot-fakea-") and to != peer for to, peer, _, _ in transfers)
    assert len(list(caches.glob("pilot-fakea-*/peers-1-16"))) == 1 + len(transfers)


def test_two_pilots_on_two_nodes_form_one_server_and_run_a_two_rank_job(
    tmp_path: Path, pool
) -> None:
    """Pilots started as one server of 2 nodes (--pilot-nodes 2; each says it is on a
    node of its own, as pilots on different nodes would): the second serves the first,
    whose gang puts one rank on each pilot; the synthetic tensor-parallel Llama split
    over them scores as unsplit, and the catalog records both nodes."""
    scheduler_file = pool(
        *("--gpu-type", "fakea", "--pilot-nodes", "2", "--min-pilots", "2", "--max-pilots", "2"),
        "--prologue",
        "export SNAKEMAKE_CONTEXT_NODE=node-$SLURM_JOB_ID",
    )
    wait(lambda: len(slurm_pilots()) == 2, 60, "two pilots in the queue")
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "gang", workdir)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "synthetic/0.json",
        "synthetic/1.json",
        *("--config", "ranks=2", f"llm={REPO / 'workflows/llm'}"),
        timeout=300,
    ).check()
    outputs = [json.loads((workdir / f"synthetic/{i}.json").read_text()) for i in range(2)]
    for out in outputs:
        assert out["world_size"] == 2 and out["max_abs_diff"] < 1e-5, out
        assert len(set(out["nodes"])) == 2 and all(n.startswith("node-") for n in out["nodes"])
    with sqlite3.connect(scheduler_file.with_suffix(".db")) as db:
        (gang,) = db.execute("select gang from placements where ranks = 2").fetchall()
        notes = db.execute("select text from events where kind = 'gang-assembled'").fetchall()
    members = json.loads(gang[0])["members"]
    assert len({m["node"] for m in members}) == 2, members
    assert len(notes) == 1 and "one server of 2 nodes" in notes[0][0], notes


STAGED_LOADER = """
import json, os, time

def load(path, log, build_seconds=8.0):
    began = time.time()
    assert os.path.isfile(os.path.join(path, "weights.bin"))  # the staged copy
    time.sleep(build_seconds)  # state creation: after the read, outside the turn
    with open(log, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "began": began, "ended": time.time()}) + "\\n")
    return {"path": path}
"""
STAGED_SNAKEFILE = """
from snakemake_executor_context import declare_context

declare_context(config, "staged", "loader.py:load", path=config["model"], log=config["log"],
                stage="path")

rule all:
    input: expand("out/{i}.txt", i=range(8))

rule use:
    output: "out/{i}.txt"
    resources: context="staged"
    script: "use.py"
"""
STAGED_SCRIPT = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(2)
open(snakemake.output[0], "w").write(snakemake.wildcards.i)
"""


def test_two_cold_pilots_take_their_turns_for_the_read_only(
    tmp_path: Path, pool, monkeypatch
) -> None:
    """One load at a time from the source (--loads-per-source 1), pilots with caches
    of their own and no peers: both read the source, one after the other (16 MB at
    the cap of 8 MB/s: 2 s each), and the second's build starts while the first's
    build (8 s) still runs: the turn covered the read, not the load."""
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_SOURCE_MBPS", "8")  # the pilots' scripts export it
    source = tmp_path / "shared-model"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(16 << 20))
    caches, log = tmp_path / "caches", tmp_path / "loads.jsonl"
    scheduler_file = pool(
        "--gpu-type",
        "fakea",
        "--min-pilots",
        "2",
        "--max-pilots",
        "2",
        "--own-caches",
        str(caches),
        "--loads-per-source",
        "1",
        "--peer-transfers",
        "0",
    )
    wait(
        lambda: [p for p in slurm_pilots() if p["state"] == "RUNNING"][1:], 90, "two running pilots"
    )
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(STAGED_SNAKEFILE)
    (workdir / "loader.py").write_text(STAGED_LOADER)
    (workdir / "use.py").write_text(STAGED_SCRIPT)
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--config",
        f"model={source}",
        f"log={log}",
        timeout=300,
    ).check()
    loads = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(loads) == 2 and loads[0]["pid"] != loads[1]["pid"], (loads, run.output)
    first, second = sorted(loads, key=lambda load: load["began"])
    assert second["began"] < first["ended"], loads  # the builds overlapped
    assert len(list(caches.glob("pilot-fakea-*/staged-shared-model-*"))) == 2
    with sqlite3.connect(scheduler_file.with_suffix(".db")) as db:
        spans = db.execute(
            "select loading_at, ready_at, peer_seconds from placements order by loading_at"
        ).fetchall()
    assert len(spans) == 2 and all(peer is None for *_, peer in spans), spans
    assert spans[1][0] < spans[0][1], spans  # the catalog's load records overlap too
