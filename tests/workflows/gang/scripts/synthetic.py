"""A forward of the synthetic tensor-parallel Llama through the gang, against the same
model unsplit in this job's own thread (one rank, no process group)."""

import importlib.util
import json

import torch

from snakemake_executor_context import Rank, load_context

gang = load_context(snakemake)
spec = importlib.util.spec_from_file_location("tp_shard", f"{snakemake.config['llm']}/tp_shard.py")
tp_shard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp_shard)
generator = torch.Generator().manual_seed(int(snakemake.wildcards.i))
ids = torch.randint(3, 512, (2, 7), generator=generator)
keep = torch.ones_like(ids, dtype=torch.bool)
split = gang.call("logprobs", ids, keep)
whole = tp_shard.load_random_shard("synthetic", rank=Rank(0, 1, "cpu", "gloo")).logprobs(ids, keep)
where = gang.call("describe")
with open(snakemake.output[0], "w") as out:
    json.dump(
        {
            "max_abs_diff": float((split - whole).abs().max()),
            "world_size": where["world_size"],
            "nodes": gang.nodes,
            "pids": gang.pids,
        },
        out,
    )
