"""One rank's shard of a tensor-parallel Llama: what a gang's shard loader returns.

A shard loader is called in every rank process once the default process group
exists, as ``load(**kwargs, rank=rank)`` (``rank`` has ``rank``, ``world_size``,
``device``, ``backend`` and ``local_rank``). The gang then calls a method of every
rank's shard at once, with the same arguments, and keeps rank 0's answer; a method
that runs a collective therefore runs it on every rank in the same order.

- :func:`load_checkpoint_shard`: a transformers Llama checkpoint directory;
- :func:`load_random_shard`: seeded random weights of a named shape (benchmarks);
- :func:`load_probe`: no model, a group's all-reduce latency (benchmarks).

Their front loaders are in ``smollm2_tp.py`` (this module stays torch-only: the GPU
check script runs it where this project is not installed).

fp32 on a CPU, bf16 on a GPU. Torch only (safetensors for checkpoints).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent


def beside(name: str) -> ModuleType:
    """A module beside this file, imported by its path under its own name: a file
    loader's directory is not on ``sys.path`` (a server, a rank process), and these
    modules import each other by name."""
    path = HERE / f"{name}.py"
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == path:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tp_llama = beside("tp_llama")
SHAPES = tp_llama.SHAPES
LlamaConfig = tp_llama.LlamaConfig
ShardedLlama = tp_llama.ShardedLlama
build = tp_llama.build
checkpoint_reader = tp_llama.checkpoint_reader
random_reader = tp_llama.random_reader


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TPShard:
    """One rank's share of a tensor-parallel Llama, and what the gang calls on it."""

    def __init__(self, model: ShardedLlama, rank: int, device: str) -> None:
        self.model: ShardedLlama | None = model
        self.config: LlamaConfig = model.config
        self.rank, self.world_size, self.device = rank, model.world_size, device
        self.timed = False
        #: Per timed forward: its seconds, and the seconds inside its all-reduces.
        self.forward_seconds: list[float] = []
        self.all_reduce_seconds: list[float] = []

    def _model(self) -> ShardedLlama:
        if self.model is None:
            raise RuntimeError(f"rank {self.rank}: this shard is closed")
        return self.model

    def logprobs(self, ids: Any, keep: Any, tokens: list[int] | None = None) -> torch.Tensor:
        """The last position's log-probabilities (fp32, on the CPU) after each
        left-padded prompt: ``ids`` (batch, length) token ids, ``keep`` (batch, length)
        True for real tokens. ``tokens``: only these columns (batch, len(tokens)),
        else the whole vocabulary. One forward pass: two all-reduces per layer."""
        model = self._model()
        reduce = model.reduce
        before = reduce.seconds
        started = time.perf_counter()
        with torch.inference_mode():
            ids = torch.as_tensor(ids, dtype=torch.long).to(self.device)
            keep = torch.as_tensor(keep, dtype=torch.bool).to(self.device)
            out = model(ids, keep)
            if tokens is not None:
                out = out[:, torch.as_tensor(tokens, dtype=torch.long, device=out.device)]
            out = out.cpu()
        if self.timed:
            self.forward_seconds.append(time.perf_counter() - started)
            self.all_reduce_seconds.append(reduce.seconds - before)
        return out

    def timing(self, on: bool = True, all_reduces: bool = True) -> None:
        """Start (or stop) timing forwards and, with ``all_reduces``, the all-reduces
        inside them (a GPU is then synchronised around each); clears the records."""
        self.timed = on
        self._model().reduce.timed = on and all_reduces
        self.forward_seconds, self.all_reduce_seconds = [], []

    def stats(self) -> list[dict[str, Any]]:
        """Every rank's timed forwards since :meth:`timing`: seconds per forward and
        seconds in all-reduces per forward, rank by rank (a collective)."""
        mine = {
            "rank": self.rank,
            "forward_seconds": self.forward_seconds,
            "all_reduce_seconds": self.all_reduce_seconds,
        }
        if self.world_size == 1:
            return [mine]
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, mine)
        return every

    def describe(self) -> dict[str, Any]:
        """This rank's place and what it holds: parameters in all, and in its layers."""
        model = self._model()
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "device": self.device,
            "dtype": str(model.embed.weight.dtype),
            "parameters": sum(p.numel() for p in model.parameters()),
            "layer_parameters": sum(p.numel() for p in model.layers.parameters()),
        }

    def all_reduce_latency(
        self, sizes: list[int], repeats: int, warmup: int = 3
    ) -> dict[int, list[float]]:
        """See :func:`all_reduce_latency` (in this shard's dtype, on its device)."""
        return all_reduce_latency(sizes, repeats, self.device, _dtype(self.device), warmup)

    def close(self) -> None:
        """Drop the weights."""
        self.model = None


class CollectiveProbe:
    """A shard with no model: it measures its group's all-reduce."""

    def __init__(self, device: str) -> None:
        self.device = device

    def all_reduce_latency(
        self, sizes: list[int], repeats: int, warmup: int = 3
    ) -> dict[int, list[float]]:
        """See :func:`all_reduce_latency` (fp32 on a CPU, bf16 on a GPU)."""
        return all_reduce_latency(sizes, repeats, self.device, _dtype(self.device), warmup)


def load_probe(threads: int | None = None, *, rank: Any) -> CollectiveProbe:
    """Shard loader: a :class:`CollectiveProbe` on ``rank.device``."""
    if threads:
        torch.set_num_threads(threads)
    return CollectiveProbe(rank.device)


def all_reduce_latency(
    sizes: list[int], repeats: int, device: str, dtype: torch.dtype, warmup: int = 3
) -> dict[int, list[float]]:
    """Seconds of one ``all_reduce`` of each message size (bytes) over the default
    group, ``repeats`` times each after ``warmup``, as this rank saw them (a barrier
    before each, a GPU synchronised around it)."""
    element = torch.tensor([], dtype=dtype).element_size()
    where = torch.device(device)
    out: dict[int, list[float]] = {}
    for size in sizes:
        x = torch.zeros(max(1, size // element), dtype=dtype, device=where)
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            _sync(where)
            started = time.perf_counter()
            dist.all_reduce(x)
            _sync(where)
            if i >= warmup:
                times.append(time.perf_counter() - started)
        out[size] = times
    return out


def _dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def shard_from_checkpoint(directory: str | Path, rank: Any, name: str = "llama") -> TPShard:
    """Rank ``rank``'s shard of the checkpoint in ``directory`` (its slices only);
    ValueError (one line) if its heads do not split over ``rank.world_size``."""
    config = LlamaConfig.from_checkpoint(directory, name)
    with ExitStack() as stack:
        model = build(
            config,
            checkpoint_reader(directory, stack),
            rank=rank.rank,
            world_size=rank.world_size,
            device=rank.device,
            dtype=_dtype(rank.device),
        )
    return TPShard(model, rank.rank, rank.device)


def load_checkpoint_shard(directory: str, threads: int | None = None, *, rank: Any) -> TPShard:
    """Shard loader: a transformers Llama checkpoint directory."""
    if threads:
        torch.set_num_threads(threads)
    return shard_from_checkpoint(directory, rank, name=Path(directory).name)


def load_random_shard(
    shape: str = "smollm2-135m",
    layers: int | None = None,
    seed: int = 0,
    threads: int | None = None,
    *,
    rank: Any,
) -> TPShard:
    """Shard loader: seeded random weights of a shape in :data:`tp_llama.SHAPES`
    (``layers`` of its decoder layers), the same for every rank count."""
    if threads:
        torch.set_num_threads(threads)
    config = SHAPES[shape]
    if layers is not None:
        config = dataclasses.replace(config, num_hidden_layers=layers)
    model = build(
        config,
        random_reader(config, seed, rank.device),
        rank=rank.rank,
        world_size=rank.world_size,
        device=rank.device,
        dtype=_dtype(rank.device),
    )
    return TPShard(model, rank.rank, rank.device)
