"""Snakemake across the bed's nodes (:mod:`tests.nodes.bed`): nodes that join a cluster
by one command, a partition during a job, and a node lost whole; the real
``snakemake`` on the host (the login node), its workflow in the shared directory."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from tests.conftest import snakemake, toy_files
from tests.nodes.cluster import joined_cluster

#: A job that notes where it began, waits while the hold file exists (a job still
#: running when the fault comes), then writes where it ran and which load it used.
NODE_SCRIPT = """
import json, os, socket, time
from pathlib import Path
from snakemake_executor_context import load_context

obj = load_context(snakemake)
me = f"{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}"
marks = Path("marks")
marks.mkdir(exist_ok=True)
(marks / f"{snakemake.wildcards.i}.{me}.began").write_text("")
hold = Path(snakemake.params.hold)
while hold.exists():
    time.sleep(0.1)
with open(snakemake.output[0], "w") as f:
    json.dump({"host": socket.gethostname(), "load": obj["pid"], "attempt": me}, f)
(marks / f"{snakemake.wildcards.i}.{me}.wrote").write_text("")
"""

RULES = """
rule all:
    input: expand("out/{i}.json", i=range(int(config.get("jobs", 6))))

rule use:
    output: "out/{i}.json"
    params: hold=config.get("hold", "no-hold")
    resources: context="toy"
    script: "scripts/node.py"
"""


def _workflow(shared: Path) -> Path:
    workdir = shared / "wf"
    for relative, content in toy_files(RULES, {"scripts/node.py": NODE_SCRIPT}).items():
        path = workdir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return workdir


def _run(bed, scheduler_file: Path, workdir: Path, *args: str, timeout: float = 240):
    return snakemake(
        workdir,
        "--executor", "context", "--context-scheduler-file", str(scheduler_file),
        "--jobs", "6", *args,
        timeout=timeout, env=bed.environment(),
    )  # fmt: skip


def _outputs(workdir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((workdir / "out").glob("*.json"))}


def _catalog(scheduler_file: Path, query: str) -> list[tuple]:
    with sqlite3.connect(scheduler_file.with_suffix(".db")) as db:
        return db.execute(query).fetchall()


def test_a_workflow_on_three_joined_nodes_runs_on_each_with_one_load_per_node(bed) -> None:
    nodes = bed(3)
    with joined_cluster(nodes) as cluster:
        lines = [cluster.join(node, "--servers", "1") for node in nodes.nodes]
        assert [line.split()[0] for line in lines] == ["node0", "node1", "node2"]
        cluster.wait_for({"node0-cpu0", "node1-cpu0", "node2-cpu0"})
        workdir = _workflow(nodes.shared)
        _run(nodes, cluster.scheduler_file, workdir, "--config", "jobs=9").check()
        first = _outputs(workdir)
        assert len(first) == 9
        hosts = {o["host"] for o in first.values()}
        assert hosts == {"node0", "node1", "node2"}, first
        # One load per node: every job of a node used its server's one loaded context.
        loads = {o["host"]: set() for o in first.values()}
        for o in first.values():
            loads[o["host"]].add(o["load"])
        assert all(len(pids) == 1 for pids in loads.values()), loads
        # The catalog records each server with its node.
        servers = dict(_catalog(cluster.scheduler_file, "SELECT name, host FROM servers"))
        assert servers == {f"node{i}-cpu0": f"node{i}" for i in range(3)}
        # A second run is warm: the same three loads, nothing loaded again.
        (workdir / "out").rename(workdir / "first")
        _run(nodes, cluster.scheduler_file, workdir, "--config", "jobs=9").check()
        second = _outputs(workdir)
        assert {o["load"] for o in second.values()} <= {o["load"] for o in first.values()}
        assert _catalog(cluster.scheduler_file, "SELECT count(*) FROM placements") == [(3,)]
        # Node-local state stays on its node with $HOME shared: each node's private
        # root (scratch, sockets, zygotes; its model cache too) in its own /tmp, none in $HOME.
        for node in nodes.nodes:
            root = node.run(["ls", "/tmp/snakemake-context-0"]).stdout.split()
            assert "dask-scratch-space" in root, (node.hostname, root)
        assert not (nodes.home / ".cache" / "snakemake-context").exists()
        status = cluster.status()
        assert {row["host"] for row in status["nodes"]} == {"node0", "node1", "node2"}
        # SIGTERM drains a node's join: it leaves, and the catalog records it as left.
        said = cluster.leave(nodes.nodes[2])
        assert "left the cluster" in said, said
        cluster.wait_for({"node0-cpu0", "node1-cpu0"})
        query = "SELECT name FROM servers WHERE left IS NOT NULL"
        deadline = time.monotonic() + 30
        while (
            left := _catalog(cluster.scheduler_file, query)
        ) == [] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [("node2-cpu0",)]
        losses = _catalog(cluster.scheduler_file, "SELECT count(*) FROM server_losses")
        assert losses == [(0,)]  # drained: it left, it was not lost


def _marks(workdir: Path, kind: str) -> list[str]:
    """The hosts of the attempts that left a mark of ``kind`` ('began', 'wrote')."""
    return sorted(p.name.split(".")[1].split("-")[0] for p in (workdir / "marks").glob(f"*.{kind}"))


def _wait(what, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)
    return found


def _start_held_job(nodes, cluster, **env: str):
    """Every node joined (one server each, ``env`` in its join's environment), then one
    held job; (the run, its workdir, the hold file, the node it began on, the other)."""
    import subprocess

    from tests.conftest import BIN

    for node in nodes.nodes:
        cluster.join(node, "--servers", "1", **env)
    cluster.wait_for({f"{node.hostname}-cpu0" for node in nodes.nodes})
    workdir = _workflow(nodes.shared)
    hold = workdir / "hold"
    hold.write_text("")
    run = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--context-scheduler-file",
         str(cluster.scheduler_file), "--jobs", "2", "--config", "jobs=1", f"hold={hold}"],
        cwd=workdir, env={**nodes.environment(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    cluster.runs.append(run)
    (host,) = _wait(lambda: (workdir / "marks").is_dir() and _marks(workdir, "began"), 120)
    victim = next(node for node in nodes.nodes if node.hostname == host)
    (other,) = [node for node in nodes.nodes if node is not victim]
    return run, workdir, hold, victim, other


def test_a_partition_during_a_job_reruns_it_elsewhere_after_its_lease(bed) -> None:
    nodes = bed(2)
    with joined_cluster(nodes) as cluster:
        run, workdir, hold, victim, other = _start_held_job(nodes, cluster)
        partitioned, partitioned_at = time.monotonic(), time.time()
        nodes.partition(victim)
        # The rerun begins on the other node, once the victim's lease has run out.
        _wait(lambda: other.hostname in _marks(workdir, "began"), 150)
        rerun_at = time.monotonic() - partitioned
        # Released now: a job the partitioned server still ran would write beside the
        # rerun; its lease stopped it first.
        hold.unlink()
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output
        time.sleep(2)
        assert _marks(workdir, "wrote") == [other.hostname], output
        assert _outputs(workdir)["0"]["host"] == other.hostname
        assert rerun_at > 30, rerun_at  # not before the victim's 30 s lease
        # Its server stopped the job when its connection to the scheduler timed out
        # (Dask's 30 s TCP timeout, within the 30 s lease), and is restarted.
        said = "".join(cluster.said[victim.index])
        assert f"server {victim.hostname}-cpu0 lost its scheduler" in said, said
        # The catalog: one ok attempt, a loss that names the lost heartbeat (not a
        # crash), and the job's crash budget untouched.
        db = cluster.scheduler_file
        outcomes = _catalog(db, "SELECT outcome FROM attempts ORDER BY id")
        assert [o for (o,) in outcomes].count("ok") == 1, outcomes
        reasons = _catalog(db, "SELECT reason FROM server_losses")
        ((lost_at,),) = _catalog(db, "SELECT at FROM server_losses")
        print(
            f"partition timeline: loss recorded at {lost_at - partitioned_at:.1f} s, "
            f"rerun began at {rerun_at:.1f} s"
        )
        assert len(reasons) == 1 and "heartbeat" in reasons[0][0], reasons
        assert "crash" not in reasons[0][0]
        # After the heal the node serves again.
        nodes.heal(victim)
        healed = time.monotonic()
        cluster.wait_for({"node0-cpu0", "node1-cpu0"}, timeout=120)
        back = time.monotonic() - healed
        print(f"partition timeline: the node served again {back:.1f} s after the heal")
        workdir2 = workdir.parent / "again"
        workdir.rename(workdir2)
        again = _workflow(nodes.shared)
        _run(nodes, cluster.scheduler_file, again, "--config", "jobs=6").check()
        assert {o["host"] for o in _outputs(again).values()} == {"node0", "node1"}


def test_a_node_lost_whole_has_its_job_rerun_as_a_preemption(bed) -> None:
    nodes = bed(2)
    with joined_cluster(nodes) as cluster:
        run, workdir, hold, victim, other = _start_held_job(nodes, cluster)
        killed = nodes.lose(victim)
        assert len(killed) >= 3  # its holder, its join, its server (and its zygote)
        assert victim.pids() == []  # nothing of it is left on the bed
        _wait(lambda: other.hostname in _marks(workdir, "began"), 150)
        hold.unlink()
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output
        assert _marks(workdir, "wrote") == [other.hostname], output
        assert "preemption" in output and f"{victim.hostname}-cpu0 lost" in output, output
        db = cluster.scheduler_file
        outcomes = [o for (o,) in _catalog(db, "SELECT outcome FROM attempts")]
        assert outcomes.count("ok") == 1, outcomes
        ((reason,),) = _catalog(db, "SELECT reason FROM server_losses")
        assert "crash" not in reason, reason
        cluster.wait_for({other.hostname + "-cpu0"})


def test_join_says_in_one_line_why_it_cannot_join(bed, tmp_path) -> None:
    import shutil
    import subprocess

    from tests.nodes.cluster import COMMAND

    nodes = bed(1)
    (node,) = nodes.nodes
    env = nodes.environment()
    join = [COMMAND, "join", "--timeout", "3", "--scheduler-file"]
    missing = node.run([*join, str(nodes.shared / "none.json")], env=env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr
    # A scheduler on the host's loopback: not reachable from another node.
    local = tmp_path / "local"
    started = subprocess.run(
        [COMMAND, "up", "--scheduler-file", str(local / "s.json"), "--servers", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        shared = nodes.shared / "copy"
        shutil.copytree(local, shared)
        unreachable = node.run([*join, str(shared / "s.json")], env=env)
        lines = unreachable.stderr.strip().splitlines()
        assert unreachable.returncode == 1 and len(lines) == 1, unreachable.stderr
        assert "127.0.0.1" in lines[0] and "--interface" in lines[0], lines
    finally:
        subprocess.run([COMMAND, "down", "--scheduler-file", str(local / "s.json")], timeout=60)
    with joined_cluster(nodes) as cluster:
        foreign = nodes.shared / "foreign"
        shutil.copytree(cluster.scheduler_file.parent, foreign)
        shutil.rmtree(foreign / "scheduler.tls")
        shutil.copytree(nodes.shared / "copy" / "s.tls", foreign / "scheduler.tls")
        wrong = node.run([*join, str(foreign / "scheduler.json")], env=env)
        assert wrong.returncode == 1 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
        assert "credentials" in wrong.stderr, wrong.stderr


def test_sigterm_to_a_join_drains_its_node_and_its_job_reruns_elsewhere(bed) -> None:
    nodes = bed(2)
    with joined_cluster(nodes) as cluster:
        run, workdir, hold, victim, other = _start_held_job(nodes, cluster)
        # SIGTERM to the join's own process only, as a resource manager's eviction.
        said = cluster.leave(victim, timeout=90)
        assert "draining 1 server(s)" in said and "left the cluster" in said, said
        assert victim.pids() == [victim.holder.pid]  # nothing of the join is left
        _wait(lambda: other.hostname in _marks(workdir, "began"), 120)
        hold.unlink()
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output
        assert _marks(workdir, "wrote") == [other.hostname], output
        ((reason,),) = _catalog(cluster.scheduler_file, "SELECT reason FROM server_losses")
        assert "drained" in reason and "SIGTERM" in reason, reason


def test_a_partitioned_server_stops_its_job_at_its_lease_whatever_tcps_timeout(bed) -> None:
    """Dask's TCP timeout (30 s) closed the partitioned server's connection at its
    lease in the partition test above; with a longer one (as a site may set), the
    connection stays open, unanswered, and only the lease stops the job."""
    nodes = bed(2)
    with joined_cluster(nodes) as cluster:
        longer = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "600s"}
        run, workdir, hold, victim, other = _start_held_job(nodes, cluster, **longer)
        nodes.partition(victim)
        _wait(lambda: other.hostname in _marks(workdir, "began"), 150)
        hold.unlink()
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output
        time.sleep(3)  # a job the partitioned server still ran writes now
        assert _marks(workdir, "wrote") == [other.hostname], output
        said = "".join(cluster.said[victim.index])
        assert "stopping 1 job(s): its scheduler answered no heartbeat for 30 s" in said, said
