"""Contexts that span several processes (gangs): one rank per device in one
``torch.distributed`` group (gloo on these CPUs), whole or lost together; and the
simpler multi-device server (its devices handed to a loader, child processes).

Real rank processes, real collectives, the real `snakemake` command line on real
embedded clusters, a real SIGKILL of a rank. GPU paths (NCCL, ``cuda:<i>`` devices)
cannot run here: the device lists a GPU server would hand its loader are checked with
a faked NVML (there is no GPU to read), and the NCCL script's CPU mode runs in
tests/bench/test_gpu_tensor_parallel_script.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.cluster.plan import plan_servers
from snakemake_executor_context.contexts import make_declaration
from snakemake_executor_context.errors import ContextLoadError, GangBroken, RankError
from snakemake_executor_context.fleet.gpus import GpuInfo
from snakemake_executor_context.gang import GangOptions, RankLoss, start_gang
from snakemake_executor_context.gang.devices import device_list
from snakemake_executor_context.jobhooks import LoadRecord, call_loader
from tests.conftest import BIN, WORKFLOWS, context_run

GANG = WORKFLOWS / "gang"


@pytest.fixture
def gang_workflow(tmp_path: Path) -> Path:
    target = tmp_path / "gang"
    shutil.copytree(GANG, target)
    return target


def _toy(ranks: int, scale: float = 2.0):
    return make_declaration("toy", "loaders.py:load_toy", {"scale": scale}, GANG, ranks=ranks)


def _catalog(workdir: Path, query: str) -> list[tuple]:
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        return db.execute(query).fetchall()


# --------------------------------------------------------------------------------------
# The gang itself, in this process (as under another executor: the baseline).


@pytest.mark.slow
def test_a_gang_of_three_sums_across_its_ranks_and_a_rank_error_is_the_callers():
    record = LoadRecord()
    front = call_loader(_toy(3), record)
    gang = record.gang
    try:
        assert gang.world_size == 3 and gang.backend == "gloo"
        assert gang.devices == ["cpu", "cpu", "cpu"]
        assert len(set(gang.pids)) == 3 and os.getpid() not in gang.pids
        assert all(n > 0 for n in record.rank_bytes)
        # 2 * (1 + 2 + 3) * x: every rank took part in the all-reduce.
        assert front.total(1.0) == [12.0] * 4
        assert front.total(0.5) == [6.0] * 4
        ranks = front.where()
        assert [r[0] for r in ranks] == [0, 1, 2] and [r[1] for r in ranks] == gang.pids
        # An error on every rank leaves the gang whole: the caller gets rank 0's.
        with pytest.raises(RankError, match=r"rank 0 of 3 raised in missing\(\)"):
            gang.call("missing")
        assert gang.broken is None and front.total(1.0) == [12.0] * 4
    finally:
        gang.close()
    assert all(not psutil.pid_exists(pid) or _zombie(pid) for pid in gang.pids)


def test_a_rank_killed_while_idle_loses_the_gang_once_and_kills_the_others():
    lost: list[RankLoss] = []
    options = GangOptions(devices=("cpu", "cpu"), timeout=30, on_broken=lost.append)
    record = LoadRecord()
    front = call_loader(_toy(2), record, options)
    gang = record.gang
    victim, other = gang.pids[1], gang.pids[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 10
    while not lost and time.time() < deadline:
        time.sleep(0.05)
    assert len(lost) == 1, lost
    assert (lost[0].rank, lost[0].exit_code, lost[0].during) == (1, -signal.SIGKILL, "idle")
    with pytest.raises(GangBroken, match=r"rank 1 of 2 .* killed by SIGKILL"):
        front.total(1.0)
    assert not psutil.pid_exists(other) or _zombie(other)
    assert len(lost) == 1
    gang.close()


@pytest.mark.slow
def test_a_rank_that_raises_while_the_others_wait_tears_the_gang_down():
    """The others wait in an all-reduce the raising rank never joins: the gang is
    desynchronised, so it goes (the next user loads it again), not a hang."""
    record = LoadRecord()
    call_loader(_toy(2), record)
    gang = record.gang
    pids = gang.pids
    with pytest.raises(RankError, match=r"rank 1 of 2 raised in fail_on\(\)\. The other ranks"):
        gang.call("fail_on", 1)
    assert gang.broken is not None and gang.broken.startswith("torn down")
    assert all(_zombie(pid) or not psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(GangBroken):
        gang.call("total", 1.0)
    gang.close()


def test_a_gang_needs_a_device_per_rank_and_a_shard_loader():
    with pytest.raises(ContextLoadError, match=r"spans 3 ranks, one per device, .* has 1"):
        start_gang(_toy(3), 3, GangOptions(devices=("cpu",)))
    plain = make_declaration("toy", "loaders.py:load_split", {}, GANG, ranks=2)
    with pytest.raises(ContextLoadError, match="names no shard loader"):
        call_loader(plain, LoadRecord())


def test_a_shard_larger_than_its_devices_share_of_the_budget_is_refused():
    """Memory admission per shard: each rank's shard must fit its device's share of
    the server's budget (here a budget of 1 kB a device: the shards take megabytes)."""
    options = GangOptions(devices=("cpu", "cpu"), shard_budget=1000)
    refused = r"rank 0's shard takes [\d.]+ MB on cpu, more than the 1\.00 kB its device may"
    with pytest.raises(ContextLoadError, match=refused):
        start_gang(_toy(2), 2, options)


def test_a_gangs_ranks_identity_differs_from_one_process():
    one, three = _toy(1), _toy(3)
    assert one.identity != three.identity and three.ranks == 3
    assert (
        one.identity
        == make_declaration("toy", "loaders.py:load_toy", {"scale": 2.0}, GANG).identity
    )


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --------------------------------------------------------------------------------------
# Gangs on the embedded cluster, with the real command line.


@pytest.mark.slow
def test_a_gang_of_three_on_one_server_loads_once_per_rank_and_its_jobs_overlap(gang_workflow):
    """20 jobs, 4 slots, one server of 3 (stand-in) devices: one gang serves them all
    (the same 3 rank processes in every job), two jobs held at a barrier prove that
    jobs overlap, and the catalog records one placement of 3 ranks."""
    run = context_run(
        gang_workflow,
        *("--context-servers", "1", "--context-gpus-per-server", "3", "--context-slots", "4"),
        *("--config", "count=20", "barrier=2", "hold=0.1"),
    )
    run.check()
    outputs = [json.loads((gang_workflow / f"out/{i}.txt").read_text()) for i in range(20)]
    for i, out in enumerate(outputs):
        assert out["value"] == [12.0 * i] * 4, out
    gangs = {tuple(pid for _, pid, _ in out["where"]) for out in outputs}
    assert len(gangs) == 1 and len(next(iter(gangs))) == 3, gangs
    assert {out["server_pid"] for out in outputs} & set(next(iter(gangs))) == set()
    assert sorted((gang_workflow / "writes.txt").read_text().split()) == sorted(map(str, range(20)))
    placements = _catalog(gang_workflow, "select ranks, gang, load_seconds from placements")
    assert len(placements) == 1 and placements[0][0] == 3, placements
    members = json.loads(placements[0][1])["members"]
    assert [m["device"] for m in members] == ["cpu"] * 3
    assert [m["pid"] for m in members] == list(next(iter(gangs)))
    notes = _catalog(gang_workflow, "select text from events where kind = 'gang-formed'")
    assert notes == [
        ("toy: a gang of 3 ranks on cpu0 (cpu, cpu, cpu; gloo; node " + os.uname().nodename + ")",)
    ]


@pytest.mark.slow
def test_a_rank_killed_mid_job_loses_the_gang_and_the_job_reruns_on_a_new_one(gang_workflow):
    """SIGKILL of one rank while a job waits on the gang: no rank hangs (the others
    are killed at once), the server leaves, the job runs again on a new gang (its
    output written once, --retries 0), and the loss is charged once, to the crash
    budget (a SIGKILL nobody announced, as the OOM killer's)."""
    command = [
        str(BIN / "snakemake"),
        *("--executor", "context", "--jobs", "2", "--retries", "0"),
        *("--context-servers", "1", "--context-gpus-per-server", "2"),
        *("--config", "ranks=2", "count=3", "hold=3"),
    ]
    run = subprocess.Popen(
        command, cwd=gang_workflow, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        running = gang_workflow / "running"
        deadline = time.time() + 120
        while time.time() < deadline and not (running.exists() and list(running.iterdir())):
            time.sleep(0.1)
        (marker,) = list(running.iterdir())[:1]
        where = json.loads(marker.read_text())
        old = [pid for _, pid, _ in where]
        os.kill(old[1], signal.SIGKILL)
        output, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output
    for pid in old:
        assert not psutil.pid_exists(pid) or _zombie(pid), f"rank {pid} outlived its gang"
    for i in range(3):
        assert json.loads((gang_workflow / f"out/{i}.txt").read_text())["value"] == [6.0 * i] * 4
    assert sorted((gang_workflow / "writes.txt").read_text().split()) == ["0", "1", "2"]
    new = {
        tuple(
            pid for _, pid, _ in json.loads((gang_workflow / f"out/{i}.txt").read_text())["where"]
        )
        for i in range(3)
    }
    assert all(set(pids).isdisjoint(old) for pids in new), (new, old)
    losses = _catalog(gang_workflow, "select reason, jobs_lost from server_losses")
    assert len(losses) == 1, losses
    reason, lost = losses[0]
    assert reason.startswith("crash: drained (gang lost: rank 1 of 2 of context 'toy'"), reason
    assert "killed by SIGKILL" in reason and lost == 1
    ((key,),) = _catalog(gang_workflow, "select key from attempts where loss_id is not null")
    story = subprocess.run(
        [str(BIN / "snakemake-context"), "story", key],
        cwd=gang_workflow,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert story.returncode == 0, story.stderr
    assert "charged to the crash budget (1 of 2)" in story.stdout, story.stdout
    assert [line.split()[1] for line in story.stdout.splitlines()[1:]].count("placed") == 2


@pytest.mark.slow
def test_a_loader_gets_the_servers_devices_and_may_start_child_processes(gang_workflow):
    """A server of 2 (stand-in) devices hands its loader both ("cpu", "cpu"; a GPU
    server's "cuda:0", "cuda:1", checked below without a GPU), and a loader's
    multiprocessing pool works on a server (not daemonic)."""
    run = context_run(
        gang_workflow,
        *("--context-servers", "1", "--context-gpus-per-server", "2"),
        "split/0.json",
        "pool/0.txt",
    )
    run.check()
    split = json.loads((gang_workflow / "split/0.json").read_text())
    assert split["devices"] == ["cpu", "cpu"] and split["placed"] == ["cpu"]
    assert split["map"] == {"": "cpu"}  # accelerate's device map over what it was handed
    assert split["cuda_visible_devices"] == "" and split["shape"] == [1, 4, 64]
    text = (gang_workflow / "pool/0.txt").read_text().split()
    assert " ".join(text[:4]) == "[1, 2, 3, 4]"
    server, child = int(text[4]), int(text[5])
    assert child != server


def test_a_gpu_server_of_two_gpus_is_pinned_to_both_and_hands_cuda_devices():
    """What the embedded cluster plans for two GPUs per server (NVML faked: no GPU
    here), and the devices such a server hands its loaders."""
    gpus = [
        GpuInfo(index=i, uuid=f"GPU-{i}", name="NVIDIA H200", memory_bytes=140_000_000_000)
        for i in range(5)
    ]
    plans = plan_servers(gpus, None, 64_000_000_000, 16, gpus_per_server=2)
    assert [p.name for p in plans] == ["gpu0-1", "gpu2-3"]  # the fifth GPU is left over
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["GPU-0,GPU-1", "GPU-2,GPU-3"]
    assert all(p.resources["gpu"] == 2 and p.resources["gpu_model:h200"] == 2 for p in plans)
    assert all(p.devices == 2 and p.memory_bytes == 32_000_000_000 for p in plans)
    assert device_list(2) == ["cuda:0", "cuda:1"] and device_list(0, 3) == ["cpu"] * 3
    cpu = plan_servers([], 2, 24_000_000_000, 2, gpus_per_server=3)
    assert [p.resources["gpu"] for p in cpu] == [3, 3] and all(p.devices == 3 for p in cpu)


@pytest.mark.slow
def test_a_rule_that_asks_more_gpus_than_any_server_has_fails_at_start(gang_workflow):
    run = context_run(gang_workflow, "--context-servers", "2", "split/0.json")
    assert run.returncode != 0
    line = (
        "Rule 'split' asks for gpu=2, which no server of the embedded cluster offers "
        "(servers: cpu0 (gpu=1"
    )
    assert line in run.output, run.output
    assert "--context-gpus-per-server 2" in run.output
    assert "Traceback (most recent call last)" not in run.output


@pytest.mark.slow
def test_a_gang_rule_must_ask_for_a_gpu_per_rank(gang_workflow):
    run = context_run(gang_workflow, "--context-servers", "1", "--config", "gpu=1")
    assert run.returncode != 0
    assert (
        "Rule 'work' uses context 'toy', which spans 3 ranks (one process per device), but "
        "asks for gpu=1. Fix: give the rule gpu=3" in run.output
    ), run.output


@pytest.mark.slow
def test_a_persistent_cluster_of_two_device_servers_keeps_its_gang_and_status_shows_it(
    gang_workflow, tmp_path
):
    """`up --gpus-per-server 2`: a run's gang stays loaded after the run, the next run
    finds it warm (no second load), and `status` lists it with its ranks."""
    from tests.conftest import persistent_cluster

    with persistent_cluster(tmp_path / "cluster", "--servers", "1", "--gpus-per-server", "2") as sf:
        attached = ("--context-scheduler-file", str(sf), "--config", "ranks=2")
        context_run(gang_workflow, *attached, "count=2").check()
        first = json.loads((gang_workflow / "out/0.txt").read_text())["where"]
        context_run(gang_workflow, *attached, "count=4").check()
        later = json.loads((gang_workflow / "out/3.txt").read_text())["where"]
        assert [pid for _, pid, _ in later] == [pid for _, pid, _ in first]
        status = subprocess.run(
            [str(BIN / "snakemake-context"), "status", "--scheduler-file", str(sf)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert status.returncode == 0, status.stderr
    assert "Gangs (contexts spanning several processes, one rank per device):" in status.stdout
    line = next(line for line in status.stdout.splitlines() if line.startswith("  toy on "))
    assert "2 ranks (ready, gloo) on cpu, cpu" in line, line
    assert all(str(pid) in line for _, pid, _ in first), line


def test_the_monitor_shows_a_gangs_ranks_after_its_name():
    from snakemake_context_monitor.rows import PlacementRow
    from snakemake_context_monitor.views.contexts import _cells

    row = PlacementRow(
        context="smollm2-long-name",
        identity="x",
        server="gpu0-2",
        address="tls://a:1",
        gpu_model="h200",
        state="ready",
        load_seconds=4.0,
        from_cache=False,
        loads=1,
        evictions=0,
        jobs_warm=3,
        ranks=3,
    )
    assert _cells(row)[0] == "smollm2-… x3"


# --------------------------------------------------------------------------------------
# Servers that span nodes: the roster and placement, as pure code.


def test_the_roster_groups_candidates_of_one_kind_and_size_leader_first_by_name():
    from snakemake_executor_context.cluster.roster import Candidate, whole_groups

    def c(name, kind="a", size=2):
        return Candidate(
            address=f"tls://{name}", name=name, node=f"n-{name}", devices=1, size=size, kind=kind
        )

    groups, left = whole_groups([c("p-3"), c("q-0", kind="b"), c("p-1"), c("p-2")])
    assert [[m.name for m in g] for g in groups] == [["p-1", "p-3"]]
    assert sorted(m.name for m in left) == ["p-2", "q-0"]


def test_a_server_of_two_nodes_offers_both_gpus_and_placement_prefers_one_node():
    from snakemake_executor_context.fleet import events as ev
    from snakemake_executor_context.fleet.placement import choose_server
    from snakemake_executor_context.fleet.resources import Requirements, job_resources
    from snakemake_executor_context.fleet.state import FleetState

    view = FleetState()
    for name in ("lead", "member", "single"):
        gpus = 2 if name == "single" else 1
        view.add_server(f"tls://{name}", name=name, resources={"gpu": gpus}, slots=1)
    view.apply(
        ev.GangAssembled(
            leader="tls://lead", members=["tls://member"], nodes=["n1", "n2"], devices=[1, 1]
        )
    )
    two = job_resources(Requirements(gpu=2))
    assert sorted(view.runnable(two)) == ["tls://lead", "tls://single"]
    assert view.servers["tls://lead"].nodes == 2
    # One node has the two GPUs: never across nodes, even while it is busy.
    first = choose_server(view, two, "ctx", now=1.0, prefetch=0)
    assert first.address == "tls://single"
    view.dispatched("j1", "tls://single", "ctx", at=1.0)
    assert choose_server(view, two, "ctx", now=1.0, prefetch=0).address is None
    view.remove_server("tls://single")
    assert choose_server(view, two, "ctx", now=2.0, prefetch=0).address == "tls://lead"
    # The member runs nothing of its own, not even a plain job.
    assert "tls://member" not in view.runnable({})
    wire = FleetState()
    wire.load_wire(view.to_wire())
    assert wire.servers["tls://member"].member_of == "tls://lead"
