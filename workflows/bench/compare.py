"""Run one benchmark of this directory on two source trees, interleaved, and compare.

Each repeat runs the benchmark once on the old tree, then once on the new one (the
order alternates between repeats), with that tree first on ``PYTHONPATH`` so that the
plugin, its servers and Snakemake's plugin discovery all use that tree's code. Prints
the median of every numeric result per tree and the ratio new/old.

    python workflows/bench/compare.py --old ../parent --new . core -- --jobs 200
    python workflows/bench/compare.py --old ../parent --new . catalog -- --jobs 20000
    python workflows/bench/compare.py --old ../parent --new . \
        --script workflows/bench/mainjob.py mainjob

Both trees must run in the same Python environment (this one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(
    tree: Path, bench: str, extra: list[str], script: Path | None = None
) -> dict[str, float]:
    """The benchmark's JSON results from one run on ``tree`` (``script``: one script
    for both trees, told which tree with ``--tree``)."""
    out = Path(tempfile.mkdtemp(prefix=f"compare-{bench}-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "monitor")])
    if script is not None:
        extra = ["--tree", str(tree), *extra]
    else:
        script = tree / "workflows" / "bench" / f"{bench}.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out), *extra],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{bench} on {tree} failed:\n{done.stdout}\n{done.stderr}")
    results = json.loads((out / f"{bench}.json").read_text())
    return {k: float(v) for k, v in results.items() if isinstance(v, (int, float))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the parent tree")
    parser.add_argument("--new", type=Path, required=True, help="the changed tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--script", type=Path, default=None, help="run this script on both trees (--tree)"
    )
    parser.add_argument("bench", help="a benchmark of workflows/bench writing <bench>.json")
    parser.add_argument("extra", nargs="*", help="arguments for the benchmark (after --)")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for repeat in range(args.repeats):
        order = ("old", "new") if repeat % 2 == 0 else ("new", "old")
        for name in order:
            print(f"[{repeat + 1}/{args.repeats}] {args.bench} on {name} ...", flush=True)
            script = args.script.resolve() if args.script else None
            runs[name].append(run_once(trees[name], args.bench, args.extra, script))
    keys = [k for k in runs["old"][0] if all(k in r for r in runs["old"] + runs["new"])]
    print(f"\n{args.bench}: medians of {args.repeats} interleaved runs")
    print(f"{'measure':<34}{'old':>14}{'new':>14}{'new/old':>10}")
    summary = {}
    for key in keys:
        old = statistics.median(r[key] for r in runs["old"])
        new = statistics.median(r[key] for r in runs["new"])
        ratio = new / old if old else float("nan")
        summary[key] = {"old": old, "new": new, "ratio": ratio}
        print(f"{key:<34}{old:>14.4g}{new:>14.4g}{ratio:>10.3f}")
    print(json.dumps({"bench": args.bench, "runs": runs, "medians": summary}))


if __name__ == "__main__":
    main()
