"""The paper's RQ3 (work done under preemption) with peer-to-peer transfer on and off:
what a kill costs when its replacement warms from a peer instead of the source.

The context has real files (:func:`peerload.load_files`): a directory of
``--megabytes`` MB whose source is read through a limit of ``--rate`` MB/s shared by
all readers (a shared filesystem under load), copied into the server's own cache
(``--context-tuning own_caches=DIR``), read back; its template is that cache entry, named per
server process, so a replacement (the injector restarts a killed server under its
name) starts with an empty cache. Jobs of ``--job`` seconds score ``--claims``
claims each (sleeps). Four runs on the embedded cluster of ``--servers`` servers,
interleaved: peers on (``--context-tuning peer_transfers=2``) and off (``0``), each without
kills and with the injector killing one server (SIGKILL, seeded) every
T = 3 x (reload + job) seconds, the replacement after 1 s; reload is the source's
load measured here first, alone. The first kill comes once the fleet's first loads
(all servers reading the source at once, alike in both modes) are over: T plus
servers x reload after the cluster is up.

Per run: claims/s (claims over the command's wall), and what the kills cost in
server-seconds, from the run's ledger: the work they threw away (the ``lost``
bucket) and the replacements' time until warm (``starting`` and ``loading_*`` of
every server restarted under its name), per kill injected.

    python workflows/bench/rq3peers.py [--jobs 96] [--megabytes 32] [--rate 16] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))

SNAKEFILE = """
from snakemake_executor_context import declare_context

declare_context(
    config, "model", config["loader"],
    source=config["source"], rate_mbps=float(config["rate"]), limiter=config["limiter"],
)

rule all:
    input: expand("out/{i}.txt", i=range(int(config["count"])))

rule score:
    output: "out/{i}.txt"
    params: seconds=float(config["job"]), claims=int(config["claims"])
    resources: context="model", gpu=1
    script: "score.py"
"""
SCRIPT = """
import time
from snakemake_executor_context import load_context, report_items

model = load_context(snakemake)
time.sleep(snakemake.params.seconds)
with open(snakemake.output[0], "w") as out:
    out.write(model["digest"] + "\\n")
report_items(snakemake.params.claims)
"""


def make_source(root: Path, megabytes: int, seed: int) -> Path:
    """A directory of real files: a small config and two weight files."""
    source = root / "source"
    (source / "weights").mkdir(parents=True)
    rng = random.Random(seed)
    (source / "config.json").write_text(json.dumps({"seed": seed}))
    half = megabytes * 1_000_000 // 2
    (source / "weights" / "a.bin").write_bytes(rng.randbytes(half))
    (source / "weights" / "b.bin").write_bytes(rng.randbytes(half))
    return source


def digest(directory: Path) -> str:
    """What the loader returns for these files."""
    total = hashlib.sha256()
    for item in sorted(directory.rglob("*")):
        if item.is_file():
            total.update(item.relative_to(directory).as_posix().encode())
            total.update(item.read_bytes())
    return total.hexdigest()


def reload_seconds(source: Path, rate: float, root: Path) -> float:
    """One load from the source, alone: the copy at the limit, then the read back."""
    from peerload import copy_limited

    into = Path(tempfile.mkdtemp(dir=root, prefix="reload-"))
    started = time.perf_counter()
    copy_limited(source, into, rate, str(root / "limit-reload"))
    digest(into)
    seconds = time.perf_counter() - started
    shutil.rmtree(into)
    return seconds


def lost_seconds(catalog: Path) -> dict[str, float]:
    """Server-seconds of the run by what the kills cost: work thrown away, and the
    replacements' time until warm, by bucket."""
    from snakemake_executor_context.catalog.reading.ledger import read_ledger, window_of
    from snakemake_executor_context.catalog.store import open_reader
    from snakemake_executor_context.fleet.buckets import Bucket

    with open_reader(catalog).session() as session:
        ledger = read_ledger(session, window_of(session))
    out = {"lost": sum(a.seconds().get(Bucket.LOST, 0.0) for a in ledger.servers)}
    for account in ledger.servers:
        if "#" not in account.name:
            continue
        for bucket, seconds in account.seconds().items():
            if bucket.is_loading or bucket is Bucket.STARTING:
                out[bucket.value] = out.get(bucket.value, 0.0) + seconds
    return {name: round(seconds, 2) for name, seconds in out.items()}


def run(peers: bool, kills: bool, args: argparse.Namespace, root: Path, source: Path) -> dict:
    """One run: claims/s, correctness, what the kills cost."""
    name = f"{'peers' if peers else 'source'}-{'kill' if kills else 'calm'}"
    workdir = Path(tempfile.mkdtemp(dir=root, prefix=f"{name}-"))
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "score.py").write_text(SCRIPT)
    command = [
        str(BIN / "snakemake"),
        "--executor",
        "context",
        "--jobs",
        str(2 * args.servers),
        "--context-servers",
        str(args.servers),
        "--context-tuning",
        f"own_caches={workdir / 'caches'}",
        f"peer_transfers={2 if peers else 0}",
        "--retries",
        "0",
        "--config",
        f"loader={HERE / 'peerload.py'}:load_files",
        f"source={source}",
        f"rate={args.rate}",
        f"limiter={workdir / 'limit'}",
        f"count={args.jobs}",
        f"job={args.job}",
        f"claims={args.claims}",
    ]
    injector = None
    if kills:
        injector = subprocess.Popen(
            [
                str(BIN / "snakemake-context"),
                "inject",
                "--scheduler-file",
                str(workdir / ".snakemake/context/cluster"),
                "--every",
                str(args.period),
                "--first-after",
                str(args.first_after),
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
    log = workdir / "inject.jsonl"
    kill_log = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    expected = digest(source)
    outputs = [workdir / f"out/{i}.txt" for i in range(args.jobs)]
    cost = lost_seconds(workdir / ".snakemake/context/catalog.db")
    result: dict[str, Any] = {
        "run": name,
        "returncode": done.returncode,
        "wall": round(wall, 2),
        "claims_per_s": round(args.jobs * args.claims / wall, 3),
        "outputs_ok": all(p.exists() and p.read_text().strip() == expected for p in outputs),
        "kills": len(kill_log),
        "kills_busy": sum(1 for k in kill_log if k["busy"]),
        "seconds": cost,
    }
    if kill_log:
        warming = sum(v for k, v in cost.items() if k != "lost")
        result["lost_work_per_kill"] = round(cost["lost"] / len(kill_log), 2)
        result["warming_per_kill"] = round(warming / len(kill_log), 2)
        result["lost_per_kill"] = round((cost["lost"] + warming) / len(kill_log), 2)
    if done.returncode != 0:
        result["tail"] = done.stdout[-3000:]
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def main() -> None:
    """Measure the reload, run the four runs, print and write the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=96)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--job", type=float, default=2.0)
    parser.add_argument("--claims", type=int, default=16)
    parser.add_argument("--megabytes", type=int, default=32)
    parser.add_argument("--rate", type=float, default=16.0, help="source MB/s, all readers")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-results/rq3peers"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rq3peers-"))
    source = make_source(root, args.megabytes, args.seed)
    reload = reload_seconds(source, args.rate, root)
    args.period = round(3 * (reload + args.job), 1)
    args.first_after = round(args.period + args.servers * reload, 1)
    print(
        f"load average at start: {os.getloadavg()}; reload {reload:.2f} s, "
        f"a kill every {args.period} s",
        flush=True,
    )
    results = {}
    for kills in (False, True):
        for peers in (True, False):
            result = run(peers, kills, args, root, source)
            print(json.dumps(result), flush=True)
            results[result["run"]] = result
    summary: dict[str, Any] = {"load_average_end": os.getloadavg(), "reload_s": reload}
    summary["period_s"] = args.period
    summary["first_kill_s"] = args.first_after
    for mode in ("peers", "source"):
        calm, kill = results[f"{mode}-calm"], results[f"{mode}-kill"]
        summary[mode] = {
            "claims_per_s_calm": calm["claims_per_s"],
            "claims_per_s_kills": kill["claims_per_s"],
            "kept": round(kill["claims_per_s"] / calm["claims_per_s"], 3),
            "kills": kill["kills"],
            "lost_per_kill": kill.get("lost_per_kill"),
            "lost_work_per_kill": kill.get("lost_work_per_kill"),
            "warming_per_kill": kill.get("warming_per_kill"),
        }
    print(json.dumps(summary, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rq3peers.json").write_text(
        json.dumps({"runs": results, "summary": summary}, indent=1)
    )
    if all(r["returncode"] == 0 for r in results.values()):
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
