"""Peer-to-peer transfer: how long until a fleet of servers is warm, with peers and
without, when the source is a shared filesystem under load.

Six servers (``snakemake-context up --servers 6 --own-caches DIR``: each its own
cache, as on six nodes), one of them warm. The context is SmolLM2's converted
weights (:mod:`peerload`), whose source is a directory read through a limit of
``--rate`` MB/s shared by every reader (50 MB/s: a shared filesystem under load; a
setting of this benchmark, not of the plugin). At t0 the five cold servers load it at
once, through the server's own load path (the context cache, which fetches a missing
template from a peer first when ``--peer-transfers`` is on); the time is until the
last is warm. Every server has imported torch and transformers before (a server's
start-up, paid alike in both modes). Also: one peer-to-peer copy of the template
over loopback with TLS, unthrottled, against ``cp -r`` of the same files here.

    python workflows/bench/peers.py [--repeats 3] [--servers 6] [--rate 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "workflows/llm"))


async def acquire(declaration: Any) -> float:
    """Load the context as a job's load would, on this server; the seconds it took."""
    from snakemake_executor_context.server.server import ContextServer

    cache = ContextServer.current().cache
    started = time.perf_counter()
    await asyncio.to_thread(cache.acquire, declaration)
    cache.release(declaration.identity)
    return time.perf_counter() - started


async def _fetch_again(declaration: Any, entry: str, dask_worker: Any = None) -> dict:
    """Remove this server's copy of the template and fetch it from a peer again."""
    from snakemake_executor_context.server.peers.reach import DaskPeers
    from snakemake_executor_context.server.peers.receiver import PeerFetch

    shutil.rmtree(entry)
    fetch = PeerFetch(dask_worker.address, DaskPeers(dask_worker), emit=lambda e: None)
    seconds = await asyncio.to_thread(fetch, declaration)
    return {"seconds": seconds}


async def imports() -> None:
    """What the context's first load on a server would import (torch, transformers):
    a server's start-up cost, paid before t0 in both modes."""

    def load_modules() -> None:
        import torch  # noqa: F401
        import transformers  # noqa: F401

    await asyncio.to_thread(load_modules)


def _source(top: Path) -> Path:
    """SmolLM2's GGUF converted once into plain safetensors: the shared source."""
    import smollm2

    source = top / "smollm2-source"
    source.mkdir()
    smollm2._convert(smollm2.GGUF_PACKAGE, source)
    return source


def warm_all(
    top: Path,
    declaration: Any,
    servers: int,
    peers: bool,
    index: int,
    *,
    env: dict[str, str] | None = None,
    copy: bool = True,
) -> dict:
    """One fleet of ``servers`` with caches of their own (``env``: the environment of
    `up`, which its servers inherit): the first warm, then the others at once; the
    seconds until all are, and (``copy``, the first repeat with peers) one peer copy
    against cp."""
    from distributed import Client

    from snakemake_executor_context.cluster.credentials import Credentials

    where = top / f"{'peers' if peers else 'source'}-{index}"
    where.mkdir()
    path = where / "scheduler.json"
    up = [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(path)]
    up += ["--servers", str(servers), "--own-caches", str(where / "caches")]
    up += ["--peer-transfers", "2" if peers else "0", "--catalog", "off"]
    subprocess.run(up, check=True, capture_output=True, timeout=300, cwd=where, env=env)
    try:
        security = Credentials.beside(path).security()
        with Client(scheduler_file=str(path), security=security, timeout=60) as client:
            client.wait_for_workers(servers, timeout=120)
            names = {i["name"]: a for a, i in client.scheduler_info()["workers"].items()}
            first, *cold = [names[n] for n in sorted(names)]
            client.run(imports)
            warm_seconds = client.run(acquire, declaration, workers=[first])[first]
            started = time.perf_counter()
            loads = client.run(acquire, declaration, workers=cold)
            wall = time.perf_counter() - started
            result = {"wall": wall, "first": warm_seconds, "loads": sorted(loads.values())}
            if copy and peers and index == 0:
                result["copy"] = _copy_rates(client, declaration, where, names)
            return result
    finally:
        down = [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(path)]
        subprocess.run(down, capture_output=True, timeout=120)


def _copy_rates(client: Any, declaration: Any, where: Path, names: dict[str, str]) -> dict:
    """One peer copy of the template (unthrottled, TLS over loopback) against cp -r."""
    name = sorted(names)[-1]
    entry = next((where / "caches" / name).glob("bench-peers-*"))
    nbytes = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
    target = where / "cp-copy"
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(entry), str(target)], check=True)
    cp_seconds = time.perf_counter() - started
    peer = client.run(_fetch_again, declaration, str(entry), workers=[names[name]])
    peer_seconds = peer[names[name]]["seconds"]
    return {
        "bytes": nbytes,
        "cp_seconds": cp_seconds,
        "peer_seconds": peer_seconds,
        "cp_mb_s": nbytes / 1e6 / cp_seconds,
        "peer_mb_s": nbytes / 1e6 / peer_seconds if peer_seconds else None,
    }


def main() -> None:
    """Run both modes ``--repeats`` times, interleaved; print medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--rate", type=float, default=50.0, help="source MB/s, all readers")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    from snakemake_executor_context.contexts import make_declaration

    top = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    source = _source(top)
    nbytes = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    print(f"source: {nbytes / 1e6:.0f} MB at {args.rate:.0f} MB/s shared", flush=True)
    runs: dict[str, list[dict]] = {"peers": [], "source": []}
    for index in range(args.repeats):
        declaration = make_declaration(
            "bench",
            str(REPO / "workflows/bench/peerload.py") + ":load",
            {
                "source": str(source),
                "rate_mbps": args.rate,
                "limiter": str(top / f"limit{index}"),
            },
            REPO,
        )
        for mode in ("peers", "source"):
            result = warm_all(top, declaration, args.servers, mode == "peers", index)
            runs[mode].append(result)
            print(f"{mode} #{index + 1}: all warm in {result['wall']:.1f} s", flush=True)
    shutil.rmtree(top)  # kept when a run fails: the servers' logs are there
    medians = {mode: statistics.median(r["wall"] for r in rs) for mode, rs in runs.items()}
    copy = runs["peers"][0]["copy"]
    summary = {
        "servers": args.servers,
        "rate_mb_s": args.rate,
        "template_bytes": nbytes,
        "median_wall": medians,
        "speedup": medians["source"] / medians["peers"],
        "copy": copy,
        "peer_over_cp": (copy["peer_mb_s"] or 0) / copy["cp_mb_s"],
        "runs": runs,
    }
    print(
        f"time until {args.servers} servers are warm (median of {args.repeats}): "
        f"peers {medians['peers']:.1f} s, source only {medians['source']:.1f} s: "
        f"{summary['speedup']:.2f}x faster with peers"
    )
    print(
        f"one copy of {nbytes / 1e6:.0f} MB: peer over TLS {copy['peer_mb_s']:.0f} MB/s, "
        f"cp {copy['cp_mb_s']:.0f} MB/s: {summary['peer_over_cp']:.2f} of cp"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peers.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
