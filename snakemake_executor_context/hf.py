"""The built-in loader: any causal language model that ``transformers`` reads, in one
line of the Snakefile::

    declare_context(config, "llm", "snakemake_executor_context.hf:causal_lm",
                    model="/shared/models/my-checkpoint", dtype="bfloat16")

``model`` is staged (:mod:`.modelcache.staging`): copied once into each node's model cache,
from a peer that holds it when that is faster, and the loader reads the local copy.
It is one of

- a local directory: a ``save_pretrained`` checkpoint (safetensors or not, sharded
  with its ``*.index.json`` or not, with the code files a ``trust_remote_code`` model
  needs);
- a GGUF file: converted once per node into plain safetensors in the model cache
  (:func:`.modelcache.convert_once`), then loaded from there;
- a Hugging Face repository id (``org/name``, at ``revision``): its snapshot in the
  local Hugging Face cache; nothing is downloaded.

The loaded object (:class:`CausalLM`) holds ``model``, ``tokenizer`` and ``device``
(where inputs go), and scores next-token answers in forward passes shared by the jobs
running at once (:meth:`CausalLM.score_batched`, through :mod:`.callmerge`).

Runs in a context server's process (or a job's own under another executor). Its
module imports the standard library only: Snakemake's process imports it where the
workflow is declared, to read which argument it stages.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import modelcache
from .callmerge import Batcher, batched
from .contexts import loader, note_conversion
from .errors import ContextLoadError
from .gang import server_devices

__all__ = ["CausalLM", "ScoreItem", "causal_lm", "convert_gguf", "load_kwargs"]

#: One prompt to score: the prompt, and the token ids of its two answers.
ScoreItem = tuple[str, int, int]

_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass
class CausalLM:
    """A loaded causal LM: ``model``, ``tokenizer`` (None when the checkpoint holds
    none), and ``device``, where its inputs go (its first device when it spreads over
    several GPUs)."""

    model: Any
    tokenizer: Any
    device: str
    load_seconds: float
    #: Serialises the tokenizer: a Rust tokenizer whose padding is being set raises
    #: "Already borrowed" in the threads of other jobs.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    batchers: dict[int, Batcher[ScoreItem, float]] = field(default_factory=dict, repr=False)

    def close(self) -> None:
        """Drop the weights (the server calls it when it evicts the context)."""
        self.model = None

    def answer_ids(self, yes: str, no: str) -> tuple[int, int]:
        """The first token id of each answer word (they must differ)."""
        with self.lock:
            yes_ids = self.tokenizer.encode(yes, add_special_tokens=False)
            no_ids = self.tokenizer.encode(no, add_special_tokens=False)
        if not yes_ids or not no_ids or yes_ids[0] == no_ids[0]:
            raise ValueError(
                f"Answer words {yes!r} and {no!r} must start with different tokens "
                f"(got {yes_ids[:1]} and {no_ids[:1]}). Fix: pick other answer words."
            )
        return yes_ids[0], no_ids[0]

    def score(self, items: list[ScoreItem]) -> list[float]:
        """log P(yes) - log P(no) of the next token after each prompt, in one forward
        pass of these items alone (left padding; the last position's logits only)."""
        import torch

        if not items:
            return []
        with self.lock:
            self.tokenizer.padding_side = "left"
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            batch = self.tokenizer([i[0] for i in items], return_tensors="pt", padding=True)
        batch = batch.to(self.device)
        rows = torch.arange(len(items))
        with torch.inference_mode():
            logits = self.model(**batch, use_cache=False).logits[:, -1, :].float()
            logprobs = torch.log_softmax(logits, dim=-1).cpu()
        yes = torch.tensor([i[1] for i in items])
        no = torch.tensor([i[2] for i in items])
        return (logprobs[rows, yes] - logprobs[rows, no]).tolist()

    def score_batched(self, items: list[ScoreItem], forward_batch: int = 8) -> list[float]:
        """:meth:`score`, with the items of the jobs running at once merged into forward
        passes of up to ``forward_batch`` items (see :mod:`.callmerge`)."""
        with self.lock:
            batcher = self.batchers.get(forward_batch)
            if batcher is None:
                batcher = self.batchers[forward_batch] = batched(
                    self.score, max_batch=forward_batch
                )
        return batcher(items)


def load_kwargs(transformers_version: str, dtype: Any) -> dict[str, Any]:
    """The keyword that sets the weights' dtype in this ``transformers``: ``dtype``
    from 4.56, ``torch_dtype`` before."""
    major, minor = (int(part) for part in transformers_version.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


@loader(stage="model")
def causal_lm(
    model: str,
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    device: str = "auto",
    threads: int | None = None,
) -> CausalLM:
    """Load the causal LM ``model`` (its staged local copy: a directory, a GGUF file;
    a repository id was resolved to its cached snapshot at ``revision``) with its
    tokenizer, offline.

    ``dtype``: ``"auto"`` (bfloat16 on a GPU, float32 on the CPU), ``"float32"``,
    ``"float16"`` or ``"bfloat16"``. ``device``: ``"auto"`` places it on the server's
    devices (spread over its GPUs with ``device_map`` when it has several, on its GPU
    when one, on the CPU otherwise), or a torch device. ``trust_remote_code``: run the
    model's own code files (off unless you trust them). ``threads``: torch's CPU
    threads.
    """
    del revision  # the staging resolved it; the local copy holds one revision
    import torch
    import transformers

    started = time.perf_counter()
    if dtype not in _DTYPES:
        raise ContextLoadError(
            f"causal_lm: dtype={dtype!r} is not one of {', '.join(_DTYPES)}. Fix: "
            'declare dtype="bfloat16" (say), or leave it out.'
        )
    if threads:
        torch.set_num_threads(int(threads))
    placement = _placement(device)
    chosen = dtype
    if dtype == "auto":
        chosen = "bfloat16" if placement["device"].startswith("cuda") else "float32"
    options: dict[str, Any] = {
        "trust_remote_code": bool(trust_remote_code),
        "local_files_only": True,
        **load_kwargs(transformers.__version__, getattr(torch, chosen)),
    }
    for key in ("device_map", "max_memory"):
        if key in placement:
            options[key] = placement[key]
    with contextlib.ExitStack() as stack:
        path = model
        if model.endswith(".gguf") and Path(model).is_file():
            entry = _converted_entry(Path(model), transformers.__version__)
            if modelcache.convert_once(entry, lambda into: convert_gguf(Path(model), into)):
                note_conversion()
            path = stack.enter_context(modelcache.open_entry(entry))
        try:
            tokenizer = None
            if any(Path(path).glob("tokenizer*")):  # a checkpoint may come without one
                tokenizer = transformers.AutoTokenizer.from_pretrained(
                    path, trust_remote_code=bool(trust_remote_code), local_files_only=True
                )
            loaded = transformers.AutoModelForCausalLM.from_pretrained(path, **options)
        except (OSError, ValueError) as error:
            raise ContextLoadError(
                f"causal_lm: transformers could not load {os.path.realpath(path)} (the "
                f"node's copy of the model): {type(error).__name__}: "
                f"{error}. Fix: give a directory that from_pretrained reads (config.json and "
                "weights), a GGUF file, or a repository id in the local Hugging Face cache; "
                "a model with its own code needs trust_remote_code=True."
            ) from error
    if "device_map" not in options:
        loaded.to(placement["device"])
    loaded.eval()
    return CausalLM(loaded, tokenizer, placement["device"], time.perf_counter() - started)


def _placement(device: str) -> dict[str, Any]:
    """Where the model goes: a device, and a ``device_map`` over several GPUs."""
    if device != "auto":
        return {"device": device}
    gpus = [d for d in server_devices() if d.startswith("cuda")]
    if not gpus:
        return {"device": "cpu"}
    if len(gpus) == 1:
        return {"device": gpus[0], "device_map": {"": gpus[0]}}
    import torch

    indices = [int(d.partition(":")[2] or 0) for d in gpus]
    memory = {i: torch.cuda.mem_get_info(i)[0] for i in indices}
    return {"device": gpus[0], "device_map": "auto", "max_memory": memory}


def _converted_entry(gguf: Path, transformers_version: str) -> Path:
    digest = modelcache.file_sha256(gguf)
    name = f"gguf-{gguf.stem}-{digest[:16]}-transformers-{transformers_version}"
    return modelcache.cache_root() / name


def convert_gguf(gguf: Path, into: Path) -> None:
    """Dequantise a GGUF file into plain float32 safetensors, with its tokenizer, in the
    directory ``into`` (a model-cache entry's: :func:`.modelcache.convert_once`)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        **load_kwargs(transformers.__version__, torch.float32),
    )
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)
