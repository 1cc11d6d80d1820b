"""Contexts whose loads take a known time; one of them converts its weights once into
a cache (like the GGUF dequantised into safetensors), then loads from it: under a lock,
as the model cache converts, so that two servers loading at once convert once."""

import fcntl
import os
import time
from pathlib import Path

from snakemake_executor_context import declare_size, loader, note_conversion


def load(name, nbytes, seconds):
    time.sleep(seconds)
    declare_size(nbytes)
    return {"name": name, "pid": os.getpid()}


def _marker(name):
    return Path(os.environ["DEMAND_CACHE"]) / f"{name}.converted"


def is_cached(name, **_):
    return _marker(name).exists()


@loader(cache_probe=is_cached)
def convert_once(name, nbytes, seconds):
    """Converts for ``seconds`` the first time (any server; another server waits for
    the conversion under the lock, then finds it done), then loads in 1 s. Each load
    and conversion is logged in the cache directory (its start, its pid)."""
    cache = Path(os.environ["DEMAND_CACHE"])
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "loads.log", "a") as log:
        log.write(f"load {time.time()} {os.getpid()}\n")
    with open(cache / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_cached(name):
            time.sleep(seconds)
            _marker(name).write_text("converted")
            with open(cache / "loads.log", "a") as log:
                log.write(f"conversion {time.time()} {os.getpid()}\n")
            note_conversion()
    time.sleep(1.0)
    declare_size(nbytes)
    return {"name": name, "pid": os.getpid()}
