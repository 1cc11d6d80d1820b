"""Small jobs on a loaded model: the fact-checking workflow with and without slots.

The same 512 claims (one template), scored by the real workflow on the embedded
cluster (2 servers) at ``claims_per_job`` 1, 4, 32 and 256, in two modes:

- ``one``: one job per server at a time, each job scoring its own claims (today's
  default: ``--context-slots 1``, ``batching=false``);
- ``slots``: four jobs per server at once whose claims share forward passes
  (``--context-slots 4``, ``batching=true``, forward batch 8).

Each run is split into start-up (until the first verify job starts), the servers'
scoring time (the union of their jobs' intervals, minus loads) and the rest (the
servers waiting for Snakemake's next job). Repeats are interleaved; medians printed,
with the issue's targets computed from the same run, and written as JSON.

    python workflows/bench/slots.py [--repeats 3] [--sizes 1,4,32,256] [--claims 512]
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
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "workflows/factcheck"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
MODES = {
    "one": ["--context-slots", "1"],
    "slots": ["--context-slots", "4"],
}
BATCHING = {"one": "false", "slots": "true"}


def run(mode: str, claims: int, per_job: int, root: Path, servers: int) -> dict[str, Any]:
    """One run of the workflow in a fresh copy: wall time and its split."""
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{mode}-{per_job}-"))
    shutil.copytree(
        WORKFLOW, workdir / "factcheck", ignore=shutil.ignore_patterns("results", ".snakemake")
    )
    shutil.copytree(REPO / "workflows/llm", workdir / "llm")
    args = [
        SNAKEMAKE, "-s", "Snakefile", "-d", ".", "--workflow-profile", "none",
        "--executor", "context", "--jobs", "16", "--scheduler", "greedy", "--quiet", "rules",
        "--context-servers", str(servers), *MODES[mode],
        "--config", f"n_claims={claims}", f"claims_per_job={per_job}",
        f"generated_pool={max(2000, claims + claims % 2)}", "templates=[qa_yes_no]",
        f"batching={BATCHING[mode]}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    began = time.time()
    done = subprocess.run(args, cwd=workdir / "factcheck", capture_output=True, text=True, env=env)
    wall = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"{mode} {per_job} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (summary_path,) = sorted((workdir / "factcheck/.snakemake/context/runs").glob("*.json"))
    summary = json.loads(summary_path.read_text())
    shutil.rmtree(workdir, ignore_errors=True)
    return split(summary, wall, began)


def split(summary: dict[str, Any], wall: float, began: float) -> dict[str, Any]:
    """Start-up, scoring and the rest, from the run summary's jobs."""
    jobs = [j for j in summary["jobs"] if j.get("items")]
    by_server: dict[str, list[tuple[float, float]]] = {}
    loads: dict[str, float] = {}
    for job in jobs:
        by_server.setdefault(job["address"], []).append((job["started"], job["finished"]))
        loads[job["address"]] = loads.get(job["address"], 0.0) + job["load_seconds"]
    busy = {a: _union(spans) - loads[a] for a, spans in by_server.items()}
    first = min(j["started"] for j in jobs)
    last = max(j["finished"] for j in jobs)
    items = sum(j["items"] for j in jobs)
    histogram = {int(k): v for k, v in summary.get("forward_batches", {}).get("all", {}).items()}
    calls = sum(histogram.values())
    return {
        "wall": wall,
        "startup": first - began,
        "scoring_span": last - first,
        "busy_per_server": statistics.mean(busy.values()),
        "seconds_per_claim": sum(busy.values()) / items,
        "jobs": len(jobs),
        "items": items,
        "load_seconds": statistics.mean(loads.values()),
        "mean_batch": sum(k * v for k, v in histogram.items()) / calls if calls else 0.0,
        "batches": histogram,
    }


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for start, finish in sorted(spans):
        if finish <= end:
            continue
        total += finish - max(start, end)
        end = finish
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1,4,32,256")
    parser.add_argument("--claims", type=int, default=512)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/slots")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-slots-"))
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {m: {s: [] for s in sizes} for m in MODES}
    began = time.perf_counter()
    load_start = os.getloadavg()
    sys.path.insert(0, str(REPO / "workflows/llm"))
    import smollm2

    smollm2.load_model()  # the converted-weights cache, once, outside the timings
    try:
        for repeat in range(args.repeats):
            for size in sizes:
                for mode in MODES:
                    result = run(mode, args.claims, size, root, args.servers)
                    results[mode][size].append(result)
                    print(
                        f"[{time.perf_counter() - began:5.0f} s] repeat {repeat + 1} {mode:5} "
                        f"{size:3} claims/job: {result['wall']:.1f} s, busy "
                        f"{result['busy_per_server']:.1f} s/server, mean batch "
                        f"{result['mean_batch']:.2f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = summarize(results, sizes, args.servers)
    report["load_average"] = {"start": load_start, "end": os.getloadavg()}
    report["repeats"] = args.repeats
    (args.out / "slots.json").write_text(json.dumps({"report": report, "runs": results}, indent=1))
    print_report(report, sizes)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(
    results: dict[str, dict[int, list[dict[str, Any]]]], sizes: list[int], servers: int
) -> dict[str, Any]:
    """Medians per mode and size, and the issue's three targets."""
    table = {
        mode: {
            size: {
                key: _median(runs, key)
                for key in (
                    "wall",
                    "startup",
                    "busy_per_server",
                    "seconds_per_claim",
                    "mean_batch",
                    "jobs",
                )
            }
            for size, runs in by_size.items()
        }
        for mode, by_size in results.items()
    }
    report: dict[str, Any] = {"table": table, "servers": servers}
    one, slots = table["one"], table["slots"]
    if 1 in sizes and 32 in sizes:
        # (b): the batch-1 penalty is the servers' extra scoring time at one claim per
        # job over 32; the drop is what slots and batching take off the wall time.
        penalty = one[1]["busy_per_server"] - one[32]["busy_per_server"]
        drop = one[1]["wall"] - slots[1]["wall"]
        report["target_a"] = {
            "mean_batch_at_1": slots[1]["mean_batch"],
            "per_claim_1_over_32": slots[1]["seconds_per_claim"] / slots[32]["seconds_per_claim"],
        }
        report["target_b"] = {
            "penalty": penalty,
            "drop": drop,
            "fraction": drop / penalty if penalty > 0 else None,
        }
        report["gap"] = {
            # What is left of the small-job gap, in the slots mode: the servers' own
            # extra time, and the rest (waiting for Snakemake's next job, start-up).
            "wall_1_minus_32": slots[1]["wall"] - slots[32]["wall"],
            "servers": slots[1]["busy_per_server"] - slots[32]["busy_per_server"],
        }
    report["target_c"] = {
        size: slots[size]["wall"] / one[size]["wall"] for size in sizes if size >= 32
    }
    return report


def print_report(report: dict[str, Any], sizes: list[int]) -> None:
    """The medians and the targets, as a table."""
    table = report["table"]
    print("\nmode  claims/job  jobs  wall s  start-up s  busy s/server  ms/claim  mean batch")
    for mode in table:
        for size in sizes:
            row = table[mode][size]
            print(
                f"{mode:5} {size:10} {row['jobs']:5.0f} {row['wall']:7.1f} "
                f"{row['startup']:11.1f} {row['busy_per_server']:14.1f} "
                f"{1000 * row['seconds_per_claim']:9.1f} {row['mean_batch']:11.2f}"
            )
    for key in ("target_a", "target_b", "gap", "target_c", "load_average"):
        if key in report:
            print(f"{key}: {report[key]}")


if __name__ == "__main__":
    main()
