"""SmolLM2 as a tensor-parallel context: a shard per rank, one front for the jobs.

A context whose loader spans ``tensor_parallel`` ranks (issue 27): the runtime starts
one process per device in one torch.distributed group and calls :func:`load_shard`
in each (``rank=`` its place in the gang); each rank reads only its slices of the
converted checkpoint (``tp_llama.py``: its share of the attention heads, key-value
heads and MLP columns; embeddings, norms and the tied LM head replicated). Then
:func:`load_model`, the front, runs in the process that runs the jobs (``gang=`` the
driver of the ranks) and returns a :class:`TensorParallelModel`: the interface of
``smollm2.LoadedModel`` that ``workflows/factcheck/scripts/verify.py`` uses. The front
tokenises (left padding); the ranks get token ids and the keep mask, and return the
answer words' log-probabilities (rank 0's are used).

SmolLM2-135M has 9 attention heads and 3 key-value heads: it splits over 1 or 3
ranks, and any other ``tensor_parallel`` is refused in one line.

The fronts of ``tp_shard``'s other shard loaders are here too (:func:`checkpoint_gang`,
:func:`random_gang`, :func:`probe_gang`: tests and benchmarks call the shards through
the gang itself), since ``tp_shard`` stays torch-only.

The source, the converted-weights cache (made once by
:func:`snakemake_executor_context.modelcache.convert_once`), its cache probe, its
template and the answer ids are ``smollm2.py``'s. Heavy imports (torch,
transformers) happen inside the functions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from snakemake_executor_context import Batcher, batched, loader, modelcache, note_conversion

HERE = Path(__file__).resolve().parent


def _beside_this(name: str) -> ModuleType:
    """``tp_shard`` by its path (it imports the rest of its siblings, by name)."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


tp_shard = _beside_this("tp_shard")
smollm2 = tp_shard.beside("smollm2")
GGUF_PACKAGE: str = smollm2.GGUF_PACKAGE
#: One claim to score: the prompt, and the first token ids of its two answer words.
ScoreItem = tuple[str, int, int]


def checkpoint(source: str, cache_dir: str | None, stack: contextlib.ExitStack) -> str:
    """The checkpoint directory to read, open until ``stack`` closes: the converted
    cache entry of a GGUF source (converted first if missing, once per node), or a
    local directory. A hub id is refused: download it and pass its directory."""
    converted = smollm2.cache_dir_for(source, cache_dir)
    if converted is not None:
        if modelcache.convert_once(converted, lambda into: smollm2._convert(source, into)):
            note_conversion()
        return str(stack.enter_context(modelcache.open_entry(converted)))
    if Path(source).is_dir():
        return source
    raise ValueError(
        f"source={source!r}: tensor parallel loads a GGUF source or a local checkpoint "
        "directory, not a hub id. Fix: download the model and pass its directory."
    )


def _check_ranks(tensor_parallel: int, world_size: int) -> None:
    if tensor_parallel != world_size:
        raise ValueError(
            f"tensor_parallel={tensor_parallel}, but the gang has {world_size} ranks. "
            "Fix: declare the context with as many ranks as tensor_parallel."
        )


def load_shard(
    source: str = GGUF_PACKAGE,
    cache_dir: str | None = None,
    tensor_parallel: int = 1,
    threads: int | None = None,
    *,
    rank: Any,
) -> Any:
    """Shard loader: this rank's ``tp_shard.TPShard`` of SmolLM2 on ``rank.device``
    (fp32 on a CPU, bf16 on a GPU). ValueError (one line) if the model's heads do
    not divide by the world size."""
    import torch

    _check_ranks(tensor_parallel, rank.world_size)
    if threads:
        torch.set_num_threads(threads)
    with contextlib.ExitStack() as stack:
        path = checkpoint(source, cache_dir, stack)
        return tp_shard.shard_from_checkpoint(path, rank, name=source)


@dataclass
class TensorParallelModel:
    """The front of a tensor-parallel SmolLM2: the tokenizer here, the weights in the
    gang's ranks. The interface of ``smollm2.LoadedModel`` used by the factcheck
    workflow: ``tokenizer``, ``device``, :meth:`answer_ids`, :meth:`score`,
    :meth:`score_batched`, :meth:`close`."""

    gang: Any
    tokenizer: Any
    #: The ranks' devices, comma-separated ("cuda:0,cuda:1,cuda:2").
    device: str
    source: str
    load_seconds: float
    #: Serialises the tokenizer (concurrent jobs share it; see smollm2.LoadedModel).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: One batcher per forward batch size (see :meth:`score_batched`).
    batchers: dict[int, Batcher[ScoreItem, float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def tensor_parallel(self) -> int:
        """How many ranks hold the weights."""
        return int(self.gang.world_size)

    def close(self) -> None:
        """Forget the gang (the runtime stops its ranks and their shards)."""
        self.gang = None

    def answer_ids(self, yes: str, no: str, template: str = "?") -> tuple[int, int]:
        """First token ids of the two answer words (``smollm2.answer_token_ids``)."""
        with self.lock:
            return smollm2.answer_token_ids(self.tokenizer, yes, no, template)

    def score(
        self, prompts: list[str], yes_id: int, no_id: int, batch_size: int = 8
    ) -> list[float]:
        """log P(yes) - log P(no) after each prompt: this job's prompts alone, one
        forward pass (on every rank) per micro-batch of ``batch_size``."""
        scores: list[float] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            scores += self.score_items([(prompt, yes_id, no_id) for prompt in chunk])
        return scores

    def score_batched(self, items: list[ScoreItem], forward_batch: int = 8) -> list[float]:
        """The scores of ``(prompt, yes_id, no_id)`` items, in forward passes shared
        with the items of concurrent jobs (``snakemake_executor_context.batched``: the
        batcher's leader calls the gang once per merged pass of up to
        ``forward_batch`` items)."""
        with self.lock:
            batcher = self.batchers.get(forward_batch)
            if batcher is None:
                batcher = batched(self.score_items, max_batch=forward_batch)
                self.batchers[forward_batch] = batcher
        return batcher(items)

    def score_items(self, items: list[ScoreItem]) -> list[float]:
        """log P(yes) - log P(no) of the next token after each prompt, each item with
        its own answer ids, in one forward pass on the gang (left padding)."""
        if not items:
            return []
        if self.gang is None:
            raise RuntimeError(f"{self.source}: this model is closed")
        with self.lock:
            self.tokenizer.padding_side = "left"
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            batch = self.tokenizer([item[0] for item in items], return_tensors="pt", padding=True)
        tokens = sorted({token for item in items for token in item[1:]})
        column = {token: index for index, token in enumerate(tokens)}
        logprobs = self.gang.call(
            "logprobs", batch["input_ids"], batch["attention_mask"].bool(), tokens
        )
        return [
            float(logprobs[row, column[yes]] - logprobs[row, column[no]])
            for row, (_, yes, no) in enumerate(items)
        ]


@loader(cache_probe=smollm2.is_cached, template=smollm2.template, shard=load_shard)
def load_model(
    source: str = GGUF_PACKAGE,
    cache_dir: str | None = None,
    tensor_parallel: int = 1,
    threads: int | None = None,
    *,
    gang: Any,
) -> TensorParallelModel:
    """Front loader: the tokenizer, and the gang whose ranks hold the weights (their
    shards loaded by :func:`load_shard` with the same keyword arguments)."""
    from transformers import AutoTokenizer

    started = time.perf_counter()
    _check_ranks(tensor_parallel, gang.world_size)
    with contextlib.ExitStack() as stack:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint(source, cache_dir, stack))
    devices = ",".join(gang.devices)
    return TensorParallelModel(gang, tokenizer, devices, source, time.perf_counter() - started)


# ------------------------------------------------------------------------------------
# The fronts of tp_shard's other shard loaders (tests and benchmarks): the gang itself.


@loader(shard=tp_shard.load_checkpoint_shard)
def checkpoint_gang(directory: str, threads: int | None = None, *, gang: Any) -> Any:
    """Front loader of :func:`tp_shard.load_checkpoint_shard`: the gang itself."""
    return gang


@loader(shard=tp_shard.load_random_shard)
def random_gang(
    shape: str = "smollm2-135m",
    layers: int | None = None,
    seed: int = 0,
    threads: int | None = None,
    *,
    gang: Any,
) -> Any:
    """Front loader of :func:`tp_shard.load_random_shard`: the gang itself."""
    return gang


@loader(shard=tp_shard.load_probe)
def probe_gang(threads: int | None = None, *, gang: Any) -> Any:
    """Front loader of :func:`tp_shard.load_probe`: the gang itself."""
    return gang
