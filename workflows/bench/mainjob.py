"""The README's main job, once, as a new user runs it: the factcheck workflow with its
default profile (embedded cluster, `--jobs 8`), in a fresh copy of the workflow and
with an empty model cache (so the first load converts the GGUF).

Reports the wall time, the scoring span (first `verify` job's start on a server to the
last job's end), and per server: jobs, busy seconds (job starts to ends, loads
included) and the share of the span it was busy.

    python workflows/bench/mainjob.py [--tree DIR] [--out DIR]

``--tree``: the source tree whose workflow runs (default: this one); run it with that
tree first on ``PYTHONPATH`` (``compare.py --script`` does both), so the plugin is the
tree's too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=HERE)
    parser.add_argument("--out", type=Path, default=None, help="write mainjob.json here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-mainjob-"))
    try:
        for name in ("factcheck", "llm"):
            shutil.copytree(args.tree / "workflows" / name, root / "workflows" / name)
        workdir = root / "workflows" / "factcheck"
        shutil.rmtree(workdir / "results", ignore_errors=True)
        shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
        env = dict(os.environ, SNAKEMAKE_CONTEXT_MODEL_CACHE=str(root / "model-cache"))
        snakemake = str(Path(sys.executable).parent / "snakemake")
        started = time.perf_counter()
        done = subprocess.run(
            [snakemake, "-s", str(workdir / "Snakefile"), "-d", str(workdir)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the main job failed:\n{done.stdout}\n{done.stderr}")
        (path,) = sorted((workdir / ".snakemake/context/runs").glob("*.json"))
        summary = json.loads(path.read_text())
        jobs = summary["jobs"]
        names = [inv["server"]["name"] for inv in summary["servers"].values()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    timed = [j for j in jobs if j.get("started") and j.get("finished")]
    first, last = min(j["started"] for j in timed), max(j["finished"] for j in timed)
    span = last - first
    per_server: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "busy": 0.0})
    for name in names:  # servers that ran nothing count too
        per_server[name]["jobs"] += 0
    for job in timed:
        row = per_server[job["server"]]
        row["jobs"] += 1
        row["busy"] += job["finished"] - job["started"]
    servers = sorted(per_server)
    used = sum(1 for s in servers if per_server[s]["jobs"])
    results: dict[str, float] = {"wall_s": wall, "span_s": span, "servers_used": used}
    results["min_busy_fraction"] = min(per_server[s]["busy"] / span for s in servers)
    for index, name in enumerate(servers):
        results[f"server{index}_jobs"] = per_server[name]["jobs"]
        results[f"server{index}_busy_s"] = per_server[name]["busy"]
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mainjob.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
