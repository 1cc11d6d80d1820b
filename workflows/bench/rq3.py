"""The paper's RQ3 (work done under preemption), side by side on the same servers,
with a synthetic context: a loader that takes ``--reload`` seconds and jobs of
``--job`` seconds that score ``--claims`` claims each (sleeps: the scheduling and the
losses are what is measured, not a model; the 2 cores here could not run 4 servers
of SmolLM2 fast enough to see anything but CPU contention).

Four runs on the embedded cluster with 4 servers, interleaved: full-context and
context-agnostic (``--context-tuning agnostic``: each job loads, the server drops the
context at its end), each without kills and with the preemption injector killing
one server (SIGKILL, seeded choice) every T = 3 x (reload + job) seconds, its
replacement after 1 s. Then loss detection: SIGKILL -> requeue (injector log against
the catalog's loss records) and SIGSTOP -> requeue (missed heartbeats).

    python workflows/bench/rq3.py [--jobs 48] [--reload 3] [--job 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
SNAKEFILE = """
from snakemake_executor_context import declare_context

declare_context(config, "model", "loader.py:load", seconds=float(config["reload"]))

rule all:
    input: expand("out/{i}.txt", i=range(int(config["count"])))

rule score:
    output: "out/{i}.txt"
    params: seconds=float(config["job"]), claims=int(config["claims"])
    resources: context="model", gpu=1
    script: "score.py"
"""
LOADER = """
import time

def load(seconds):
    time.sleep(seconds)
    return {"weights": True}
"""
SCRIPT = """
import time
from snakemake_executor_context import load_context, report_items

load_context(snakemake)
time.sleep(snakemake.params.seconds)
with open(snakemake.output[0], "w") as out:
    out.write(snakemake.wildcards.i + "\\n")
with open("writes.txt", "a") as log:
    log.write(snakemake.wildcards.i + "\\n")
report_items(snakemake.params.claims)
"""


def run(mode: str, kills: bool, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One run; claims/s, failures, duplicate writes, losses."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{mode}-{'kill' if kills else 'calm'}-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "loader.py").write_text(LOADER)
    (workdir / "score.py").write_text(SCRIPT)
    period = 3 * (args.reload + args.job)
    command = [
        str(BIN / "snakemake"),
        "--executor",
        "context",
        "--jobs",
        "8",
        "--context-servers",
        str(args.servers),
        "--retries",
        "0",
        "--config",
        f"count={args.jobs}",
        f"reload={args.reload}",
        f"job={args.job}",
        f"claims={args.claims}",
    ]
    if mode == "agnostic":
        command += ["--context-tuning", "agnostic"]
    injector = None
    if kills:
        injector = subprocess.Popen(
            [
                str(BIN / "snakemake-context"),
                "inject",
                "--scheduler-file",
                str(workdir / ".snakemake/context/cluster"),
                "--every",
                str(period),
                "--seed",
                str(args.seed),
                "--replace-after",
                "1",
                "--log",
                str(workdir / "inject.jsonl"),
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    started = time.perf_counter()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if injector is not None:
        injector.terminate()
        injector.wait()
    writes = (
        (workdir / "writes.txt").read_text().split() if (workdir / "writes.txt").exists() else []
    )
    log = workdir / "inject.jsonl"
    kill_log = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        losses = db.execute("select at, seconds_lost, jobs_lost from server_losses").fetchall()
        failed = db.execute("select count(*) from jobs where outcome != 'ok'").fetchone()[0]
    busy = [k for k in kill_log if k["busy"]]
    latency = [
        min((at - k["at"] for at, _, _ in losses if at >= k["at"]), default=None) for k in busy
    ]
    result = {
        "mode": mode,
        "kills": kills,
        "returncode": done.returncode,
        "wall": wall,
        "claims_per_s": args.jobs * args.claims / wall,
        "failed_jobs": failed,
        "outputs_ok": all(
            (workdir / f"out/{i}.txt").exists()
            and (workdir / f"out/{i}.txt").read_text() == f"{i}\n"
            for i in range(args.jobs)
        ),
        "duplicate_writes": len(writes) - len(set(writes)),
        "kills_injected": len(kill_log),
        "kills_busy": len(busy),
        "losses": len(losses),
        "seconds_lost": [round(s, 2) for _, s, _ in losses],
        "sigkill_to_requeue": [round(x, 3) for x in latency if x is not None],
    }
    if done.returncode != 0:
        result["tail"] = done.stdout[-2000:]
    if args.keep is not None:  # the catalog and the kills, for the simulator's replay
        kept = args.keep / f"{mode}-{'kill' if kills else 'calm'}"
        kept.mkdir(parents=True, exist_ok=True)
        with (
            sqlite3.connect(workdir / ".snakemake/context/catalog.db") as source,
            sqlite3.connect(kept / "catalog.db") as target,
        ):
            source.backup(target)
        if log.exists():
            shutil.copy(log, kept / "inject.jsonl")
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def sigstop_latency(args: argparse.Namespace, root: Path, samples: int) -> list[float]:
    """SIGSTOP a busy server, time until its loss is recorded (heartbeats missed)."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix="sigstop-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "loader.py").write_text(LOADER)
    (workdir / "score.py").write_text(SCRIPT)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "--executor",
            "context",
            "--jobs",
            "4",
            "--context-servers",
            "2",
            "--config",
            "count=400",
            "reload=0.5",
            "job=1",
            "claims=1",
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import psutil

    found: list[float] = []
    catalog = workdir / ".snakemake/context/catalog.db"
    try:
        time.sleep(15)
        for _ in range(samples):
            target = None
            for proc in psutil.process_iter():
                try:
                    if any("/logs/score/" in f.path for f in proc.open_files()):
                        target = proc
                        break
                except psutil.Error:
                    continue
            if target is None:
                time.sleep(0.5)
                continue
            with sqlite3.connect(catalog) as db:
                before = db.execute("select count(*) from server_losses").fetchone()[0]
            stopped = time.time()
            target.send_signal(signal.SIGSTOP)
            deadline = stopped + 90
            while time.time() < deadline:
                with sqlite3.connect(catalog) as db:
                    rows = db.execute("select at from server_losses order by id").fetchall()
                if len(rows) > before:
                    found.append(rows[-1][0] - stopped)
                    break
                time.sleep(0.5)
            try:
                target.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
            time.sleep(8)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return found


def p(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--reload", type=float, default=3.0)
    parser.add_argument("--job", type=float, default=2.0)
    parser.add_argument("--claims", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sigstops", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-results/rq3"))
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep each run's catalog and kills under DIR"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rq3-"))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results = []
    for kills in (False, True):
        for mode in ("full", "agnostic"):
            result = run(mode, kills, args, root)
            print(json.dumps(result), flush=True)
            results.append(result)
    stops = sigstop_latency(args, root, args.sigstops) if args.sigstops else []
    by = {(r["mode"], r["kills"]): r for r in results}
    kill_latency = [x for r in results for x in r["sigkill_to_requeue"]]
    lost = [x for r in results for x in r["seconds_lost"]]
    summary = {
        "load_average_end": os.getloadavg(),
        "period_s": 3 * (args.reload + args.job),
        "full_kept_fraction": by[("full", True)]["claims_per_s"]
        / by[("full", False)]["claims_per_s"],
        "agnostic_kept_fraction": by[("agnostic", True)]["claims_per_s"]
        / by[("agnostic", False)]["claims_per_s"],
        "full_over_agnostic_calm": by[("full", False)]["claims_per_s"]
        / by[("agnostic", False)]["claims_per_s"],
        "full_over_agnostic_kills": by[("full", True)]["claims_per_s"]
        / by[("agnostic", True)]["claims_per_s"],
        "seconds_lost_per_loss_median": statistics.median(lost) if lost else None,
        "sigkill_to_requeue_p50": p(kill_latency, 0.5),
        "sigkill_to_requeue_p95": p(kill_latency, 0.95),
        "sigstop_to_requeue": [round(x, 2) for x in stops],
        "sigstop_to_requeue_p95": p(stops, 0.95),
    }
    print(json.dumps(summary, indent=1))
    (args.out / "rq3.json").write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
