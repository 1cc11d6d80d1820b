"""Survival placement on a real run: the embedded cluster's servers in two groups, the
preemption injector killing each group at its own rate, policy on against off.

Four servers (``--context-tuning server_group=short:2,long:2``) and a synthetic context (a
loader that sleeps ``--reload`` seconds, jobs that sleep ``--job`` seconds and score
``--claims`` claims: the scheduling and the losses are measured, not a model; the 2
cores here cannot run four servers of SmolLM2). Two injectors (``snakemake-context
inject --group``): one kills a 'short' server every ``--short-every`` seconds, one a
'long' server every ``--long-every``; a killed server is back after 1 s, cold.

A first run (policy off) fills a catalog with both groups' lives; every measured run
starts from a copy of it (the history a user's catalog would hold), interleaved off,
on, on, off. Printed side by side: claims per second, jobs lost, the job-seconds and
load-seconds lost with the killed servers, and the loads.

    python workflows/bench/survival_run.py [--jobs 60] [--reload 3] [--job 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The same synthetic workflow as the RQ3 bench (a sleeping loader, sleeping jobs).
from rq3 import LOADER, SCRIPT, SNAKEFILE  # noqa: E402

CATALOG = Path(".snakemake/context/catalog.db")


def _injector(workdir: Path, group: str, every: float, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(BIN / "snakemake-context"),
            "inject",
            "--scheduler-file",
            str(workdir / ".snakemake/context/cluster"),
            "--group",
            group,
            "--every",
            str(every),
            "--seed",
            str(seed),
            "--replace-after",
            "1",
            "--log",
            str(workdir / f"inject-{group}.jsonl"),
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run(policy: bool, args: argparse.Namespace, root: Path, history: Path | None) -> dict[str, Any]:
    """One run on a fresh workdir (its catalog a copy of ``history``)."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{'on' if policy else 'off'}-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "loader.py").write_text(LOADER)
    (workdir / "score.py").write_text(SCRIPT)
    catalog = workdir / CATALOG
    if history is not None:
        catalog.parent.mkdir(parents=True, mode=0o700)
        (workdir / ".snakemake").chmod(0o700)
        with sqlite3.connect(history) as source, sqlite3.connect(catalog) as target:
            source.backup(target)
        catalog.chmod(0o600)
    command = [
        str(BIN / "snakemake"),
        "--executor",
        "context",
        "--jobs",
        "8",
        "--context-servers",
        "4",
        "--context-tuning",
        "server_group=short:2,long:2",
        "preemption_budget=50",
        *(["survival_placement"] if policy else []),
        "--config",
        f"count={args.jobs}",
        f"reload={args.reload}",
        f"job={args.job}",
        f"claims={args.claims}",
    ]
    injectors = [
        _injector(workdir, "short", args.short_every, args.seed),
        _injector(workdir, "long", args.long_every, args.seed + 1),
    ]
    started = time.time()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    wall = time.time() - started
    for injector in injectors:
        injector.terminate()
        injector.wait()
    kills = {
        group: len((workdir / f"inject-{group}.jsonl").read_text().splitlines())
        if (workdir / f"inject-{group}.jsonl").exists()
        else 0
        for group in ("short", "long")
    }
    with sqlite3.connect(catalog) as db:
        job_lost = db.execute(
            "select coalesce(sum(seconds_lost), 0), coalesce(sum(jobs_lost), 0) "
            "from server_losses where at >= ?",
            (started,),
        ).fetchone()
        load_lost = db.execute(
            "select coalesce(sum(coalesce(p.load_seconds, p.ended_at - p.loading_at)), 0) "
            "from placements p where p.state = 'lost' and p.loading_at >= ?",
            (started,),
        ).fetchone()[0]
        loads = dict(
            db.execute(
                "select s.group_label, count(*) from placements p join servers s "
                "on p.server_id = s.id where p.loading_at >= ? group by s.group_label",
                (started,),
            ).fetchall()
        )
        jobs_by_group = dict(
            db.execute(
                "select s.group_label, count(*) from attempts a join servers s "
                "on a.server_id = s.id where a.outcome = 'ok' and a.dispatched >= ? "
                "group by s.group_label",
                (started,),
            ).fetchall()
        )
    result = {
        "policy": "on" if policy else "off",
        "returncode": done.returncode,
        "wall_s": round(wall, 2),
        "claims_per_s": round(args.jobs * args.claims / wall, 3),
        "kills": kills,
        "jobs_lost": int(job_lost[1]),
        "job_seconds_lost": round(float(job_lost[0]), 2),
        "load_seconds_lost": round(float(load_lost), 2),
        "lost_server_seconds": round(float(job_lost[0]) + float(load_lost), 2),
        "loads_by_group": loads,
        "jobs_by_group": jobs_by_group,
    }
    if done.returncode != 0:
        result["tail"] = done.stdout[-2000:] + done.stderr[-2000:]
    if history is None:
        kept = root / "history.db"
        with sqlite3.connect(catalog) as source, sqlite3.connect(kept) as target:
            source.backup(target)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--reload", type=float, default=3.0)
    parser.add_argument("--job", type=float, default=2.0)
    parser.add_argument("--claims", type=int, default=16)
    parser.add_argument("--short-every", type=float, default=6.0)
    parser.add_argument("--long-every", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-results/survival_run"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="survival-run-"))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    calibration = run(False, args, root, None)
    print("history run:", json.dumps(calibration), flush=True)
    history = root / "history.db"
    results = []
    for policy in (False, True, True, False):
        result = run(policy, args, root, history)
        print(json.dumps(result), flush=True)
        results.append(result)
    by: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for result in results:
        by[result["policy"]].append(result)
    rows = ("claims_per_s", "jobs_lost", "job_seconds_lost", "load_seconds_lost")
    print(f"\n{'':22} {'off':>16} {'on':>16}")
    summary: dict[str, Any] = {"load_average_end": os.getloadavg()}
    for row in (*rows, "lost_server_seconds"):
        off = [r[row] for r in by["off"]]
        on = [r[row] for r in by["on"]]
        summary[row] = {"off": off, "on": on}
        print(f"{row:22} {statistics.median(off):>16.2f} {statistics.median(on):>16.2f}")
    ratio = statistics.median(r["claims_per_s"] for r in by["on"]) / statistics.median(
        r["claims_per_s"] for r in by["off"]
    )
    summary["claims_per_s_on_over_off"] = round(ratio, 3)
    (args.out / "survival_run.json").write_text(
        json.dumps({"history": calibration, "runs": results, "summary": summary}, indent=1)
    )
    shutil.rmtree(root, ignore_errors=True)
    print(f"survival (real run): {100 * (ratio - 1):+.1f}% claims per second")


if __name__ == "__main__":
    main()
