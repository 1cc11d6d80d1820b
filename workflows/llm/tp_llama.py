"""A tensor-parallel Llama (SmolLM2) in plain torch: one process per rank.

Megatron style, derived from ``workflows/bench/llama_torch.py``: each of the ``k``
ranks holds ``1/k`` of every layer's attention heads (and of its key-value heads) and
``1/k`` of its MLP columns. q, k, v, gate and up are column-parallel (a rank computes
the outputs of its own heads and columns); o and down are row-parallel (a rank
multiplies its part of their input, and one ``all_reduce`` sums the partial outputs):
two all-reduces per layer. The embeddings, the norms and the LM head (tied to the
embeddings) are replicated on every rank: the head runs on one position per prompt,
about 0.3% of a forward's multiply-adds for 80-token prompts on SmolLM2-135M.

The model returns the last position's log-probabilities of left-padded prompts, with
rotary positions that count real tokens only (a padded prompt scores as it does
alone). A rank reads only its slices of a transformers checkpoint's safetensors
files (:func:`checkpoint_reader`). With more than one rank, the default process group
(``torch.distributed.init_process_group``) must exist before the first forward.

Torch only (safetensors for checkpoints): the lent GPU machine may lack the rest.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

#: Reads a checkpoint tensor by its transformers name: whole (dim None), or part
#: ``part`` of ``parts`` equal contiguous parts along dimension ``dim``.
Reader = Callable[[str, "int | None", int, int], torch.Tensor]


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama decoder (the transformers ``LlamaConfig`` fields used)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    name: str = "llama"

    @classmethod
    def from_checkpoint(cls, directory: str | Path, name: str = "llama") -> LlamaConfig:
        """The configuration in a transformers checkpoint's ``config.json``."""
        raw = json.loads((Path(directory) / "config.json").read_text())
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default" or raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ValueError(
                f"{name}: only plain Llama checkpoints load here (rope type {kind!r}, "
                f"attention_bias {raw.get('attention_bias')}, mlp_bias {raw.get('mlp_bias')})."
            )
        heads = raw["num_attention_heads"]
        return cls(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=raw.get("rope_theta", rope.get("rope_theta", 10000.0)),
            tie_word_embeddings=raw.get("tie_word_embeddings", True),
            name=name,
        )


#: SmolLM2-135M(-Instruct): 9 heads, 3 key-value heads, so 1 or 3 ranks.
SMOLLM2_135M = LlamaConfig(576, 30, 9, 3, 64, 1536, 49152, 1e-5, 100000.0, True, "SmolLM2-135M")
#: SmolLM2-1.7B: 32 heads and key-value heads, so 1, 2, 4, 8, 16 or 32 ranks.
SMOLLM2_1_7B = LlamaConfig(2048, 24, 32, 32, 64, 8192, 49152, 1e-5, 130000.0, True, "SmolLM2-1.7B")
#: A small model for tests: 8 heads and 4 key-value heads split over 1, 2 or 4 ranks.
SYNTHETIC = LlamaConfig(64, 3, 8, 4, 8, 128, 512, 1e-5, 10000.0, True, "synthetic")
SHAPES = {"smollm2-135m": SMOLLM2_135M, "smollm2-1.7b": SMOLLM2_1_7B, "synthetic": SYNTHETIC}


def world_sizes(config: LlamaConfig) -> list[int]:
    """The rank counts this model splits over."""
    return [
        k
        for k in range(1, config.num_key_value_heads + 1)
        if config.num_attention_heads % k == 0
        and config.num_key_value_heads % k == 0
        and config.intermediate_size % k == 0
    ]


def check_split(config: LlamaConfig, world_size: int) -> None:
    """Raise ValueError (one line) unless ``world_size`` ranks can split the model."""
    sizes = world_sizes(config)
    if world_size in sizes:
        return
    names = [str(k) for k in sizes]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    raise ValueError(
        f"tensor_parallel={world_size} cannot split {config.name}: its {heads} attention "
        f"heads and {kv} key-value heads (and {config.intermediate_size} MLP columns) must "
        f"divide by the world size; it splits over {listed} ranks."
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class AllReduce:
    """Sums a rank's partial tensor over the group, in place (nothing for one rank);
    while :attr:`timed`, it adds the seconds spent in the collective to :attr:`seconds`
    (synchronising a GPU around it)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.timed = False
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks, in ``x``."""
        if self.world_size == 1:
            return x
        if not self.timed:
            dist.all_reduce(x)
            return x
        _sync(x.device)
        started = time.perf_counter()
        dist.all_reduce(x)
        _sync(x.device)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return x


def rotary_and_mask(
    keep: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rotary cos and sin, and the attention mask, of left-padded prompts (``keep``:
    (batch, length) bool, False = pad): positions count real tokens only, so a padded
    prompt scores as it does alone."""
    n = keep.shape[1]
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0).float()
    angles = positions[..., None] * inv_freq  # (batch, length, dim/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (batch, 1, length, dim)
    causal = torch.ones(n, n, dtype=torch.bool, device=keep.device).tril()
    mask = causal[None] & keep[:, None, :]
    # A pad position attends to itself: no all-masked row (NaN); real ones ignore it.
    mask = (mask | torch.eye(n, dtype=torch.bool, device=keep.device)[None])[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype), mask


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the half-split form Llama uses)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    """One decoder layer's share on one rank: its heads, its MLP columns."""

    def __init__(self, c: LlamaConfig, world_size: int, reduce: AllReduce) -> None:
        super().__init__()
        hidden, dim = c.hidden_size, c.head_dim
        self.heads = c.num_attention_heads // world_size
        self.kv = c.num_key_value_heads // world_size
        self.dim, self.reduce = dim, reduce
        columns = c.intermediate_size // world_size
        self.q = nn.Linear(hidden, self.heads * dim, bias=False)
        self.k = nn.Linear(hidden, self.kv * dim, bias=False)
        self.v = nn.Linear(hidden, self.kv * dim, bias=False)
        self.o = nn.Linear(self.heads * dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, columns, bias=False)
        self.up = nn.Linear(hidden, columns, bias=False)
        self.down = nn.Linear(columns, hidden, bias=False)
        self.norm1 = RMSNorm(hidden, c.rms_norm_eps)
        self.norm2 = RMSNorm(hidden, c.rms_norm_eps)

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
        # A rank's heads and its key-value heads are contiguous blocks of the same
        # groups, so the grouping is the unsplit model's.
        repeat = self.heads // self.kv
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.reduce(self.o(attn.transpose(1, 2).reshape(b, n, self.heads * self.dim)))
        h = self.norm2(x)
        return x + self.reduce(self.down(F.silu(self.gate(h)) * self.up(h)))


class ShardedLlama(nn.Module):
    """One rank's share of a Llama causal LM; returns the last position's
    log-probabilities (every rank computes them: the head is replicated)."""

    inv_freq: torch.Tensor

    def __init__(self, c: LlamaConfig, world_size: int = 1) -> None:
        super().__init__()
        check_split(c, world_size)
        self.config, self.world_size = c, world_size
        self.reduce = AllReduce(world_size)
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            Block(c, world_size, self.reduce) for _ in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = (
            None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        )
        self.register_buffer("inv_freq", torch.empty(c.head_dim // 2), persistent=False)

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """ids: (batch, length), left-padded; keep: (batch, length) bool, False = pad."""
        x = self.embed(ids)
        cos, sin, mask = rotary_and_mask(keep, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        last = self.norm(x[:, -1])
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return torch.log_softmax((last @ head.T).float(), dim=-1)


# ------------------------------------------------------------------------------------
# Weights.

#: Per layer: the transformers name (after ``model.layers.N.``), the local name, and
#: the dimension split across ranks (0: column-parallel, 1: row-parallel, None: whole).
LAYER_WEIGHTS: tuple[tuple[str, str, int | None], ...] = (
    ("self_attn.q_proj.weight", "q.weight", 0),
    ("self_attn.k_proj.weight", "k.weight", 0),
    ("self_attn.v_proj.weight", "v.weight", 0),
    ("self_attn.o_proj.weight", "o.weight", 1),
    ("mlp.gate_proj.weight", "gate.weight", 0),
    ("mlp.up_proj.weight", "up.weight", 0),
    ("mlp.down_proj.weight", "down.weight", 1),
    ("input_layernorm.weight", "norm1.weight", None),
    ("post_attention_layernorm.weight", "norm2.weight", None),
)


def full_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor's transformers name and unsplit shape."""
    hidden, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads
    per_layer = {
        "self_attn.q_proj.weight": (q, hidden),
        "self_attn.k_proj.weight": (kv * c.head_dim, hidden),
        "self_attn.v_proj.weight": (kv * c.head_dim, hidden),
        "self_attn.o_proj.weight": (hidden, q),
        "mlp.gate_proj.weight": (c.intermediate_size, hidden),
        "mlp.up_proj.weight": (c.intermediate_size, hidden),
        "mlp.down_proj.weight": (hidden, c.intermediate_size),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    shapes = {"model.embed_tokens.weight": (c.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, hidden)
    for i in range(c.num_hidden_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in per_layer.items()})
    return shapes


def _part(tensor: torch.Tensor, dim: int | None, part: int, parts: int) -> torch.Tensor:
    if dim is None:
        return tensor
    step = tensor.shape[dim] // parts
    return tensor.narrow(dim, part * step, step)


def tensor_reader(tensors: Mapping[str, torch.Tensor]) -> Reader:
    """A reader of in-memory tensors (by transformers name)."""
    return lambda name, dim, part, parts: _part(tensors[name], dim, part, parts)


def checkpoint_reader(directory: str | Path, stack: ExitStack) -> Reader:
    """A reader of a transformers checkpoint directory's safetensors files (one, or
    several with ``model.safetensors.index.json``) that reads only the slice asked
    for; the files stay open until ``stack`` closes."""
    from safetensors import safe_open

    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    files = json.loads(index.read_text())["weight_map"] if index.exists() else None
    handles: dict[str, Any] = {}

    def read(name: str, dim: int | None, part: int, parts: int) -> torch.Tensor:
        file = files[name] if files is not None else "model.safetensors"
        if file not in handles:
            handles[file] = stack.enter_context(safe_open(str(directory / file), framework="pt"))
        piece = handles[file].get_slice(name)
        if dim is None:
            return piece[:]
        step = piece.get_shape()[dim] // parts
        lo, hi = part * step, (part + 1) * step
        return piece[lo:hi] if dim == 0 else piece[:, lo:hi]

    return read


def random_reader(c: LlamaConfig, seed: int, device: str = "cpu") -> Reader:
    """Seeded random weights (normal, std 0.02; norms 1), made one tensor at a time:
    the same for every rank count, so a split model can be checked against one rank."""
    shapes = full_shapes(c)

    def read(name: str, dim: int | None, part: int, parts: int) -> torch.Tensor:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape, device=device)
        generator = torch.Generator(device=device).manual_seed(seed + zlib.crc32(name.encode()))
        full = torch.randn(shape, generator=generator, device=device) * 0.02
        return _part(full, dim, part, parts)

    return read


def shard_state(
    c: LlamaConfig, rank: int, world_size: int, read: Reader
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s weights under :class:`ShardedLlama`'s names."""
    state = {
        "embed.weight": read("model.embed_tokens.weight", None, 0, 1),
        "norm.weight": read("model.norm.weight", None, 0, 1),
    }
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = read("lm_head.weight", None, 0, 1)
    for i in range(c.num_hidden_layers):
        for name, local, dim in LAYER_WEIGHTS:
            state[f"layers.{i}.{local}"] = read(f"model.layers.{i}.{name}", dim, rank, world_size)
    return state


def build(
    c: LlamaConfig,
    read: Reader,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ShardedLlama:
    """Rank ``rank``'s share of the model, its weights read by ``read``, on ``device``."""
    with torch.device("meta"):
        model = ShardedLlama(c, world_size)  # checks the split before reading anything
    state = {
        key: tensor.to(device=device, dtype=dtype).contiguous()
        for key, tensor in shard_state(c, rank, world_size, read).items()
    }
    model.load_state_dict(state, assign=True, strict=True)
    dim = c.head_dim
    model.inv_freq = 1.0 / (
        c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    )
    return model.requires_grad_(False).eval()
