"""A gang for the dead-rank test: one rank stalls in its first all-reduce.

Loaded by file path in every rank process by the project's gang runtime. The
stalling rank touches ``flag`` (so the test knows the forward has begun and the other
ranks are entering the collective) and sleeps instead of reducing; the test then
kills it, or leaves it hung.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from snakemake_executor_context import loader

LLM = Path(__file__).resolve().parents[2] / "workflows/llm"


def _tp_shard() -> Any:
    module = sys.modules.get("tp_shard")
    if module is None:
        spec = importlib.util.spec_from_file_location("tp_shard", LLM / "tp_shard.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["tp_shard"] = module
        spec.loader.exec_module(module)
    return module


def load_stalling_shard(flag: str, stall_rank: int = 1, *, rank: Any) -> Any:
    """The synthetic model's shard; rank ``stall_rank``'s all-reduces never return."""
    shard = _tp_shard().load_random_shard("synthetic", rank=rank)
    if rank.rank == stall_rank:

        def stall(x: Any) -> Any:
            Path(flag).touch()
            time.sleep(600)
            return x

        for block in shard.model.layers:
            block.reduce = stall
    return shard


@loader(shard=load_stalling_shard)
def stalling_gang(flag: str, stall_rank: int = 1, *, gang: Any) -> Any:
    """Front loader: the gang itself."""
    return gang
