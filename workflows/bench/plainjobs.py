"""What a plain job costs: DAGs of N `shell:` echo jobs plus 8 context jobs (a loader
that returns at once), under `--executor local --cores 2` and `--executor context`
(embedded cluster; optionally an attached one), in one run: each mode and size
``--repeats`` times, interleaved; medians.

The per-plain-job cost is the slope of wall time between the two DAG sizes; the fixed
overhead is the time at the smaller size minus that slope times its jobs (for the
context executor: the cluster's start and stop, the context jobs).

    python workflows/bench/plainjobs.py --out /tmp/bench [--sizes 40 200] [--attached]

Writes ``plainjobs.json`` in ``--out`` and prints it.
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
import textwrap
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SNAKEFILE = textwrap.dedent("""
    from snakemake_executor_context import declare_context

    declare_context(config, "quick", "loader.py:load")
    N = int(config["size"])

    rule all:
        input: expand("echo/{i}.txt", i=range(N)), expand("ctx/{j}.txt", j=range(8))

    rule echo:
        output: "echo/{i}.txt"
        shell: "echo {wildcards.i} > {output}"

    rule ctx:
        output: "ctx/{j}.txt"
        resources: context="quick"
        script: "ctx.py"
""")
LOADER = "def load():\n    return 1\n"
SCRIPT = textwrap.dedent("""
    from snakemake_executor_context import load_context

    with open(snakemake.output[0], "w") as f:
        f.write(str(load_context(snakemake)))
""")


def run(n: int, executor_args: list[str], durations: list[float] | None = None) -> float:
    """Wall seconds of one snakemake run of the DAG with ``n`` echo jobs (the echo
    jobs' seconds on their servers appended to ``durations``)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"plainjobs-{n}-"))
    try:
        for name, text in {"Snakefile": SNAKEFILE, "loader.py": LOADER, "ctx.py": SCRIPT}.items():
            (workdir / name).write_text(text)
        started = time.monotonic()
        done = subprocess.run(
            [str(BIN / "snakemake"), *executor_args, "--quiet", "all", "--config", f"size={n}"],
            cwd=workdir,
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"snakemake {executor_args} failed:\n{done.stdout}\n{done.stderr}")
        for summary in (workdir / ".snakemake" / "context" / "runs").glob("*.json"):
            for job in json.loads(summary.read_text())["jobs"]:
                if durations is not None and job["key"].startswith("echo-"):
                    durations.append(job["finished"] - job["started"])
        return took
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def fit(small: int, large: int, times: dict[int, float]) -> tuple[float, float]:
    """Per-job slope and fixed overhead from the two sizes."""
    slope = (times[large] - times[small]) / (large - small)
    return slope, times[small] - slope * small


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs=2, default=[40, 200])
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode and size")
    parser.add_argument("--attached", action="store_true", help="also an attached cluster")
    parser.add_argument(
        "--attached-sizes", type=int, nargs=2, default=[8, 40], help="DAG sizes when attached"
    )
    args = parser.parse_args()
    small, large = args.sizes
    modes = {
        "local": ["--executor", "local", "--cores", "2"],
        "context": ["--executor", "context", "--jobs", "2"],
    }
    results: dict[str, float] = {"loadavg_1min_before": os.getloadavg()[0]}
    walls: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):  # interleaved: load changes hit every mode alike
        for mode, flags in modes.items():
            for n in (small, large):
                walls.setdefault((mode, n), []).append(run(n, flags))
    for mode in modes:
        times = {n: statistics.median(walls[mode, n]) for n in (small, large)}
        slope, fixed = fit(small, large, times)
        results |= {f"{mode}_{n}_s": t for n, t in times.items()}
        results |= {f"{mode}_per_job_s": slope, f"{mode}_fixed_s": fixed}
    results["per_job_ratio_context_to_local"] = results["context_per_job_s"] / max(
        results["local_per_job_s"], 1e-9
    )
    if args.attached:
        results |= attached(*args.attached_sizes)
    results["loadavg_1min_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plainjobs.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


def attached(small: int, large: int) -> dict[str, float]:
    """The same on a cluster started by `snakemake-context up` (2 servers)."""
    directory = Path(tempfile.mkdtemp(prefix="plainjobs-cluster-"))
    scheduler = directory / "scheduler.json"
    up = [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler)]
    subprocess.run([*up, "--servers", "2"], cwd=directory, check=True, capture_output=True)
    try:
        flags = ["--executor", "context", "--jobs", "2", "--context-scheduler-file", str(scheduler)]
        run(small, flags)  # warm: the context loads once per cluster
        durations: list[float] = []
        times = {n: run(n, flags, durations) for n in (small, large)}
        slope, fixed = fit(small, large, times)
        durations.sort()
        return {
            **{f"attached_{n}_s": t for n, t in times.items()},
            "attached_per_job_s": slope,
            "attached_fixed_s": fixed,
            "attached_echo_on_server_p50_s": durations[len(durations) // 2],
            "attached_echo_on_server_p95_s": durations[int(len(durations) * 0.95)],
        }
    finally:
        down = [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(scheduler)]
        subprocess.run(down, capture_output=True)


if __name__ == "__main__":
    main()
