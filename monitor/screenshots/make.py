"""Screenshots of the monitor's views from a real factcheck run that lost a server.

Runs the fact-verification workflow (a small config, 3 context servers on the embedded
cluster), kills one server process with SIGKILL once it has run a few jobs, lets the run
finish (the lost jobs rerun elsewhere), then opens the run's catalog in the monitor and
saves an SVG of each view into docs/images/, where the docs site shows them.

    python monitor/screenshots/make.py
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / "docs/images"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
VIEWS = [
    ("fleet", "f"),
    ("contexts", "c"),
    ("losses", "l"),
    ("throughput", "t"),
    ("ledger", "g"),
    ("progress", "p"),
]


def run_and_kill(workdir: Path) -> Path:
    """The factcheck run; one server killed mid-run. Returns the run's catalog."""
    args = [
        SNAKEMAKE,
        "-s",
        "Snakefile",
        "-d",
        ".",
        "--workflow-profile",
        "none",
        "--executor",
        "context",
        "--jobs",
        "6",
        "--context-servers",
        "3",
        "--quiet",
        "rules",
        "--config",
        "n_claims=96",
        "claims_per_job=8",
        "templates=[qa_yes_no,two_shot_yes_no,claim_true_false]",
    ]
    process = subprocess.Popen(args, cwd=workdir)
    killed = None
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if killed is None and len(list((workdir / "results/scores").rglob("*.json"))) >= 6:
            killed = _kill_a_busy_server(workdir)
            print(f"killed server process {killed}", flush=True)
    if process.wait() != 0:
        raise SystemExit("the factcheck run failed")
    if killed is None:
        raise SystemExit("the run ended before a server could be killed")
    return workdir / ".snakemake/context/catalog.db"


def _kill_a_busy_server(workdir: Path) -> int:
    info = next((workdir / ".snakemake/context/cluster").glob("*.pid"))
    cluster = psutil.Process(json.loads(info.read_text())["pid"])
    servers = [p for p in cluster.children() if "multiprocessing" in " ".join(p.cmdline())]
    busiest = max(servers, key=lambda p: p.cpu_percent(interval=0.3))
    os.kill(busiest.pid, signal.SIGKILL)
    return busiest.pid


async def shoot(catalog: Path, out: Path) -> None:
    """Save each view at 100x30."""
    from snakemake_context_monitor import CatalogSource, MonitorApp

    for name, key in VIEWS:
        app = MonitorApp(CatalogSource(catalog), live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await pilot.press(key, "w", "w")  # 15 min -> 1 h -> all: rates over the whole run
            await pilot.pause()
            app.save_screenshot(str(out / f"{name}.svg"))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="monitor-shots-"))
    shutil.copytree(
        REPO / "workflows/factcheck",
        root / "factcheck",
        ignore=shutil.ignore_patterns("results", ".snakemake"),
    )
    shutil.copytree(REPO / "workflows/llm", root / "llm")
    catalog = run_and_kill(root / "factcheck")
    asyncio.run(shoot(catalog, OUT))
    print(f"screenshots in {OUT}")


if __name__ == "__main__":
    main()
