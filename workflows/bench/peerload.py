"""The peer benchmarks' contexts, whose source is a directory read through a rate
limit that all readers on the machine share (a stand-in for a shared filesystem under
load), copied into the server's own cache. Their templates are those cache entries,
so a server without one fetches it from a peer when peer transfer is on.

- :func:`load` (``peers.py``): SmolLM2's converted weights, loaded with transformers;
- :func:`load_files` (``rq3peers.py``): any directory, read back once, the object its
  digest; its cache entry is named per server process (a replacement starts empty).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from snakemake_executor_context import loader, modelcache

_BLOCK = 4 << 20


def template(source: str, rate_mbps: float, limiter: str) -> Path:
    """The server's cache entry of the weights."""
    return modelcache.cache_root() / f"bench-peers-{Path(source).name}"


def _is_cached(**kwargs: Any) -> bool:
    return modelcache.is_cached(template(**kwargs))


def _wait_turn(limiter: str, nbytes: int, rate: float) -> None:
    """Book ``nbytes`` on the shared limit: every reader's blocks queue on one clock
    (the limiter file holds when the limit is free again)."""
    with open(limiter, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read().strip()
        now = time.time()
        start = max(now, float(text) if text else 0.0)
        handle.seek(0)
        handle.truncate()
        handle.write(repr(start + nbytes / rate))
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_UN)
    time.sleep(max(0.0, start + nbytes / rate - now))


def copy_limited(source: Path, into: Path, rate_mbps: float, limiter: str) -> None:
    """Copy the directory ``source`` into ``into`` at the shared limit."""
    for path in sorted(source.rglob("*")):
        target = into / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True)
            continue
        with open(path, "rb") as reader, open(target, "wb") as writer:
            for block in iter(lambda: reader.read(_BLOCK), b""):
                _wait_turn(limiter, len(block), rate_mbps * 1e6)
                writer.write(block)


@loader(cache_probe=_is_cached, template=template)
def load(source: str, rate_mbps: float, limiter: str) -> Any:
    """The model, from the server's cache (filled from the source, or by a peer)."""
    import torch
    from transformers import AutoModelForCausalLM

    entry = template(source, rate_mbps, limiter)
    modelcache.convert_once(
        entry, lambda into: copy_limited(Path(source), into, rate_mbps, limiter)
    )
    with modelcache.open_entry(entry) as path:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {"model": model, "pid": os.getpid()}


def fresh_template(source: str, rate_mbps: float, limiter: str) -> Path:
    """The template of :func:`load_files`: named per server process, so that a server
    restarted under its name (an injector's kill) starts with an empty cache, as a
    replacement on another node would."""
    return modelcache.cache_root() / f"rq3-{Path(source).name}-{os.getpid()}"


def _fresh_is_cached(**kwargs: Any) -> bool:
    return modelcache.is_cached(fresh_template(**kwargs))


@loader(cache_probe=_fresh_is_cached, template=fresh_template)
def load_files(source: str, rate_mbps: float, limiter: str) -> Any:
    """The RQ3 benchmark's context: the source's files (a directory read at the shared
    limit) in this server's cache, each read back once; the object is their digest."""
    import hashlib

    entry = fresh_template(source, rate_mbps, limiter)
    modelcache.convert_once(
        entry, lambda into: copy_limited(Path(source), into, rate_mbps, limiter)
    )
    total = hashlib.sha256()
    with modelcache.open_entry(entry) as path:
        for item in sorted(Path(path).rglob("*")):
            if item.is_file():
                total.update(item.relative_to(path).as_posix().encode())
                total.update(item.read_bytes())
    return {"digest": total.hexdigest(), "pid": os.getpid()}
