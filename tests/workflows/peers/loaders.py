"""A context with real files: its template is a cache entry of a few files made from a
seed (the "source", which appends a line to ``source_log`` each time it is read and
may be slow), loaded by reading every file back (the loaded object is their digest)."""

import hashlib
import json
import os
import random
import time
from pathlib import Path

from snakemake_executor_context import loader, modelcache, note_conversion


def template(seed=1, megabytes=8, source_log="", source_seconds=0.0):
    return modelcache.cache_root() / f"peers-{seed}-{megabytes}"


def is_cached(**kwargs):
    return modelcache.is_cached(template(**kwargs))


def write_source(into, seed, megabytes):
    rng = random.Random(seed)
    (into / "weights").mkdir()
    (into / "config.json").write_text(json.dumps({"seed": seed}))
    half = megabytes * (1 << 20) // 2
    (into / "weights" / "a.bin").write_bytes(rng.randbytes(half))
    (into / "weights" / "b.bin").write_bytes(rng.randbytes(half + 12345))


def digest(directory):
    total = hashlib.sha256()
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            total.update(str(path.relative_to(directory)).encode())
            total.update(path.read_bytes())
    return total.hexdigest()


@loader(cache_probe=is_cached, template=template)
def load(seed=1, megabytes=8, source_log="", source_seconds=0.0):
    entry = template(seed, megabytes)

    def convert(into):
        if source_log:
            with open(source_log, "a") as log:
                log.write(f"{os.getpid()}\n")
        time.sleep(source_seconds)
        write_source(into, seed, megabytes)

    if modelcache.convert_once(entry, convert):
        note_conversion()
    with modelcache.open_entry(entry) as path:
        return {"digest": digest(path), "cache": str(entry)}
