"""Who uses the CPU when jobs are small: Snakemake's process or the servers.

Runs the fact-checking workflow (2 servers, 4 slots, batching on, 256 claims of one
template) at 1 and 32 claims per job, and samples every 0.25 s the CPU time of
Snakemake's process and of everything below it (the embedded cluster, its servers).

    python workflows/bench/cpu_split.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def run(per_job: int, claims: int = 256) -> tuple[float, float, float]:
    """Wall seconds, Snakemake's CPU seconds, and the cluster's and servers'."""
    root = Path(tempfile.mkdtemp(prefix="cpu-split-"))
    shutil.copytree(
        REPO / "workflows/factcheck",
        root / "factcheck",
        ignore=shutil.ignore_patterns("results", ".snakemake"),
    )
    shutil.copytree(REPO / "workflows/llm", root / "llm")
    args = [
        SNAKEMAKE, "-s", "Snakefile", "-d", ".", "--workflow-profile", "none",
        "--executor", "context", "--jobs", "16", "--scheduler", "greedy", "--quiet", "rules",
        "--context-servers", "2", "--context-slots", "4",
        "--config", f"n_claims={claims}", f"claims_per_job={per_job}",
        "templates=[qa_yes_no]", "batching=true",
    ]  # fmt: skip
    began = time.time()
    process = subprocess.Popen(
        args, cwd=root / "factcheck", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    snakemake = psutil.Process(process.pid)
    own, below = 0.0, {}
    while process.poll() is None:
        try:
            times = snakemake.cpu_times()
            own = times.user + times.system
            for child in snakemake.children(recursive=True):
                try:
                    child_times = child.cpu_times()
                except psutil.Error:
                    continue
                below[child.pid] = child_times.user + child_times.system
        except psutil.Error:
            pass
        time.sleep(0.25)
    wall = time.time() - began
    shutil.rmtree(root, ignore_errors=True)
    return wall, own, sum(below.values())


def main() -> None:
    print(f"load average at the start: {os.getloadavg()}")
    for per_job in (1, 32):
        wall, own, below = run(per_job)
        print(
            f"{per_job} claims/job: wall {wall:.1f} s, Snakemake's process {own:.1f} CPU s, "
            f"the cluster and its servers {below:.1f} CPU s"
        )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
