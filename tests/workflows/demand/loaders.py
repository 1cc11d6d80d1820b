"""Contexts whose loads take a known time; one of them converts its weights once into
a cache (like the GGUF dequantised into safetensors), then loads from it."""

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
    """Converts for ``seconds`` the first time (any server), then loads in 1 s."""
    if not is_cached(name):
        time.sleep(seconds)
        _marker(name).parent.mkdir(parents=True, exist_ok=True)
        _marker(name).write_text("converted")
        note_conversion()
    time.sleep(1.0)
    declare_size(nbytes)
    return {"name": name, "pid": os.getpid()}
