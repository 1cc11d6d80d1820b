"""RQ4's shape on a real batch system: a pool of SLURM pilots that grows while a run
proceeds, and what each pilot cost before it was useful.

Starts ``snakemake-context up --backend slurm`` with 1 pilot kept and up to ``--max``,
lets it settle to one registered pilot, then runs ``--count`` context jobs whose loader
sleeps ``--load`` seconds (so that the growth curve is not CPU-bound on a small
machine) and reports, per pilot: ``sbatch`` to registration, registration to its first
job, registration to its first warm job (target: at most load + 10% + 1 s), the
throughput as pilots join (jobs finished per window against pilots registered), and
the pool's pilot-seconds busy against idle. ``--factcheck`` then runs the
fact-verification workflow's demo on 2 pilots.

Needs a running SLURM (``sudo bash tests/slurm/slurm-up.sh`` starts a single-node one).

    python workflows/bench/pilots.py [--count 300] [--max 6] [--load 5] [--sleep 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
REUSE = REPO / "tests" / "workflows" / "reuse"


def _cli(
    *args: str, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _books(scheduler_file: Path) -> dict:
    out = _cli("status", "--json", "--scheduler-file", str(scheduler_file))
    return (json.loads(out.stdout).get("pool") or {}) if out.returncode == 0 else {}


def _wait(predicate, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout} s")


def pool_run(
    root: Path,
    *,
    count: int,
    maximum: int,
    load: float,
    sleep: float,
    jobs: int,
    workflow: Path,
    config: list[str],
    minimum: int = 1,
) -> dict:
    """One pool, one run; returns per-pilot numbers and the books."""
    scheduler_file = root / "cluster" / "scheduler.json"
    started = _cli(
        "up",
        "--scheduler-file",
        str(scheduler_file),
        "--backend",
        "slurm",
        # Two kinds of 4 fake GPUs each (tests/slurm/slurm-up.sh): room for 8 pilots.
        "--gpu-type",
        "fakea",
        "--gpu-type",
        "fakeb",
        "--min-pilots",
        str(minimum),
        "--max-pilots",
        str(maximum),
        "--pilot-memory",
        "2GB",
        "--walltime",
        "01:00:00",
        "--pilot-idle-timeout",
        "20",
        "--pilot-log-dir",
        str(root / "pilot-logs"),
        # Pilots inherit the environment of `up` (sbatch exports it): the loader's sleep.
        env={"TOY_LOAD_SECONDS": str(load)},
    )
    if started.returncode != 0:
        raise SystemExit(started.stdout + started.stderr)
    try:
        _wait(lambda: _books(scheduler_file).get("account", {}).get("started", 0) >= minimum, 120)
        workdir = root / "wf"
        shutil.copytree(workflow, workdir)
        if (workflow.parent / "llm").is_dir():  # the demo's loader lies beside it
            shutil.copytree(workflow.parent / "llm", root / "llm")
        began = time.time()
        run = subprocess.run(
            [
                str(BIN / "snakemake"),
                "--executor",
                "context",
                "--jobs",
                str(jobs),
                "--context-scheduler-file",
                str(scheduler_file),
                "--context-tuning",
                "wait_for_server=300",
                "--quiet",
                "rules",
                *(["--config", *config] if config else []),
            ],
            cwd=workdir,
            capture_output=True,
            text=True,
            env={**os.environ, "TOY_LOAD_SECONDS": str(load)},
            timeout=3600,
        )
        wall = time.time() - began
        if run.returncode != 0:
            raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:])
        books = _books(scheduler_file)
        summary = json.loads(
            sorted((workdir / ".snakemake" / "context" / "runs").glob("*.json"))[-1].read_text()
        )
    finally:
        _cli("down", "--scheduler-file", str(scheduler_file))
    first_job = min((j["started"] for j in summary["jobs"]), default=began)
    return {
        "wall": wall,
        "books": books,
        "summary": summary,
        "began": began,
        "first_job": first_job,
    }


def per_pilot(result: dict) -> list[dict]:
    """sbatch -> registration -> first job -> first warm job, per pilot."""
    jobs = result["summary"]["jobs"]
    rows = []
    for record in result["books"].get("records", []):
        if record["registered"] is None:
            continue
        mine = sorted(
            (j for j in jobs if j["server"] == record["name"]), key=lambda j: j["started"]
        )
        warm = [j for j in mine if j.get("reused")]
        # A pilot that joined before the run could get jobs only once the run began.
        ready = max(record["registered"], result["first_job"])
        rows.append(
            {
                "pilot": record["name"],
                "sbatch_to_registration": record["registered"] - record["submitted"],
                "registration_to_first_job": (mine[0]["started"] - ready) if mine else None,
                # Warm: the first job's load is done, the context serves jobs from now.
                "registration_to_warm": (
                    (mine[0]["started"] + mine[0]["load_seconds"] - ready) if mine else None
                ),
                "registration_to_first_reused_job": (
                    (warm[0]["started"] - ready) if warm else None
                ),
                "jobs": len(mine),
                "registered_at": record["registered"] - result["began"],
            }
        )
    return rows


def throughput(result: dict, window: float = 10.0) -> list[tuple[float, int, float]]:
    """(window start, pilots registered by then, jobs finished per second in it)."""
    began = result["began"]
    finished = sorted(j["finished"] - began for j in result["summary"]["jobs"] if j["ok"])
    registered = sorted(
        r["registered"] - began for r in result["books"].get("records", []) if r["registered"]
    )
    out = []
    start = 0.0
    while finished and start <= finished[-1]:
        n = sum(1 for f in finished if start <= f < start + window)
        pilots = sum(1 for r in registered if r <= start + window / 2)
        out.append((start, pilots, n / window))
        start += window
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--max", type=int, default=6)
    parser.add_argument("--load", type=float, default=5.0)
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument(
        "--factcheck", action="store_true", help="also the factcheck workflow on 2 pilots"
    )
    parser.add_argument("--only-factcheck", action="store_true", help="only that")
    parser.add_argument(
        "--factcheck-config",
        nargs="+",
        default=["n_claims=128", "templates=[qa_yes_no,claim_true_false]", "claims_per_job=8"],
        help="config of the factcheck run (Snakemake's --config)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        raise SystemExit("no SLURM here: start one with sudo bash tests/slurm/slurm-up.sh")
    report: dict = {}
    if not args.only_factcheck:
        report["rq4"] = rq4(args)
    if args.factcheck or args.only_factcheck:
        report["factcheck"] = factcheck(args)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pilots.json").write_text(json.dumps(report, indent=1))


def rq4(args: argparse.Namespace) -> dict:
    """The growing pool under a sleeping loader."""
    root = Path(tempfile.mkdtemp(prefix="bench-pilots-"))
    result = pool_run(
        root,
        count=args.count,
        maximum=args.max,
        load=args.load,
        sleep=args.sleep,
        jobs=args.jobs,
        workflow=REUSE,
        config=[f"count={args.count}", f"sleep={args.sleep}"],
    )
    rows = per_pilot(result)
    print(
        f"RQ4 shape: {args.count} jobs of {args.sleep} s, loader sleeps {args.load} s, "
        f"pool 1..{args.max} SLURM pilots; wall {result['wall']:.1f} s; load avg "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("pilot          joined  sbatch->reg  reg->1st job  reg->warm  reg->1st reused  jobs")
    for row in rows:
        print(
            f"{row['pilot']:<14} {row['registered_at']:6.1f}  "
            f"{_fmt(row['sbatch_to_registration'])}       "
            f"{_fmt(row['registration_to_first_job'])}     "
            f"{_fmt(row['registration_to_warm'])}        "
            f"{_fmt(row['registration_to_first_reused_job'])}  {row['jobs']:4d}"
        )
    warm = [r["registration_to_warm"] for r in rows if r["registration_to_warm"] is not None]
    target = args.load * 1.1 + 1
    if warm:
        print(
            f"registration -> warm (first job's load done): median "
            f"{statistics.median(warm):.1f} s, "
            f"max {max(warm):.1f} s (target <= load + 10% + 1 s = {target:.1f} s)"
        )
    print("throughput as pilots join (window start s, pilots, jobs/s):")
    for start, pilots, rate in throughput(result):
        print(f"  {start:6.0f}  {pilots}  {rate:5.2f}")
    account = result["books"].get("account", {})
    print(
        f"pilot-seconds {account.get('pilot_seconds')}: busy {account.get('busy_seconds')}, "
        f"idle {account.get('idle_seconds')}; submitted {account.get('submitted')}, "
        f"retired {account.get('retired')}, preempted {account.get('preempted')}"
    )
    return {
        "rows": rows,
        "account": account,
        "wall": result["wall"],
        "throughput": throughput(result),
    }


def factcheck(args: argparse.Namespace) -> dict:
    """The fact-verification workflow (SmolLM2, really loaded) on a pool of 2 pilots."""
    fc_root = Path(tempfile.mkdtemp(prefix="bench-pilots-fc-"))
    fc = pool_run(
        fc_root,
        count=0,
        maximum=2,
        minimum=2,
        load=0,
        sleep=0,
        jobs=4,
        workflow=REPO / "workflows" / "factcheck",
        config=list(args.factcheck_config),
    )
    fc_rows = per_pilot(fc)
    account = fc["books"].get("account", {})
    print(
        f"factcheck ({' '.join(args.factcheck_config)}) on 2 pilots: wall {fc['wall']:.1f} s; "
        f"pilot-seconds {account.get('pilot_seconds')}, busy {account.get('busy_seconds')}; "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    for row in fc_rows:
        print(
            f"  {row['pilot']}: sbatch->reg {_fmt(row['sbatch_to_registration'])} s, "
            f"reg->1st job {_fmt(row['registration_to_first_job'])} s, "
            f"reg->warm {_fmt(row['registration_to_warm'])} s, {row['jobs']} jobs"
        )
    return {"rows": fc_rows, "account": account, "wall": fc["wall"]}


if __name__ == "__main__":
    main()
